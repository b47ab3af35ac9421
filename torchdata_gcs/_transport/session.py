"""The one HTTP stack: a process's aiohttp session per ``ClientConfig``, on the process's I/O loop.

Every request goes out here (listing, metadata, reads, writes, compose, delete), with the endpoint,
credentials and user project the configuration names. A session is never pickled (DataPipes pickle
their ``ClientConfig``; each process builds its own) and is built anew after fork. Object bytes are
the stored ones (``Accept-Encoding: gzip`` on media reads and no decompression), so checksums apply;
every other answer is asked for uncompressed. A connection that fails says why in one line: an
endpoint that cannot be trusted or, before it has ever answered, reached is an ``EndpointError``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import io
import logging
import os
import platform
import re
import ssl
import threading
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import google.auth.credentials
import google.auth.exceptions
import google.auth.transport.requests
import requests.exceptions
import yarl

from ..config import ClientConfig
from ..errors import AccessDeniedError, EndpointError, TransientError
from . import lifecycle
from .http import (
    EMULATOR_ENV,
    Unanswered,
    credentials_for,
    error_detail,
    error_for_status,
    gunzipped,
    json_answer,
    resolve_endpoint,
    retry_after_seconds,
)
from .loop import io_loop
from .throttle import Throttle

__all__ = ["API_CLIENT", "USER_AGENT", "Body", "Session", "media_url", "session_for"]

logger = logging.getLogger(__name__)

USER_AGENT = f"torchdata-gcs/{importlib.metadata.version('torchdata-gcs')}"
"""How every request names its client (GCS's request logs show it)."""

GZIP_USER_AGENT = f"{USER_AGENT} (gzip)"
"""The ``User-Agent`` sent: Google's APIs compress an answer only for a client whose agent names gzip and
that sends ``Accept-Encoding: gzip``, as JSON metadata reads do (see :meth:`Session.json_answer`)."""

API_CLIENT = f"gl-python/{platform.python_version()} {USER_AGENT}"
"""The ``x-goog-api-client`` header, as Google's own clients send it: the language and its version, then
the library and its version (Google counts requests by client library from it)."""


def media_url(endpoint: str, bucket: str, name: str) -> str:
    """JSON API URL of an object's bytes on ``endpoint`` (add ``?alt=media``); bucket and name percent-encoded
    whole, ``/`` included, as GCS's JSON API asks."""
    return f"{endpoint}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"


def query_string(params: dict[str, Any]) -> str:
    """``params`` as a query string; a key whose value is ``None`` goes bare, as the XML API documents
    ``?uploads`` (not ``?uploads=``)."""
    return "&".join(quote(key, safe="") if value is None else urlencode({key: value}) for key, value in params.items())


class Session:
    """One process's connections, credentials and 429 throttle for one ``ClientConfig``; lives on the
    I/O loop. Its :class:`Throttle` is shared by every loader and writer of the process that uses
    this configuration."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.endpoint, is_emulator = resolve_endpoint(config)
        if (config.credentials_file or config.credentials) and config.anonymous is None and is_emulator:
            raise ValueError(
                f"credentials are given, but requests to {self.endpoint} go out anonymous unless "
                "ClientConfig(anonymous=False) says otherwise: set it to send the credentials there, or drop them"
            )
        anonymous = config.anonymous if config.anonymous is not None else is_emulator
        self.credentials: google.auth.credentials.Credentials | None = None if anonymous else credentials_for(config)
        self.user_project = config.user_project
        self.throttle = Throttle()
        self._refresh_lock = threading.Lock()
        self._token_request: google.auth.transport.requests.Request | None = None
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._trusted, self._trust_hint = (
            _trusted_certificates() if self.endpoint.startswith("https://") else (None, "")
        )
        # The proxy for the endpoint, resolved once from the environment (aiohttp's trust_env
        # re-reads the environment and ~/.netrc on every request).
        endpoint = urlsplit(self.endpoint)
        proxies = urllib.request.getproxies()
        bypass = urllib.request.proxy_bypass(endpoint.hostname or "") if proxies else True
        self._proxy = None if bypass else proxies.get(endpoint.scheme)

    def __repr__(self) -> str:
        return f"Session(endpoint={self.endpoint!r})"

    def __reduce__(self) -> Any:
        raise TypeError("a Session holds live connections and credentials; pickle its ClientConfig instead")

    @property
    def anonymous(self) -> bool:
        """Whether requests go out without credentials."""
        return self.credentials is None

    def authorization(self, url: str | None = None) -> dict[str, str]:
        """Headers that authenticate a request (for ``url``, named in errors); refreshes an expired token.

        May block on the token endpoint: call it off the I/O loop when :meth:`token_is_fresh` is false.
        """
        credentials = self.credentials
        if credentials is None:
            return {}
        with self._refresh_lock:
            if not credentials.valid:
                if self._token_request is None:
                    self._token_request = google.auth.transport.requests.Request()
                try:
                    credentials.refresh(self._token_request)
                except google.auth.exceptions.RefreshError as exc:
                    raise AccessDeniedError(f"could not refresh the credentials: {exc}", url=url) from None
                except google.auth.exceptions.TransportError as exc:
                    untrusted = _untrusted_token_endpoint(exc)
                    if untrusted is None:
                        raise  # the token endpoint could not be reached: retried
                    raise untrusted from None
            return {"Authorization": f"Bearer {credentials.token}"}

    def token_is_fresh(self) -> bool:
        """Whether :meth:`authorization` answers without a network call."""
        return self.credentials is None or bool(self.credentials.valid)

    def object_path(self, bucket: str, name: str) -> str:
        """JSON API URL of an object's metadata; the name is percent-encoded whole (``/`` included)."""
        return f"{self.bucket_path(bucket)}/o/{quote(name, safe='')}"

    def media_path(self, bucket: str, name: str) -> str:
        """JSON API URL of an object's bytes."""
        return media_url(self.endpoint, bucket, name)

    def bucket_path(self, bucket: str) -> str:
        """JSON API URL of a bucket (``.../o`` lists its objects)."""
        return f"{self.endpoint}/storage/v1/b/{quote(bucket, safe='')}"

    def upload_path(self, bucket: str) -> str:
        """JSON API URL that single-request uploads to ``bucket`` go to."""
        return f"{self.endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o"

    def xml_path(self, bucket: str, name: str = "") -> str:
        """XML API URL of a bucket (``/bucket``) or an object (``/bucket/name``, encoded whole)."""
        return f"{self.endpoint}/{quote(bucket, safe='')}" + (f"/{quote(name, safe='')}" if name else "")

    def billed(
        self, params: dict[str, Any], headers: dict[str, str] | None, *, xml_api: bool
    ) -> tuple[dict[str, Any], dict[str, str] | None]:
        """``params`` and ``headers`` naming the project billed for requests to requester-pays buckets:
        the JSON API takes it as the ``userProject`` parameter, the XML API as the
        ``x-goog-user-project`` header."""
        if not self.user_project:
            return params, headers
        if xml_api:
            return params, {**(headers or {}), "x-goog-user-project": self.user_project}
        return {**params, "userProject": self.user_project}, headers

    async def _headers(self, url: str) -> dict[str, str]:
        if self.token_is_fresh():
            return self.authorization(url)
        return await asyncio.get_running_loop().run_in_executor(None, self.authorization, url)

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
        data: Body | None = None,
        xml_api: bool = False,
        answer_timeout: float | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send ``method`` to ``path`` of the JSON API (the XML API if ``xml_api``), with a ``json`` or
        ``data`` body if given (bytes, or pieces sent one after the other, never joined); a non-2xx
        answer raises its typed error naming ``url``. With ``answer_timeout``, the whole exchange may
        take that many seconds, and the read timeout does not apply."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, ssl=self._trusted or True),
                timeout=self._timeout,
                auto_decompress=False,
                # Media reads and JSON metadata reads ask for gzip instead: see read_media, json_answer.
                headers={"Accept-Encoding": "identity", "User-Agent": GZIP_USER_AGENT, "x-goog-api-client": API_CLIENT},
            )
        params, headers = self.billed(params, headers, xml_api=xml_api)
        body: Any = None
        if isinstance(data, bytes):
            body = io.BytesIO(data)  # shares the bytes; aiohttp streams it
        elif data is not None:
            pieces = [
                memoryview(piece).cast("B") for piece in ([data] if isinstance(data, (bytearray, memoryview)) else data)
            ]
            headers = {**(headers or {}), "Content-Length": str(sum(map(len, pieces)))}
            body = _streamed(pieces)
        request_headers = {**(await self._headers(url)), **(headers or {})} if self.credentials else headers
        # The path is percent-encoded already: yarl need not parse and encode it again.
        target = yarl.URL(f"{path}?{query_string(params)}" if params else path, encoded=True)
        try:
            async with self._session.request(
                method,
                target,
                headers=request_headers,
                proxy=self._proxy,
                json=json,
                data=body,
                timeout=self._timeout
                if answer_timeout is None
                else aiohttp.ClientTimeout(
                    total=answer_timeout, sock_connect=self.config.connect_timeout, sock_read=answer_timeout
                ),
            ) as response:
                _answered.add(self.endpoint)
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
        except aiohttp.ClientConnectorError as exc:
            failure = self._connection_failure(exc)
            if failure is None:
                raise  # the endpoint has answered before: a blip, retried as any network fault
            raise failure from None

    def _connection_failure(self, exc: aiohttp.ClientConnectorError) -> Exception | None:
        """What a connection that could not be made means. A certificate that fails verification is an
        ``EndpointError`` at once (no new attempt trusts it); a refused connection, a host that does not
        resolve or a failed handshake is one after a few seconds (:class:`Unanswered`) while the endpoint has
        never answered in this process; after that, ``None``: a network fault, retried."""
        proxied = isinstance(exc, aiohttp.ClientProxyConnectionError)
        where = f"the proxy {self._proxy} for {self.endpoint}" if proxied else self.endpoint
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return EndpointError(
                f"cannot trust {where}: its TLS certificate failed verification "
                f"({_verify_failure(str(exc.certificate_error))}); if a proxy or firewall on the way intercepts TLS, "
                f"{self._trust_hint}",
                url=self.endpoint,
            )
        if self.endpoint in _answered:
            return None
        if isinstance(exc, aiohttp.ClientConnectorDNSError):
            cause = f"host name {exc.host!r} does not resolve"
        elif isinstance(exc, aiohttp.ClientSSLError):
            cause = f"the TLS handshake failed ({exc.os_error})"
        elif exc.os_error.errno:
            cause = os.strerror(exc.os_error.errno).lower()  # "connection refused", "no route to host"
        else:
            cause = str(exc.os_error) or type(exc.os_error).__name__
        check = "check HTTP_PROXY, HTTPS_PROXY and NO_PROXY" if proxied else self._where_the_endpoint_comes_from()
        return Unanswered(EndpointError(f"cannot reach {where}: {cause}; {check}", url=self.endpoint))

    def _where_the_endpoint_comes_from(self) -> str:
        if self.config.endpoint:
            return f"check ClientConfig(endpoint=...) (it takes precedence over {EMULATOR_ENV})"
        if os.environ.get(EMULATOR_ENV):
            return f"check {EMULATOR_ENV} (or pass ClientConfig(endpoint=...))"
        return f"check the network and proxy settings (neither ClientConfig(endpoint=...) nor {EMULATOR_ENV} is set)"

    @staticmethod
    async def json_answer(response: aiohttp.ClientResponse, url: str, required: Sequence[str] = ()) -> Any:
        """The answer's JSON document (see :func:`http.json_answer`), gzip-compressed or not."""
        body = await response.read()
        if response.headers.get("Content-Encoding", "").strip().lower() == "gzip":
            body = gunzipped(body, url, response.status)
        return json_answer(body, url, response.status, response.headers.get("Content-Type"), required)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


_answered: set[str] = set()
"""Endpoints that have answered in this process, or in the parent it was forked from: their refused
connections are network faults, retried, not a wrong endpoint."""

_BUNDLE_ENVS = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def _trusted_certificates() -> tuple[ssl.SSLContext, str]:
    """The certificates an https endpoint is checked against, and where to add one: the bundle that
    ``REQUESTS_CA_BUNDLE`` (else ``CURL_CA_BUNDLE``) names, as requests, and so the official client, take
    it; else the system's, where ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` point when the session is made."""
    named = next((name for name in _BUNDLE_ENVS if os.environ.get(name)), None)
    if named is None:
        hint = "add its CA certificate to the bundle that SSL_CERT_FILE names, or name one in REQUESTS_CA_BUNDLE"
        return ssl.create_default_context(), hint
    bundle = os.environ[named]
    order = "" if named == "REQUESTS_CA_BUNDLE" else "; REQUESTS_CA_BUNDLE, over both"
    hint = f"add its CA certificate to {bundle}, which {named} names (it takes precedence over SSL_CERT_FILE{order})"
    try:
        if os.path.isdir(bundle):
            return ssl.create_default_context(capath=bundle), hint
        return ssl.create_default_context(cafile=bundle), hint
    except (OSError, ssl.SSLError) as exc:
        raise EndpointError(f"the CA bundle {bundle}, which {named} names, cannot be used: {exc}") from None


def _verify_failure(text: str) -> str:
    """OpenSSL's reason in a verification error's text (``self-signed certificate``...), else the text."""
    match = re.search(r"certificate verify failed: ([^(]+?)\s*\(", text)
    return match.group(1) if match else text


def _untrusted_token_endpoint(exc: google.auth.exceptions.TransportError) -> EndpointError | None:
    """The ``EndpointError`` for a token endpoint whose certificate failed verification, else ``None``."""
    cause = exc.__cause__ or (exc.args[0] if exc.args else None)
    if not isinstance(cause, requests.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" not in str(cause):
        return None
    request_url = getattr(cause.request, "url", None) or "the token endpoint"
    token_endpoint = re.sub(r"^(https://[^/]+).*$", r"\1", request_url)
    return EndpointError(
        f"cannot trust the token endpoint {token_endpoint}: its TLS certificate failed verification "
        f"({_verify_failure(str(cause))}); if a proxy or firewall on the way intercepts TLS, add its CA "
        "certificate to the bundle that REQUESTS_CA_BUNDLE names (tokens are fetched through requests)",
        url=token_endpoint,
    )


Body = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]
"""A request body: bytes, or pieces sent in order without being joined."""

STREAM_SLICE = 128 * 1024
"""Body pieces go out in slices of at most this size: no single write holds up the I/O loop, and what a
connection's transport copies aside when the socket takes only part of a write stays small (with 1 MiB
slices, 8 uploads in flight held about 6 MiB more)."""


async def _streamed(pieces: Sequence[memoryview]) -> AsyncIterator[memoryview]:
    """The pieces of a body as slices, for aiohttp to send (a new generator for each attempt)."""
    for piece in pieces:
        for start in range(0, len(piece), STREAM_SLICE):
            yield piece[start : start + STREAM_SLICE]


_lock = threading.Lock()
_sessions: dict[tuple[ClientConfig, str | None], Session] = {}
_inherited: list[Session] = []  # a forked child's copies of its parent's sessions: never used, never collected


def session_for(config: ClientConfig) -> Session:
    """This process's session for ``config`` (created on first use, anew after fork; the emulator
    variable is part of the key, as a configuration without an endpoint follows it)."""
    key = (config, os.environ.get(EMULATOR_ENV))
    session = _sessions.get(key)  # a dict read is atomic: the lock only guards creation
    if session is not None:
        return session
    with _lock:
        session = _sessions.get(key)
        if session is None:
            session = _sessions[key] = Session(config)
            lifecycle.after_fork(_forget_after_fork)
            lifecycle.at_exit(_close_at_exit)
            logger.debug("created %r in process %d", session, os.getpid())
        return session


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _inherited.extend(_sessions.values())  # their connections belong to the parent's loop
    _sessions.clear()


def _close_at_exit() -> None:
    """Close this process's sessions cleanly (their connections, and no warning about them)."""
    for session in list(_sessions.values()):
        if session._session is None:
            continue
        try:
            asyncio.run_coroutine_threadsafe(session.close(), io_loop()).result(timeout=5)
        except (RuntimeError, TimeoutError):  # the loop is gone or stuck: nothing left to tidy
            pass
