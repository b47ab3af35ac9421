"""An endpoint that cannot be reached or trusted: a certificate that fails verification is never retried,
a refused connection or an unknown host fails within seconds in one line while the endpoint has never
answered, and stays a transient fault, retried, once it has."""

from __future__ import annotations

import socket
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.tls_relay import Relay, make_authority
from tests.token_server import TokenServer, private_key_pem
from torchdata_gcs import ClientConfig, EndpointError, GCSFileLoaderIterDataPipe, RetryConfig
from torchdata_gcs.testing import Emulator
from torchdata_gcs.testing._process import free_port

PATIENT = RetryConfig(max_attempts=30, deadline=60, initial_delay=0.2, max_delay=1.0)


def printed(error: BaseException) -> list[str]:
    """The lines Python prints for ``error`` when nothing catches it."""
    return "".join(traceback.format_exception(error)).splitlines()


def message_of(error: BaseException) -> str:
    """The error's own message: one line (torch may add one naming the DataPipe that raised it)."""
    lines = str(error).splitlines()
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("This exception is thrown by __iter__")), lines
    return lines[0]


def assert_one_short_error(error: BaseException) -> None:
    """A traceback with no chain of the network library's exceptions."""
    lines = printed(error)
    assert not any("During handling" in line or "direct cause" in line for line in lines), "\n".join(lines)
    assert not any("aiohttp" in line or "OSError" in line for line in lines if not line.startswith(" ")), lines


@pytest.fixture
def authority(tmp_path: Path):
    return make_authority(tmp_path)


@pytest.fixture
def tls_relay(gcs_emulator: Emulator, authority) -> Iterator[Relay]:
    with Relay(gcs_emulator.endpoint, tls=authority[1]) as relay:
        yield relay


def test_a_certificate_that_fails_verification_fails_at_once(
    tls_relay: Relay, gcs_bucket: str, gcs_emulator: Emulator
) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"1"})
    pipe = GCSFileLoaderIterDataPipe(
        [f"gs://{gcs_bucket}/a"], client=ClientConfig(endpoint=tls_relay.endpoint, anonymous=True)
    )
    started = time.monotonic()
    with pytest.raises(EndpointError) as info:
        list(pipe)
    assert time.monotonic() - started < 2
    assert pipe.stats.retries == 0 and tls_relay.connections == 1
    message = message_of(info.value)
    assert tls_relay.endpoint in message and "certificate" in message
    assert "SSL_CERT_FILE" in message and "REQUESTS_CA_BUNDLE" in message and "proxy" in message
    assert isinstance(info.value, ConnectionError)
    assert_one_short_error(info.value)


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"])
def test_the_named_bundle_makes_the_certificate_trusted(
    variable: str, tls_relay: Relay, authority, gcs_bucket: str, gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint holds: the CA put in either bundle the message names is trusted."""
    for other in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, str(authority[0]))
    gcs_emulator.seed(gcs_bucket, {"a": b"1"})
    client = ClientConfig(endpoint=tls_relay.endpoint, anonymous=True)
    assert [stream.read() for _, stream in GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/a"], client=client)] == [b"1"]


def test_a_token_endpoint_whose_certificate_fails_is_named_at_once(
    tmp_path: Path, token_server: TokenServer, authority, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    with Relay(token_server.uri, tls=authority[1]) as relay:
        token_server.uri = f"{relay.endpoint}/token"
        key_file = token_server.write_key_file(tmp_path / "key.json", private_key_pem())
        client = ClientConfig(endpoint=gcs_emulator.endpoint, anonymous=False, credentials_file=key_file)
        started = time.monotonic()
        with pytest.raises(EndpointError) as info:
            list(IterableWrapper([f"gs://{gcs_bucket}/"]).list_files_by_gcs(client=client))
        assert time.monotonic() - started < 2 and relay.connections == 1
    message = message_of(info.value)
    assert relay.endpoint in message and "certificate" in message and "REQUESTS_CA_BUNDLE" in message
    assert_one_short_error(info.value)


def test_a_refused_connection_fails_within_seconds_in_one_line() -> None:
    # A port held (bound, not listening: every connection refused) on an address no server of the suite uses:
    # a free port of 127.0.0.1 may be one an earlier test's server answered on, which is then tried as an
    # endpoint that went away for a moment, not one that never answered.
    with socket.socket() as held:
        held.bind(("127.0.0.3", 0))
        endpoint = f"http://127.0.0.3:{held.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(EndpointError) as info:
            list(IterableWrapper(["gs://some-bucket/"]).list_files_by_gcs(client=ClientConfig(endpoint=endpoint)))
    assert time.monotonic() - started < 5
    message = message_of(info.value)
    assert endpoint in message and "connection refused" in message
    assert "ClientConfig(endpoint=" in message and "STORAGE_EMULATOR_HOST" in message
    assert_one_short_error(info.value)
    lines = printed(info.value)  # 105 lines in three chained tracebacks before: one now, of the library's calls
    assert sum(line.startswith("Traceback") for line in lines) == 1 and len(lines) < 60


def test_an_unknown_host_fails_within_seconds_in_one_line() -> None:
    endpoint = "http://no-such-host.invalid:8080"
    started = time.monotonic()
    with pytest.raises(EndpointError) as info:
        list(GCSFileLoaderIterDataPipe(["gs://some-bucket/a"], client=ClientConfig(endpoint=endpoint)))
    assert time.monotonic() - started < 5
    message = message_of(info.value)
    assert "no-such-host.invalid" in message and "does not resolve" in message and "STORAGE_EMULATOR_HOST" in message
    assert_one_short_error(info.value)


def test_an_endpoint_still_starting_is_waited_for(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """A server that comes up a moment after the first request (a blip at start) is reached."""
    gcs_emulator.seed(gcs_bucket, {"a": b"1"})
    relay = Relay(gcs_emulator.endpoint, port=free_port())
    pipe = GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/a"], client=ClientConfig(endpoint=relay.endpoint))
    late = threading.Timer(0.6, relay.start)
    late.start()
    try:
        assert [stream.read() for _, stream in pipe] == [b"1"]
        assert pipe.stats.retries >= 1
    finally:
        late.join()
        relay.close()


def test_once_the_endpoint_has_answered_a_refused_connection_is_retried(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """A blip in the middle of a job, longer than the start's short allowance, is retried under
    ``RetryConfig`` as any transient fault."""
    gcs_emulator.seed(gcs_bucket, {"a": b"1", "b": b"2"})
    with Relay(gcs_emulator.endpoint) as relay:
        client = ClientConfig(endpoint=relay.endpoint)
        first = GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/a"], client=client, retry=PATIENT)
        assert [stream.read() for _, stream in first] == [b"1"]
        relay.stop()
        back = threading.Timer(3.5, relay.start)
        back.start()
        try:
            second = GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/b"], client=client, retry=PATIENT)
            assert [stream.read() for _, stream in second] == [b"2"]
            assert second.stats.retries >= 2
        finally:
            back.join()
