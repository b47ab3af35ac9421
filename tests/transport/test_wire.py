"""Media reads over the HTTP/1.1 transport whose bodies land in the reader's buffer: bit-exact whole, into
buffer slices and as chunks, Content-Length and chunked bodies, kept-alive connections, cut and stalled
bodies, TLS trust, and the memory a whole read holds."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.tls_relay import Relay, make_authority
from torchdata_gcs import ClientConfig, EndpointError, RetryConfig
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.loop import run
from torchdata_gcs._transport.session import Session
from torchdata_gcs._transport.wire import WireTransport
from torchdata_gcs.testing import Emulator, Fault, GCSFront

FAST_RETRY = RetryConfig(max_attempts=4, initial_delay=0.01, max_delay=0.05)


def _session(config: ClientConfig) -> Session:
    """A session of its own (closed by the test), whose media reads go over the wire transport."""
    session = Session(config)
    assert isinstance(session.media, WireTransport)
    return session


async def _read(session: Session, bucket: str, name: str, how: str, headers: dict[str, str] | None = None) -> bytes:
    """The object's bytes read ``how``: whole, into slices of one buffer, or as chunks."""
    url = f"gs://{bucket}/{name}"
    async with session.read_media(url, session.media_path(bucket, name), {"alt": "media"}, headers) as response:
        assert response.status in (200, 206)
        if how == "read":
            return await response.read()
        if how == "chunks":
            pieces = [chunk async for chunk in response.chunks()]
            assert all(pieces)
            return b"".join(pieces)
        target = bytearray(int(response.headers.get("Content-Length", 1 << 24)) + 10)  # more room than needed
        view, filled = memoryview(target), 0
        while count := await response.readinto(view[filled : filled + 100_003]):  # slices: several calls
            filled += count
        return bytes(target[:filled])


@pytest.mark.parametrize("how", ["read", "readinto", "chunks"])
def test_bodies_arrive_bit_exact(how: str, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {"empty": b"", "small": b"x" * 37, "large": os.urandom(9 * 1024 * 1024 + 7)}
    gcs_emulator.seed(gcs_bucket, objects)
    session = _session(gcs_emulator.client_config)
    try:
        for name, data in objects.items():
            assert run(_read(session, gcs_bucket, name, how)) == data, name
        ranged = run(_read(session, gcs_bucket, "large", how, {"Range": "bytes=1000-2000999"}))
        assert ranged == objects["large"][1000:2001000]
    finally:
        run(session.close())


@pytest.mark.parametrize("how", ["read", "readinto", "chunks"])
def test_chunked_bodies_arrive_bit_exact(how: str, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)
    gcs_emulator.seed(gcs_bucket, {"o": data, "p": b"tiny"})
    with GCSFront(gcs_emulator.endpoint, only_promised_headers=True) as front:  # no Content-Length: chunked
        session = _session(ClientConfig(endpoint=front.endpoint, anonymous=True))
        try:
            for _ in range(2):  # the second pair on the same connection: the chunked end was read right
                assert run(_read(session, gcs_bucket, "o", how)) == data
                assert run(_read(session, gcs_bucket, "p", how)) == b"tiny"
            assert front.peak_connections == 1
        finally:
            run(session.close())


def test_connections_are_kept_alive_and_reused(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"o{i}": bytes([i]) * (1000 * i) for i in range(10)})
    with Relay(gcs_emulator.endpoint) as relay:
        session = _session(ClientConfig(endpoint=relay.endpoint, anonymous=True))
        try:
            for i in range(10):
                assert run(_read(session, gcs_bucket, f"o{i}", "read")) == bytes([i]) * (1000 * i)

            async def concurrently() -> list[bytes]:
                return await asyncio.gather(*(_read(session, gcs_bucket, f"o{i}", "chunks") for i in range(4)))

            assert run(concurrently()) == [bytes([i]) * (1000 * i) for i in range(4)]
            assert relay.connections <= 4  # one kept alive for the sequential reads, up to 4 at once
        finally:
            run(session.close())


def test_a_connection_left_mid_body_is_not_reused(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = os.urandom(2 * 1024 * 1024)
    gcs_emulator.seed(gcs_bucket, {"o": data})
    with Relay(gcs_emulator.endpoint) as relay:
        session = _session(ClientConfig(endpoint=relay.endpoint, anonymous=True))

        async def first_bytes() -> bytes:
            url = f"gs://{gcs_bucket}/o"
            async with session.read_media(url, session.media_path(gcs_bucket, "o"), {"alt": "media"}) as response:
                buffer = bytearray(10)
                return bytes(buffer[: await response.readinto(memoryview(buffer))])

        try:
            assert data.startswith(run(first_bytes()))
            assert run(_read(session, gcs_bucket, "o", "read")) == data  # not the rest of the first answer
            assert relay.connections == 2
        finally:
            run(session.close())


def test_a_cut_body_raises_and_a_retry_reads_it_again(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = os.urandom(1024 * 1024)
    gcs_emulator.seed(gcs_bucket, {"o": data})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("truncate", match="get", times=1)]) as front:
        config = ClientConfig(endpoint=front.endpoint, anonymous=True)
        session = _session(config)
        try:
            with pytest.raises(ConnectionError, match="closed before the end"):
                run(_read(session, gcs_bucket, "o", "read"))
        finally:
            run(session.close())
        front.set_faults([Fault("truncate", match="get", times=1)])
        front.reset_counts()
        gcs = Client(config, FAST_RETRY)
        assert gcs.read(gcs_bucket, "o") == data
        assert front.faults_injected["truncate"] == 1 and front.counts["get"] == 2


def test_a_reset_is_retried(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"o": b"payload"})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("reset", match="get", times=2)]) as front:
        gcs = Client(ClientConfig(endpoint=front.endpoint, anonymous=True), FAST_RETRY)
        assert gcs.read(gcs_bucket, "o") == b"payload"
        assert front.faults_injected["reset"] == 2


@contextmanager
def _one_answer_server(answer: bytes, *, then_close: bool) -> Iterator[str]:
    """An endpoint that answers every request with ``answer``, then closes the connection or holds it."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(connection)
            connection.recv(65536)
            connection.sendall(answer)
            if then_close:
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


def test_a_body_without_length_ends_with_its_connection() -> None:
    body = bytes(range(256)) * 1000
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
    for how in ("read", "readinto", "chunks"):
        with _one_answer_server(answer, then_close=True) as endpoint:
            session = _session(ClientConfig(endpoint=endpoint, anonymous=True))
            try:
                assert run(_read(session, "bbb", "o", how), timeout=10) == body
            finally:
                run(session.close())


def test_a_connection_the_server_closed_while_idle_is_replaced(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"o": b"payload"})
    with Relay(gcs_emulator.endpoint) as relay:
        session = _session(ClientConfig(endpoint=relay.endpoint, anonymous=True))
        try:
            assert run(_read(session, gcs_bucket, "o", "read")) == b"payload"
            relay.stop()  # cuts the idle connection
            relay.start()
            assert run(_read(session, gcs_bucket, "o", "read")) == b"payload"
            assert relay.connections == 2
        finally:
            run(session.close())


def test_a_stalled_body_times_out() -> None:
    stalled = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789"  # then nothing
    with _one_answer_server(stalled, then_close=False) as endpoint:
        session = _session(ClientConfig(endpoint=endpoint, anonymous=True, read_timeout=0.3))
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError, match="no answer bytes"):
                run(_read(session, "bbb", "o", "read"), timeout=10)
        finally:
            run(session.close())
        assert time.monotonic() - started < 5


def test_a_whole_read_holds_the_body_once(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    size = 24 * 1024 * 1024
    gcs_emulator.seed(gcs_bucket, {"o": os.urandom(size)})
    session = _session(gcs_emulator.client_config)
    try:
        run(_read(session, gcs_bucket, "o", "read"))  # connection made, code warm
        tracemalloc.start()
        try:
            data = run(_read(session, gcs_bucket, "o", "read"))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(data) == size
        assert peak < size * 1.25  # the body, filled in place; no pieces joined beside it
    finally:
        run(session.close())


@pytest.fixture
def authority(tmp_path: Path):
    return make_authority(tmp_path)


def test_tls_with_the_bundle_requests_names(
    authority, gcs_emulator: Emulator, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, server_context = authority
    data = os.urandom(3 * 1024 * 1024)
    gcs_emulator.seed(gcs_bucket, {"o": data})
    with Relay(gcs_emulator.endpoint, tls=server_context) as relay:
        config = ClientConfig(endpoint=relay.endpoint, anonymous=True)
        for variable in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            monkeypatch.delenv(variable, raising=False)
        untrusting = _session(config)
        try:
            with pytest.raises(EndpointError, match=f"cannot trust {relay.endpoint}: its TLS certificate") as caught:
                run(_read(untrusting, gcs_bucket, "o", "read"))
            assert "self-signed" in str(caught.value) or "local issuer" in str(caught.value)
            assert "REQUESTS_CA_BUNDLE" in str(caught.value)
        finally:
            run(untrusting.close())
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_file))
        trusting = _session(config)
        try:
            for how in ("read", "readinto", "chunks"):
                assert run(_read(trusting, gcs_bucket, "o", how)) == data
        finally:
            run(trusting.close())
        assert relay.connections == 2  # the refused handshake, then one kept-alive connection


def test_through_a_proxy_media_reads_stay_on_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    session = Session(ClientConfig(endpoint="http://storage.example:80", anonymous=True))
    assert session.media is session.transport


def test_a_process_closes_its_media_connections_at_exit(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"o": b"payload"})
    script = f"""
import atexit
from torchdata_gcs import ClientConfig, RetryConfig
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.session import session_for
pooled = []
# registered before the package's own exit hooks, so it runs after them
atexit.register(lambda: print("open after exit:", sum(not connection.closed for connection in pooled)))
config = ClientConfig(endpoint={gcs_emulator.endpoint!r}, anonymous=True)
assert Client(config, RetryConfig()).read({gcs_bucket!r}, "o") == b"payload"
pooled.extend(session_for(config).media._idle)
print("pooled:", len(pooled))
"""
    done = subprocess.run([sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pooled:", "1", "open", "after", "exit:", "0"], done.stdout + done.stderr
    assert "unclosed" not in done.stderr.lower(), done.stderr


def test_a_refused_media_read_names_the_endpoint_as_aiohttp_does() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{unused.getsockname()[1]}"  # bound, not listening: refused
        config = ClientConfig(endpoint=endpoint, anonymous=True)
        assert isinstance(Session(config).media, WireTransport)
        started = time.monotonic()
        with pytest.raises(EndpointError) as caught:
            Client(config, FAST_RETRY).read("some-bucket", "o")
    assert time.monotonic() - started < 5
    assert str(caught.value).startswith(f"cannot reach {endpoint}: connection refused; check ClientConfig(endpoint=")
