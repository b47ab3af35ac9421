"""A request's answer through the seam when it goes wrong: a non-2xx status raises its typed error, a reset
and a malformed answer the errors the retry policy knows, and an answer left unread is given back (its
connection closed, not kept open) whatever ends the exchange."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hostile_server import one_answer_server
from torchdata_gcs import ClientConfig
from torchdata_gcs._transport.loop import run
from torchdata_gcs._transport.retry import is_retryable
from torchdata_gcs._transport.session import Session, session_for
from torchdata_gcs.errors import NotFoundError, TransientError
from torchdata_gcs.testing import Emulator, Fault, GCSFront

REPEATS = 12


def _get(session: Session, bucket: str, name: str) -> bytes:
    async def read() -> bytes:
        url = f"gs://{bucket}/{name}"
        async with session.read_media(url, session.media_path(bucket, name), {"alt": "media"}) as response:
            return await response.read()

    return run(read(), timeout=30)


@pytest.mark.parametrize(
    ("kind", "error", "status"),
    [("http_404", NotFoundError, 404), ("http_429", TransientError, 429), ("http_503", TransientError, 503)],
)
def test_a_status_raises_its_typed_error_and_keeps_one_connection(
    gcs_emulator: Emulator, gcs_bucket: str, kind: str, error: type[Exception], status: int
) -> None:
    gcs_emulator.seed(gcs_bucket, {"o.bin": b"x" * 1000})
    with GCSFront(
        gcs_emulator.endpoint, faults=[Fault(kind, match="get", retry_after=2.0 if status != 404 else None)]
    ) as front:
        session = session_for(ClientConfig(endpoint=front.endpoint))
        for _ in range(REPEATS):
            with pytest.raises(error) as raised:
                _get(session, gcs_bucket, "o.bin")
            assert raised.value.status == status  # type: ignore[attr-defined]
            assert f"gs://{gcs_bucket}/o.bin" in str(raised.value)
        if status != 404:
            assert raised.value.retry_after == 2.0  # type: ignore[attr-defined]
        assert front.faults_injected[kind] == REPEATS
        assert front.peak_connections <= 2  # each error answer given back: its connection reused
        front.set_faults([])
        assert _get(session, gcs_bucket, "o.bin") == b"x" * 1000


def test_a_missing_object_raises_not_found_from_the_emulator_itself(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    session = session_for(gcs_emulator.client_config)
    with pytest.raises(NotFoundError) as raised:
        _get(session, gcs_bucket, "absent.bin")
    assert raised.value.status == 404


def test_a_reset_raises_a_network_error_that_is_retried(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"o.bin": b"y" * 1000})
    with GCSFront(gcs_emulator.endpoint) as front:
        session = session_for(ClientConfig(endpoint=front.endpoint))
        assert _get(session, gcs_bucket, "o.bin") == b"y" * 1000  # the endpoint has answered: resets are blips
        front.set_faults([Fault("reset", match="get")])
        with pytest.raises(Exception) as raised:  # noqa: PT011 - the transport's own network error
            _get(session, gcs_bucket, "o.bin")
        assert is_retryable(raised.value)
        assert not isinstance(raised.value, NotFoundError)


def test_an_answer_abandoned_by_an_error_is_given_back(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """The caller fails after the first bytes of each of many answers: every one is released (its connection
    closed, the rest of the body unread), so the front never sees them all open at once."""
    gcs_emulator.seed(gcs_bucket, {"big.bin": bytes(range(256)) * 4096})
    with GCSFront(gcs_emulator.endpoint) as front:
        session = session_for(ClientConfig(endpoint=front.endpoint))
        url = f"gs://{gcs_bucket}/big.bin"

        async def abandon() -> None:
            async with session.read_media(url, session.media_path(gcs_bucket, "big.bin"), {"alt": "media"}) as response:
                assert await response.readinto(memoryview(bytearray(10))) > 0
                raise KeyError("the caller's own failure")

        for _ in range(REPEATS):
            with pytest.raises(KeyError, match="the caller's own failure"):
                run(abandon(), timeout=30)
        assert front.peak_connections <= 3


@pytest.fixture
def malformed_endpoint() -> Iterator[str]:
    """A server that answers every request with a status line no HTTP parser accepts."""
    with one_answer_server(b"HTTP/1.1 2x0 What\r\nContent-Length: 0\r\n\r\n", then_close=True) as endpoint:
        yield endpoint


def test_a_malformed_answer_raises_a_transient_error_naming_the_object(malformed_endpoint: str) -> None:
    session = session_for(ClientConfig(endpoint=malformed_endpoint))
    with pytest.raises(TransientError) as raised:
        _get(session, "bucket", "o.bin")
    assert "gs://bucket/o.bin" in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
