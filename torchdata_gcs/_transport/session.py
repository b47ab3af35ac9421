"""The data plane: object requests as coroutines over one aiohttp session per process and configuration.

The control plane (listing, metadata, single writes) stays on the ``requests`` transport of
``_client``; this module sends what the loaders send many of at once (media GETs, and the
compose and delete requests of composites), with the transport's endpoint, credentials and user project.
Object bytes are the stored ones (``Accept-Encoding: gzip`` on media reads and no decompression), so
checksums apply; every other answer is asked for uncompressed.
"""

from __future__ import annotations

import asyncio
import io
import threading
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import yarl

from ..config import ClientConfig
from ..errors import TransientError
from . import lifecycle
from .http import Transport, error_detail, error_for_status, json_answer, retry_after_seconds, transport_for
from .loop import io_loop
from .throttle import Throttle

__all__ = ["ObjectReader", "object_reader"]


class ObjectReader:
    """One process's session for reading objects through one ``ClientConfig``; lives on the I/O loop.

    Its :class:`Throttle` is shared by every loader of the process that uses this configuration.
    """

    def __init__(self, config: ClientConfig, transport: Transport) -> None:
        self.config = config
        self.transport = transport
        self.throttle = Throttle()
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._signed = not self.transport.anonymous
        # The proxy for the endpoint, resolved once from the environment (aiohttp's trust_env
        # re-reads the environment and ~/.netrc on every request).
        endpoint = urlsplit(self.transport.endpoint)
        proxies = urllib.request.getproxies()
        bypass = urllib.request.proxy_bypass(endpoint.hostname or "") if proxies else True
        self._proxy = None if bypass else proxies.get(endpoint.scheme)

    def media_path(self, bucket: str, name: str) -> str:
        return f"{self.transport.endpoint}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    def object_path(self, bucket: str, name: str) -> str:
        return self.transport.endpoint + self.transport.object_path(bucket, name)

    async def _headers(self) -> dict[str, str]:
        transport = self.transport
        if transport.token_is_fresh():
            return transport.authorization()
        return await asyncio.get_running_loop().run_in_executor(None, transport.authorization)

    def read_media(
        self, url: str, path: str, params: dict[str, Any], headers: dict[str, str] | None = None
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """GET the object's bytes at media ``path`` as stored (gzip-encoded ones too, which the
        checksums cover); a non-2xx answer raises its typed error naming ``url``."""
        return self.send("GET", url, path, params, {"Accept-Encoding": "gzip", **(headers or {})})

    @asynccontextmanager
    async def send(
        self,
        method: str,
        url: str,
        path: str,
        params: dict[str, Any],
        headers: dict[str, str] | None = None,
        json: Any = None,
        data: bytes | None = None,
        xml_api: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send ``method`` to ``path`` of the JSON API (the XML API if ``xml_api``), with a ``json`` or
        ``data`` body if given; a non-2xx answer raises its typed error naming ``url``."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                timeout=self._timeout,
                auto_decompress=False,
                headers={"Accept-Encoding": "identity"},  # media reads ask for gzip: see read_media
            )
        params, headers = self.transport.billed(params, headers, xml_api=xml_api)
        request_headers = {**(await self._headers()), **(headers or {})} if self._signed else headers
        # The path is percent-encoded already: yarl need not parse and encode it again.
        target = yarl.URL(f"{path}?{urlencode(params)}", encoded=True)
        try:
            async with self._session.request(
                method,
                target,
                headers=request_headers,
                proxy=self._proxy,
                json=json,
                data=None if data is None else io.BytesIO(data),  # shares the bytes; aiohttp streams it
            ) as response:
                if response.status >= 400:
                    text = await response.text(errors="replace")
                    raise error_for_status(
                        response.status,
                        url,
                        error_detail(text),
                        retry_after=retry_after_seconds(response.headers.get("Retry-After")),
                    )
                yield response
        except aiohttp.ClientResponseError as exc:  # a malformed answer; its request_info holds our headers
            raise TransientError(f"{url}: {type(exc).__name__}: {exc.message}", url=url, status=exc.status) from None

    @staticmethod
    async def json_answer(response: aiohttp.ClientResponse, url: str, required: Sequence[str] = ()) -> Any:
        """The answer's JSON document (see :func:`_client.json_answer`)."""
        return json_answer(await response.read(), url, response.status, response.headers.get("Content-Type"), required)


_lock = threading.Lock()
_readers: dict[Transport, ObjectReader] = {}  # one per transport: the same endpoint and credentials
_inherited: list[ObjectReader] = []  # a forked child's copies of its parent's readers: never used, never collected


def object_reader(config: ClientConfig) -> ObjectReader:
    """This process's reader for ``config`` (created on first use, anew after fork)."""
    transport = transport_for(config)
    with _lock:
        reader = _readers.get(transport)
        if reader is None:
            reader = _readers[transport] = ObjectReader(config, transport)
        return reader


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _inherited.extend(_readers.values())  # their sessions belong to the parent's loop
    _readers.clear()


def _close_at_exit() -> None:
    """Close this process's sessions cleanly (their connections, and no warning about them)."""
    for reader in list(_readers.values()):
        if reader._session is not None and not reader._session.closed:
            try:
                asyncio.run_coroutine_threadsafe(reader._session.close(), io_loop()).result(timeout=5)
            except (RuntimeError, TimeoutError):  # the loop is gone or stuck: nothing left to tidy
                pass


lifecycle.after_fork(_forget_after_fork)
lifecycle.at_exit(_close_at_exit)
