"""An HTTP/1.1 client whose answer bodies land in the caller's buffer: a keep-alive pool of connections
to one endpoint, each an ``asyncio.BufferedProtocol``. Status line, headers and chunk framing are read
into a small buffer of the connection's own; while a reader waits in ``readinto``, the socket reads go
straight into the reader's memoryview, and ``read`` fills one ``bytes`` of the body's length in place.

It sends requests without a body (media reads); a connection goes back to the pool only once its answer
was read whole. A body cut short raises ``ConnectionError``, a wait with no byte ``TimeoutError``, as
:mod:`.retry` expects of any transport; see :class:`~.transport.Transport`."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

from multidict import CIMultiDict

from ..config import ClientConfig
from ..errors import EndpointError, TransientError
from .endpoint import answered, unreachable, untrusted
from .transport import FilledBytes

__all__ = ["WAKE_AFTER", "WireResponse", "WireTransport"]

HEAD_BUFFER = 64 * 1024
"""A connection's own buffer: an answer's head and chunk framing must fit in it (GCS's heads are a few
KiB); body bytes that come before a reader asks for them wait here, and reading pauses when it is full."""

CHUNK = 256 * 1024
"""The most bytes :meth:`WireResponse.chunks` hands out at once."""

WAKE_AFTER = 1024 * 1024
"""A reader waiting in ``readinto`` is woken once this many bytes landed in its buffer (or the buffer is
full, the connection ended, or its wait timed out with bytes in): the socket reads go on landing meanwhile,
so a large body comes back in pieces of at least this size, each a task step and a crc32c call, not one
per socket read (a few hundred KiB on loopback). Still small enough to be hashed while in cache."""

_UNTIL_CLOSE = -1  # a body framed by neither Content-Length nor chunks ends when the connection does
_HEX_DIGITS = b"0123456789abcdefABCDEF"


class _Connection(asyncio.BufferedProtocol):
    """One connection: its socket reads land in :attr:`target` while a reader waits there, else in the
    connection's own buffer (``buffer[start:end]`` holds what is not read yet)."""

    def __init__(self) -> None:
        self.buffer = bytearray(HEAD_BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.target: memoryview | None = None
        self.landed = 0  # bytes put in target
        self.received = False  # whether a byte came since the last request was sent
        self.closed = False
        self.reset = False  # whether the connection ended in an error (a reset), not an orderly close
        self.keep_alive = True  # whether the last answer lets the connection serve another request
        self.paused = False
        self.waiter: asyncio.Future[bool] | None = None
        self.expires = 0.0  # the loop's time at which the wait in progress ends
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio hands a Transport; this protocol reads and pauses, so it is a ReadTransport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.target is not None:
            return self.target[self.landed :]
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buffer):  # room only at the front: move what is unread there
            unread = self.end - self.start
            self.buffer[:unread] = self.view[self.start : self.end]
            self.start, self.end = 0, unread
        return self.view[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.received = True
        if self.target is not None:
            self.landed += nbytes
            if self.landed == len(self.target):
                self.target = None  # full: what follows waits in the connection's buffer
            elif self.landed < WAKE_AFTER:
                return  # the reader takes a larger piece (see WAKE_AFTER)
        else:
            self.end += nbytes
            if self.end - self.start == len(self.buffer):
                self.paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]  # set once connected, before data arrives
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reset = self.reset or exc is not None
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(True)

    def resume(self) -> None:
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]  # set once connected

    async def wait(self, timeout: float) -> bool:
        """Wait for bytes or the end of the connection; ``False`` if none came within ``timeout``.

        The connection keeps one timer for all its waits, not one per wait (two or three per small read, each
        a handle in the loop's heap): it is set anew only for a wait that must end before it fires, and one that
        fires before the wait in progress ends is set again for the rest."""
        loop = asyncio.get_running_loop()
        self.expires = loop.time() + max(timeout, 0)
        if self.timer is None or self.timer.when() > self.expires:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = loop.call_at(self.expires, self._expire)
        waiter = self.waiter = loop.create_future()
        try:
            return await waiter
        finally:
            self.waiter = None

    def _expire(self) -> None:
        self.timer = None
        if self.waiter is None or self.waiter.done():
            return
        loop = self.waiter.get_loop()
        if loop.time() < self.expires:  # set for an earlier wait: this one ends later
            self.timer = loop.call_at(self.expires, self._expire)
        else:  # time is up: the wait ends with the bytes that landed meanwhile, if any (see WAKE_AFTER)
            self.waiter.set_result(self.landed > 0)

    def close(self) -> None:
        self.target = None
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()


async def _bytes_or_timeout(connection: _Connection, url: str, read_timeout: float, deadline: float | None) -> None:
    """Wait for answer bytes on ``connection`` for the read timeout, or until ``deadline``; if none came, close it
    and raise ``TimeoutError``."""
    timeout = read_timeout if deadline is None else deadline - asyncio.get_running_loop().time()
    if not await connection.wait(timeout):
        connection.close()
        raise TimeoutError(f"{url}: no answer bytes for {timeout:.3g} s")


def _header_fields(text: str, url: str) -> CIMultiDict[str]:
    """An answer's header lines (``text``, the head after its status line) as a case-insensitive multi-dict of
    names and values, each stripped; a folded line (obs-fold) continues the one before it."""
    lines = text.split("\r\n") if text else []
    if "\r\n " in text or "\r\n\t" in text:
        unfolded: list[str] = []
        for line in lines:
            if line[:1] in (" ", "\t") and unfolded:
                unfolded[-1] = f"{unfolded[-1].rstrip()} {line.strip()}"
            else:
                unfolded.append(line)
        lines = unfolded
    parts = [line.partition(":") for line in lines]
    fields = [(name.strip(), value.strip()) for name, colon, value in parts if colon]
    if len(fields) != len(parts):
        line = next(line for line, (_, colon, _) in zip(lines, parts, strict=True) if not colon)
        raise TransientError(f"{url}: a malformed header line {line[:80]!r}", url=url)
    return CIMultiDict(fields)


class WireResponse:
    """An answer read from a :class:`_Connection`, as a :class:`~.transport.Response`: ``_left`` bytes are
    left of the body's current piece (the whole body, or one chunk of a chunked one)."""

    __slots__ = (
        "_chunked",
        "_connection",
        "_deadline",
        "_done",
        "_left",
        "_read_timeout",
        "_to_close",
        "_url",
        "headers",
        "status",
    )

    def __init__(
        self,
        connection: _Connection,
        status: int,
        headers: CIMultiDict[str],
        left: int,
        chunked: bool,
        url: str,
        read_timeout: float,
        deadline: float | None,
    ) -> None:
        self._connection, self.status, self.headers = connection, status, headers
        self._to_close = left == _UNTIL_CLOSE
        self._left = sys.maxsize if self._to_close else left
        self._chunked, self._done = chunked, left == 0 and not chunked
        self._url, self._read_timeout, self._deadline = url, read_timeout, deadline

    async def readinto(self, buffer: memoryview) -> int:
        if not self._left and (self._done or not await self._next_chunk()):
            return 0
        if buffer.format != "B" or buffer.ndim != 1:
            buffer = buffer.cast("B")
        want = min(len(buffer), self._left)
        if want == 0:
            return 0
        connection = self._connection
        unread = connection.end - connection.start
        if unread:  # bytes that came before this call
            count = min(unread, want)
            buffer[:count] = connection.view[connection.start : connection.start + count]
            connection.start += count
            connection.resume()
        else:
            count = await self._land(buffer[:want])
        self._left -= count
        if not self._left and not self._chunked:
            self._done = True
        return count

    async def _land(self, target: memoryview) -> int:
        """Let the socket write into ``target``; how many bytes it did (``0`` at the end of a body that ends
        with its connection)."""
        connection = self._connection
        if not connection.closed:
            connection.target, connection.landed = target, 0
            connection.resume()
            try:
                while not connection.landed and not connection.closed:
                    await self._wait()
            finally:
                count, connection.target, connection.landed = connection.landed, None, 0
            if count:
                return count
        if self._to_close and not connection.reset:  # only an orderly close ends such a body
            self._left = 0
            self._done = True
            return 0
        raise ConnectionError(f"{self._url}: the connection closed before the end of the answer's body")

    async def _wait(self) -> None:
        await _bytes_or_timeout(self._connection, self._url, self._read_timeout, self._deadline)

    async def _line(self) -> bytes:
        """The next line of the connection's buffer (a chunk's size, a trailer), without its end."""
        connection = self._connection
        while True:
            end = connection.buffer.find(b"\r\n", connection.start, connection.end)
            if end >= 0:
                line = bytes(connection.view[connection.start : end])
                connection.start = end + 2
                connection.resume()
                return line
            if connection.end - connection.start == len(connection.buffer):
                raise TransientError(
                    f"{self._url}: an answer line longer than {len(connection.buffer)} bytes",
                    url=self._url,
                )
            if connection.closed:
                raise ConnectionError(f"{self._url}: the connection closed before the end of the answer")
            await self._wait()

    async def _next_chunk(self) -> bool:
        """Read up to the next chunk's bytes; ``False`` (the body is done) after the last chunk and trailers."""
        if not self._chunked or self._done:
            return False
        line = await self._line()
        if not line:  # the end of the chunk before this one
            line = await self._line()
        digits = line.split(b";", 1)[0].rstrip(b" \t")  # chunk extensions are ignored
        if not digits or digits.strip(_HEX_DIGITS):  # int() would take "0x5", "+5", "5_0"
            raise TransientError(f"{self._url}: a malformed chunk size {line[:40]!r}", url=self._url)
        size = int(digits, 16)
        if size == 0:
            while await self._line():  # trailers, up to an empty line
                pass
            self._done = True
            return False
        self._left = size
        return True

    async def read(self) -> bytes:
        if not self._chunked and not self._to_close:
            body = FilledBytes(self._left)
            filled = 0
            while filled < len(body.view):
                filled += await self.readinto(body.view[filled:])
            return body.take()
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        while self._left or (not self._done and await self._next_chunk()):
            piece = FilledBytes(min(self._left, CHUNK))
            filled = 0
            while filled < len(piece.view):
                count = await self.readinto(piece.view[filled:])
                if not count:
                    break
                filled += count
            if filled == len(piece.view):
                yield piece.take()
            elif filled:
                yield bytes(piece.view[:filled])

    @property
    def done(self) -> bool:
        """Whether the body was read to its end."""
        return self._done


class _Exchange:
    """One request's context (a class, not a generator: it is made for every media read): the answer on
    entry, read from a kept-alive connection or a new one; the connection pooled or closed on exit."""

    __slots__ = ("_answer_timeout", "_connection", "_headers", "_method", "_response", "_target", "_transport", "_url")

    def __init__(
        self,
        transport: WireTransport,
        method: str,
        target: str,
        headers: dict[str, str] | None,
        url: str,
        answer_timeout: float | None,
    ) -> None:
        self._transport, self._method, self._target, self._headers = transport, method, target, headers
        self._url, self._answer_timeout = url, answer_timeout

    async def __aenter__(self) -> WireResponse:
        transport, method, url = self._transport, self._method, self._url
        head = transport._head(method, self._target[len(transport.endpoint) :] or "/", self._headers)
        deadline = None if self._answer_timeout is None else asyncio.get_running_loop().time() + self._answer_timeout
        for reused in (True, False):
            found = transport._reusable() if reused else None
            connection = found if found is not None else await transport._connect(deadline)
            reused = found is not None
            try:
                response = await transport._answer(connection, head, method, url, deadline)
                break
            except ConnectionError:
                connection.close()
                if reused and not connection.received:  # closed by the server while idle: once more, anew
                    continue
                raise
            except BaseException:
                connection.close()
                raise
        answered.add(transport.endpoint)
        self._connection, self._response = connection, response
        return response

    async def __aexit__(self, *exc_info: object) -> None:
        self._transport._release(self._connection, self._response)


class WireTransport:
    """Requests without a body to one endpoint (``http://`` or ``https://``, no proxy) over a pool of
    kept-alive connections, each request with ``headers`` unless it sets them itself. Timeouts, ``trust``
    and what a connection that cannot be made means are as in :class:`~.aio.AiohttpTransport`:
    a refused connection to an endpoint that has never answered is raised as
    ``never_answered(EndpointError(...))``, the error naming ``endpoint_hint``."""

    def __init__(
        self,
        config: ClientConfig,
        endpoint: str,
        headers: dict[str, str],
        never_answered: Callable[[EndpointError], Exception],
        endpoint_hint: str,
        trust: tuple[ssl.SSLContext | None, str],
    ) -> None:
        self.config, self.endpoint = config, endpoint
        self._headers = {name.lower(): (name, value) for name, value in headers.items()}
        self._never_answered, self._endpoint_hint = never_answered, endpoint_hint
        parts = urlsplit(endpoint)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._host_header = parts.netloc.rpartition("@")[2]
        self._trusted, self._trust_hint = trust
        self._idle: list[_Connection] = []
        self._head_ends: dict[tuple[str, ...], str] = {}  # see _other_headers
        self._closed = False

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None,
        *,
        url: str,
        json: Any = None,
        data: Any = None,
        answer_timeout: float | None = None,
    ) -> _Exchange:
        if json is not None or data is not None:
            raise TypeError("WireTransport sends requests without a body")
        if not target.startswith(self.endpoint):
            raise ValueError(f"{target} is not on {self.endpoint}")
        return _Exchange(self, method, target, headers, url, answer_timeout)

    def _release(self, connection: _Connection, response: WireResponse) -> None:
        """Pool the connection if its answer was read whole and nothing else waits on it; else close it."""
        reusable = response.done and connection.keep_alive and connection.start == connection.end
        if reusable and not connection.closed and not self._closed:
            self._idle.append(connection)
        else:
            connection.close()

    def _head(self, method: str, path: str, headers: dict[str, str] | None) -> bytes:
        """The request's head: its line, its own headers, then Host and each default it does not set itself."""
        own = "".join([f"{name}: {value}\r\n" for name, value in headers.items()]) if headers else ""
        varying = f"{method} {path} HTTP/1.1\r\n{own}"
        lines = 1 + (len(headers) if headers else 0)
        if varying.count("\n") != lines or varying.count("\r") != lines:
            raise ValueError(f"a line break in a request header or the path: {varying!r}")
        return (varying + self._other_headers(headers)).encode("latin-1")

    def _other_headers(self, headers: dict[str, str] | None) -> str:
        """Host and the defaults that ``headers`` do not set, as head lines ending with the empty one; made once
        per set of header names (a request sends one of a few)."""
        names = tuple(headers) if headers else ()
        lines = self._head_ends.get(names)
        if lines is None:
            own = {name.lower() for name in names}
            defaults = [(name, value) for key, (name, value) in self._headers.items() if key not in own]
            lines = "".join(f"{name}: {value}\r\n" for name, value in [("Host", self._host_header), *defaults])
            if lines.count("\n") != len(defaults) + 1 or lines.count("\r") != len(defaults) + 1:
                raise ValueError(f"a line break in a default header: {lines!r}")
            lines = self._head_ends[names] = lines + "\r\n"
        return lines

    def _reusable(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and connection.start == connection.end:
                return connection
            connection.close()  # closed by the server, or it sent something unasked
        return None

    async def _connect(self, deadline: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        timeout = (
            self.config.connect_timeout
            if deadline is None
            else min(self.config.connect_timeout, deadline - loop.time())
        )
        host = self._host
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    _Connection,
                    host,
                    self._port,
                    ssl=self._trusted,
                    server_hostname=host if self._trusted else None,
                ),
                max(timeout, 0),
            )
        except ssl.SSLCertVerificationError as exc:
            raise EndpointError(untrusted(self.endpoint, str(exc), self._trust_hint), url=self.endpoint) from None
        except asyncio.TimeoutError:
            raise TimeoutError(f"cannot connect to {self.endpoint} within {timeout:.3g} s") from None
        except OSError as exc:
            if self.endpoint in answered:
                raise ConnectionError(f"cannot connect to {self.endpoint}: {exc}") from exc
            if isinstance(exc, socket.gaierror):
                cause = f"host name {host!r} does not resolve"
            elif isinstance(exc, ssl.SSLError):
                cause = f"the TLS handshake failed ({exc})"
            elif exc.errno:
                cause = os.strerror(exc.errno).lower()  # "connection refused", "no route to host"
            else:
                cause = str(exc) or type(exc).__name__
            failure = EndpointError(
                unreachable(self.endpoint, cause, self._endpoint_hint),
                url=self.endpoint,
            )
            raise self._never_answered(failure) from None
        return connection

    async def _answer(
        self,
        connection: _Connection,
        head: bytes,
        method: str,
        url: str,
        deadline: float | None,
    ) -> WireResponse:
        """Send ``head`` on ``connection`` and read the answer's status and headers."""
        connection.received = False
        connection.transport.write(head)  # type: ignore[union-attr]  # a connection handed out is connected
        status = 100
        while 100 <= status < 200 and status != 101:  # interim answers (100 Continue, 103) come before the answer
            while (end := connection.buffer.find(b"\r\n\r\n", connection.start, connection.end)) < 0:
                if connection.end - connection.start == len(connection.buffer):
                    raise TransientError(
                        f"{url}: an answer head longer than {len(connection.buffer)} bytes",
                        url=url,
                    )
                if connection.closed:
                    raise ConnectionError(f"{url}: the connection closed before an answer")
                await _bytes_or_timeout(connection, url, self.config.read_timeout, deadline)
            status_line, _, fields = connection.buffer[connection.start : end].decode("latin-1").partition("\r\n")
            connection.start = end + 4
            connection.resume()
            version, _, rest = status_line.partition(" ")
            code = rest[:3]  # three digits, then a space or the end of the line
            if not (len(code) == 3 and code.isascii() and code.isdigit() and rest[3:4] in ("", " ")):
                raise TransientError(f"{url}: a malformed status line {status_line[:80]!r}", url=url) from None
            status = int(code)
        headers = _header_fields(fields, url)
        connection.keep_alive = (  # HTTP/1.0 answers and 101 (another protocol follows) end the connection
            version == "HTTP/1.1" and status != 101 and "close" not in headers.get("Connection", "").lower()
        )
        codings = [c.strip().lower() for line in headers.getall("Transfer-Encoding", ()) for c in line.split(",")]
        if codings and codings != ["chunked"]:  # a Transfer-Encoding wins over Content-Length; only chunks are read
            raise TransientError(f"{url}: a transfer coding not read here {', '.join(codings)[:40]!r}", url=url)
        chunked = bool(codings)
        if method == "HEAD" or status in (204, 304) or status == 101:
            left, chunked = 0, False
        elif chunked:
            left = 0
        elif (framed := headers.getall("Content-Length", None)) is not None:
            # several values (lines or a list) frame the body only if they agree; a digit only as HTTP knows one
            lengths = {length.strip() for line in framed for length in line.split(",")}
            if len(lengths) != 1 or not all(length.isascii() and length.isdigit() for length in lengths):
                raise TransientError(f"{url}: a malformed Content-Length {', '.join(framed)[:40]!r}", url=url)
            left = int(lengths.pop())
        else:
            left = _UNTIL_CLOSE
        return WireResponse(connection, status, headers, left, chunked, url, self.config.read_timeout, deadline)

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
