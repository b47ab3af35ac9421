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
from pathlib import Path

import pytest

from tests.hostile_server import one_answer_server
from tests.tls_relay import Relay, make_authority
from torchdata_gcs import ClientConfig, EndpointError, RetryConfig, TransientError
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.loop import run
from torchdata_gcs._transport.session import Destination, Session
from torchdata_gcs._transport.wire import WAKE_AFTER, WireTransport
from torchdata_gcs.testing import Emulator, Fault, GCSFront

FAST_RETRY = RetryConfig(max_attempts=4, initial_delay=0.01, max_delay=0.05)


def _session(config: ClientConfig) -> Session:
    """A session of its own (closed by the test), whose media reads go over the wire transport."""
    session = Session(Destination.of(config))
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


def test_a_body_without_length_ends_with_its_connection() -> None:
    body = bytes(range(256)) * 1000
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
    for how in ("read", "readinto", "chunks"):
        with one_answer_server(answer, then_close=True) as endpoint:
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
    with one_answer_server(stalled, then_close=False) as endpoint:
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


def test_a_large_body_comes_in_pieces_of_at_least_wake_after(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """A reader waiting in ``readinto`` is woken once ``WAKE_AFTER`` bytes landed in its buffer, not at every
    socket read: each piece costs a task step and a crc32c call. The first piece may be bytes that came with
    the answer's head, the last is the buffer's end."""
    data = os.urandom(24 * 1024 * 1024 + 3)
    gcs_emulator.seed(gcs_bucket, {"o": data})
    session = _session(gcs_emulator.client_config)

    async def pieces() -> list[int]:
        url = f"gs://{gcs_bucket}/o"
        target, counts = memoryview(bytearray(len(data))), []
        async with session.read_media(url, session.media_path(gcs_bucket, "o"), {"alt": "media"}) as response:
            while count := await response.readinto(target[sum(counts) :]):
                counts.append(count)
        assert target == data
        return counts

    try:
        counts = run(pieces())
    finally:
        run(session.close())
    assert sum(counts) == len(data)
    assert all(count >= WAKE_AFTER for count in counts[1:-1]), counts


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
    session = Session(Destination.of(ClientConfig(endpoint="http://storage.example:80", anonymous=True)))
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
    # Bound, not listening: refused. On a loopback address no other test serves from, so this endpoint
    # has never answered in this process (a port an earlier server used would count as a blip).
    with socket.socket() as unused:
        unused.bind(("127.77.0.1", 0))
        endpoint = f"http://127.77.0.1:{unused.getsockname()[1]}"
        config = ClientConfig(endpoint=endpoint, anonymous=True)
        assert isinstance(Session(Destination.of(config)).media, WireTransport)
        started = time.monotonic()
        with pytest.raises(EndpointError) as caught:
            Client(config, FAST_RETRY).read("some-bucket", "o")
    assert time.monotonic() - started < 5
    assert str(caught.value).startswith(
        f"cannot reach {endpoint}: connection refused; check the endpoint given (ClientConfig(endpoint="
    )


def test_interim_answers_before_the_final_one_are_skipped() -> None:
    body = b"hello, world"
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n" + body
    )
    with one_answer_server(answer, then_close=True) as endpoint:
        session = _session(ClientConfig(endpoint=endpoint, anonymous=True))
        try:
            for how in ("read", "readinto", "chunks"):
                assert run(_read(session, "bbb", "o", how), timeout=10) == body
        finally:
            run(session.close())


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 5\r\nContent-Length: 12\r\n\r\nhello, world",  # which body ends where?
        b"Content-Length: 5, 12\r\n\r\nhello, world",
        b"Content-Length: \xb2\r\n\r\nhello, world",  # a digit to str.isdigit, not to HTTP
        b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",  # a size HTTP's grammar refuses
        b"Transfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
        b"Transfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello",  # the coding frames it, not the length
        b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",  # bytes no one would decode
        b"Transfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ],
)
def test_ambiguous_framing_is_refused(head: bytes) -> None:
    with one_answer_server(b"HTTP/1.1 200 OK\r\n" + head, then_close=True) as endpoint:
        session = _session(ClientConfig(endpoint=endpoint, anonymous=True))
        try:
            with pytest.raises(TransientError, match="Content-Length|chunk size|transfer coding"):
                run(_read(session, "bbb", "o", "read"), timeout=10)
        finally:
            run(session.close())


def test_several_equal_content_lengths_frame_the_body() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\n\r\nhello"
    with one_answer_server(answer, then_close=True) as endpoint:
        session = _session(ClientConfig(endpoint=endpoint, anonymous=True))
        try:
            assert run(_read(session, "bbb", "o", "read"), timeout=10) == b"hello"
        finally:
            run(session.close())


@pytest.mark.parametrize("status_line", [b"HTTP/1.1 2000 OK", b"HTTP/1.1 +20 OK", b"HTTP/1.1 20"])
def test_a_malformed_status_line_is_refused(status_line: bytes) -> None:
    with one_answer_server(status_line + b"\r\nContent-Length: 0\r\n\r\n", then_close=True) as endpoint:
        session = _session(ClientConfig(endpoint=endpoint, anonymous=True))
        try:
            with pytest.raises(TransientError, match="status line"):
                run(_read(session, "bbb", "o", "read"), timeout=10)
        finally:
            run(session.close())


def test_a_cancelled_readinto_leaves_the_buffer_alone_and_the_connection_unused() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    rest = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        connection, _ = listener.accept()
        held.append(connection)
        connection.recv(65536)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"a" * 10)
        rest.wait(10)
        connection.sendall(b"b" * 990)  # after the reader gave up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    session = _session(ClientConfig(endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}", anonymous=True))
    buffer = bytearray(1000)

    async def cancel_midway() -> None:
        async with session.read_media("gs://bbb/o", session.media_path("bbb", "o"), {"alt": "media"}) as response:
            view = memoryview(buffer)
            assert await response.readinto(view) == 10
            task = asyncio.ensure_future(response.readinto(view[10:]))
            await asyncio.sleep(0.2)  # waiting in the socket for more
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            rest.set()
            for _ in range(20):  # the loop takes in the rest, wherever it goes
                await asyncio.sleep(0.01)
            assert bytes(buffer) == b"a" * 10 + bytes(990)

    try:
        run(cancel_midway(), timeout=10)
        assert isinstance(session.media, WireTransport)
        assert not session.media._idle  # left mid-body: closed, never pooled
    finally:
        run(session.close())
        thread.join(5)
        for connection in held:
            connection.close()
        listener.close()


def test_a_kept_alive_connection_closed_after_the_request_is_sent_is_retried_anew() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:  # each connection: one answer, then the next request is read and left unanswered
        listener.settimeout(5)
        for _ in range(2):
            connection, _ = listener.accept()
            accepted.append(connection)
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            connection.recv(65536)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    session = _session(ClientConfig(endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}", anonymous=True))
    try:
        assert run(_read(session, "bbb", "o", "read"), timeout=10) == b"hello"
        assert run(_read(session, "bbb", "o", "read"), timeout=10) == b"hello"  # the idle one, then a new one
        assert len(accepted) == 2
    finally:
        run(session.close())
        thread.join(5)
        listener.close()


def test_a_folded_header_line_continues_the_one_before_it() -> None:
    answer = b"HTTP/1.1 200 OK\r\nX-Note: one\r\n Content-Length: 12\r\n\ttwo\r\nContent-Length: 5\r\n\r\nhello"
    with one_answer_server(answer, then_close=True) as endpoint:
        session = _session(ClientConfig(endpoint=endpoint, anonymous=True))

        async def note() -> tuple[str, bytes]:
            async with session.read_media("gs://bbb/o", session.media_path("bbb", "o"), {"alt": "media"}) as response:
                return response.headers["X-Note"], await response.read()

        try:
            assert run(note(), timeout=10) == ("one Content-Length: 12 two", b"hello")
        finally:
            run(session.close())


def test_a_body_that_ends_with_its_connection_is_not_whole_when_the_connection_is_reset() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        listener.settimeout(5)
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 1000)
        time.sleep(0.2)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        connection.close()  # with a zero linger: a reset, not an end

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    session = _session(ClientConfig(endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}", anonymous=True))
    try:
        with pytest.raises(ConnectionError, match="closed before the end"):
            run(_read(session, "bbb", "o", "readinto"), timeout=10)
    finally:
        run(session.close())
        thread.join(5)
        listener.close()
