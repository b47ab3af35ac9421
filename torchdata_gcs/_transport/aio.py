"""The aiohttp transport: one connection pool per session, its timeouts, proxy and trusted certificates, and
what a connection that cannot be made means (see :class:`~.transport.Transport`). Of the transport layer it
imports only :mod:`.endpoint` (what both transports say of an endpoint), so the layer stays shallow."""

from __future__ import annotations

import io
import os
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
import yarl

from ..config import ClientConfig
from ..errors import EndpointError, TransientError
from .endpoint import answered, proxy_for, unreachable, untrusted

__all__ = ["NETWORK_ERRORS", "STREAM_SLICE", "AiohttpResponse", "AiohttpTransport"]


class AiohttpResponse:
    """An aiohttp answer as a :class:`~.transport.Response`: its body is read straight from aiohttp's stream."""

    __slots__ = ("_left", "_response", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status: int = response.status
        self.headers = response.headers  # case-insensitive, repeated lines kept (getall)
        self._left = memoryview(b"")  # what readinto took from the stream and did not place

    async def read(self) -> bytes:
        if self._left:
            return b"".join([self._left, *[chunk async for chunk in self.chunks()]])
        return await self._response.read()

    async def readinto(self, buffer: memoryview) -> int:
        chunk = self._left if self._left else memoryview(await self._response.content.readany())
        count = min(len(chunk), len(buffer))
        buffer[:count] = chunk[:count]
        self._left = chunk[count:]
        return count

    def chunks(self) -> AsyncIterator[bytes]:
        if self._left:
            return self._left_then_stream()
        return self._response.content.iter_any()  # aiohttp's own iterator: no generator frame per chunk

    async def _left_then_stream(self) -> AsyncIterator[bytes]:
        left, self._left = bytes(self._left), memoryview(b"")
        yield left
        async for chunk in self._response.content.iter_any():
            yield chunk


class _Exchange:
    """One request to :class:`AiohttpTransport` as an async context manager whose value is the answer, aiohttp's
    errors raised as ours on the way in and out. A class, not a generator-based manager: it holds no coroutine
    frame while the answer is read, and small requests, hundreds in flight, allocate less."""

    __slots__ = ("_sending", "_transport", "_url")

    def __init__(self, transport: AiohttpTransport, sending: Any, url: str) -> None:
        self._transport, self._sending, self._url = transport, sending, url

    async def __aenter__(self) -> AiohttpResponse:
        try:
            response = await self._sending.__aenter__()
        except aiohttp.ClientError as exc:
            failure = self._transport.translated(exc, self._url)
            if failure is None:
                raise
            raise failure from None
        answered.add(self._transport.endpoint)
        return AiohttpResponse(response)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        await self._sending.__aexit__(exc_type, exc, tb)  # releases the connection (or closes a broken one)
        failure = None if exc is None else self._transport.translated(exc, self._url)
        if failure is not None:
            raise failure from None


class AiohttpTransport:
    """Requests to one endpoint over aiohttp, on the I/O loop, each with ``headers`` unless it sets them
    itself, an https endpoint checked against ``trust`` (the certificates, and where to add one: see
    :func:`.endpoint.trusted_certificates`). The pool is made at the first request. A connection refused
    by an endpoint that has never answered is raised as ``never_answered(EndpointError(...))``, the error
    naming ``endpoint_hint`` (where the endpoint came from)."""

    def __init__(
        self,
        config: ClientConfig,
        endpoint: str,
        headers: dict[str, str],
        never_answered: Callable[[EndpointError], Exception],
        endpoint_hint: str,
        trust: tuple[ssl.SSLContext | None, str],
    ) -> None:
        self.config, self.endpoint, self._headers = config, endpoint, headers
        self._never_answered, self._endpoint_hint = never_answered, endpoint_hint
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._trusted, self._trust_hint = trust
        self._proxy = proxy_for(endpoint)  # aiohttp's trust_env would re-read the environment per request

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None,
        *,
        url: str,
        json: Any = None,
        data: Any = None,  # a transport.Body
        answer_timeout: float | None = None,
    ) -> _Exchange:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, ssl=self._trusted or True),
                timeout=self._timeout,
                auto_decompress=False,
                headers=self._headers,
            )
        body: Any = None
        if isinstance(data, bytes):
            body = io.BytesIO(data)  # shares the bytes; aiohttp streams it
        elif data is not None:
            pieces = [
                memoryview(piece).cast("B") for piece in ([data] if isinstance(data, (bytearray, memoryview)) else data)
            ]
            headers = {**(headers or {}), "Content-Length": str(sum(map(len, pieces)))}
            body = _streamed(pieces)
        timeout = (
            self._timeout
            if answer_timeout is None
            else aiohttp.ClientTimeout(
                total=answer_timeout, sock_connect=self.config.connect_timeout, sock_read=answer_timeout
            )
        )
        # The target is percent-encoded already: yarl need not parse and encode it again.
        sending = self._session.request(
            method,
            yarl.URL(target, encoded=True),
            headers=headers,
            proxy=self._proxy,
            json=json,
            data=body,
            timeout=timeout,
        )
        return _Exchange(self, sending, url)

    def translated(self, exc: BaseException, url: str) -> BaseException | None:
        """Our error for an aiohttp error raised by an exchange with ``url``, else ``None`` (raised as it is)."""
        if isinstance(exc, aiohttp.ClientResponseError):  # a malformed answer; its request_info holds our headers
            return TransientError(f"{url}: {type(exc).__name__}: {exc.message}", url=url, status=exc.status)
        if isinstance(exc, aiohttp.ClientConnectorError):
            return self._connection_failure(exc)  # None once the endpoint has answered: a blip, retried
        return None

    def _connection_failure(self, exc: aiohttp.ClientConnectorError) -> Exception | None:
        """What a connection that could not be made means. A certificate that fails verification is an
        ``EndpointError`` at once (no new attempt trusts it); a refused connection, a host that does not
        resolve or a failed handshake is one after a few seconds (``never_answered``) while the endpoint has
        never answered in this process; after that, ``None``: a network fault, retried."""
        proxied = isinstance(exc, aiohttp.ClientProxyConnectionError)
        where = f"the proxy {self._proxy} for {self.endpoint}" if proxied else self.endpoint
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return EndpointError(untrusted(where, str(exc.certificate_error), self._trust_hint), url=self.endpoint)
        if self.endpoint in answered:
            return None
        if isinstance(exc, aiohttp.ClientConnectorDNSError):
            cause = f"host name {exc.host!r} does not resolve"
        elif isinstance(exc, aiohttp.ClientSSLError):
            cause = f"the TLS handshake failed ({exc.os_error})"
        elif exc.os_error.errno:
            cause = os.strerror(exc.os_error.errno).lower()  # "connection refused", "no route to host"
        else:
            cause = str(exc.os_error) or type(exc.os_error).__name__
        check = "check HTTP_PROXY, HTTPS_PROXY and NO_PROXY" if proxied else self._endpoint_hint
        return self._never_answered(EndpointError(unreachable(where, cause, check), url=self.endpoint))

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectionError,  # resets, refused connections, read timeouts of object reads
    aiohttp.ClientPayloadError,  # a body cut off before its Content-Length
)
"""aiohttp's network faults, which a new attempt may cure (other transports raise ``ConnectionError``
and ``TimeoutError``, as aiohttp's faults that come from the socket are too)."""

STREAM_SLICE = 128 * 1024
"""Body pieces go out in slices of at most this size: no single write holds up the I/O loop, and what a
connection's transport copies aside when the socket takes only part of a write stays small (with 1 MiB
slices, 8 uploads in flight held about 6 MiB more)."""


async def _streamed(pieces: Sequence[memoryview]) -> AsyncIterator[memoryview]:
    """The pieces of a body as slices, for aiohttp to send (a new generator for each attempt)."""
    for piece in pieces:
        for start in range(0, len(piece), STREAM_SLICE):
            yield piece[start : start + STREAM_SLICE]
