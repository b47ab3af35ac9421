"""The one HTTP stack: a process's session per ``ClientConfig``, on the process's I/O loop, over a
:class:`~.transport.Transport` (aiohttp's unless one is given).

Every request goes out here (listing, metadata, reads, writes, compose, delete), with the endpoint,
credentials and user project the configuration names. A session is never pickled (DataPipes pickle
their ``ClientConfig``; each process builds its own) and is built anew after fork. Object bytes are
the stored ones (``Accept-Encoding: gzip`` on media reads and no decompression), so checksums apply;
every other answer is asked for uncompressed.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import logging
import os
import platform
import re
import ssl
import threading
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, quote_plus, urlencode

import google.auth.credentials
import google.auth.exceptions
import google.auth.transport.requests
import requests.exceptions

from ..config import ClientConfig
from ..errors import AccessDeniedError, EndpointError
from . import lifecycle
from .aio import AiohttpTransport
from .endpoint import proxy_for, trusted_certificates, verify_failure
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
from .loop import run
from .throttle import Throttle
from .transport import Body, Response, Transport
from .wire import WireTransport

__all__ = ["API_CLIENT", "USER_AGENT", "Destination", "Session", "media_url", "session_for"]

logger = logging.getLogger(__name__)

USER_AGENT = f"torchdata-gcs/{importlib.metadata.version('torchdata-gcs')}"
"""How every request names its client (GCS's request logs show it)."""

GZIP_USER_AGENT = f"{USER_AGENT} (gzip)"
"""The ``User-Agent`` sent: Google's APIs compress an answer only for a client whose agent names gzip and
that sends ``Accept-Encoding: gzip``, as JSON metadata reads do (see :meth:`Session.json_answer`)."""

API_CLIENT = f"gl-python/{platform.python_version()} {USER_AGENT}"
"""The ``x-goog-api-client`` header, as Google's own clients send it: the language and its version, then
the library and its version (Google counts requests by client library from it)."""


_GZIP = {"Accept-Encoding": "gzip"}  # a media read's headers (never changed): no dict made per read


@functools.lru_cache(maxsize=1024)
def _encoded(text: str, plus: bool = False) -> str:
    """``text`` percent-encoded whole (with ``plus``, as a query's key or value: a space as ``+``); remembered,
    since every request names the same few buckets and parameters."""
    return quote_plus(text, safe="") if plus else quote(text, safe="")


def media_url(endpoint: str, bucket: str, name: str) -> str:
    """JSON API URL of an object's bytes on ``endpoint`` (add ``?alt=media``); bucket and name percent-encoded
    whole, ``/`` included, as GCS's JSON API asks."""
    return f"{endpoint}/download/storage/v1/b/{_encoded(bucket)}/o/{quote(name, safe='')}"


@functools.lru_cache(maxsize=1024)
def _text_parameter(key: str, value: str) -> str:
    return f"{_encoded(key, plus=True)}={_encoded(value, plus=True)}"


def _parameter(key: str, value: Any) -> str:
    if value is None:
        return _encoded(key)
    if type(value) is str:
        return _text_parameter(key, value)
    if type(value) is int:  # digits and a sign need no encoding
        return f"{_encoded(key, plus=True)}={value}"
    return urlencode({key: value})


def query_string(params: dict[str, Any]) -> str:
    """``params`` as a query string, each as ``urlencode`` writes it; a key whose value is ``None`` goes bare, as
    the XML API documents ``?uploads`` (not ``?uploads=``).

    >>> query_string({"alt": "media", "generation": 7, "prefix": "a b/", "uploads": None})
    'alt=media&generation=7&prefix=a+b%2F&uploads'
    """
    return "&".join([_parameter(key, value) for key, value in params.items()])


@dataclass(frozen=True)
class Destination:
    """Where a client's requests go, resolved once, when the client is made: its settings, the endpoint
    they name (``ClientConfig.endpoint``, else ``STORAGE_EMULATOR_HOST``, else GCS), whether that is an
    emulator, and the transport that carries them (``None``: the library's own). A process has one session
    per destination; a destination pickles as it is (a transport only if it pickles: the library's never do)."""

    config: ClientConfig
    endpoint: str
    emulator: bool
    transport: Transport | None = None

    @classmethod
    def of(cls, config: ClientConfig, transport: Transport | None = None) -> Destination:
        """Where ``config`` sends requests from this process now, over ``transport`` if given."""
        endpoint, emulator = resolve_endpoint(config)
        return cls(config, endpoint, emulator, transport)

    def without_transport(self) -> Destination:
        """The same endpoint, reached over the library's own transport (what a reaper process uses)."""
        return replace(self, transport=None)


class Session:
    """One process's connections, credentials and 429 throttle for one :class:`Destination`; lives on the
    I/O loop. Its :class:`Throttle` is shared by every loader and writer of the process that uses
    this destination. Requests go out through its transport (aiohttp's unless one is given); media reads
    through :attr:`media`, the wire transport (:mod:`.wire`) unless a proxy is configured for the endpoint
    or a transport is given."""

    def __init__(self, destination: Destination) -> None:
        config, transport = destination.config, destination.transport
        self.destination, self.config = destination, config
        self.endpoint, is_emulator = destination.endpoint, destination.emulator
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
        # Media reads and JSON metadata reads ask for gzip instead: see read_media, json_answer.
        defaults = {"Accept-Encoding": "identity", "User-Agent": GZIP_USER_AGENT, "x-goog-api-client": API_CLIENT}
        reach = (config, self.endpoint, defaults, Unanswered, _where_the_endpoint_comes_from(destination))
        trust = _trust(self.endpoint) if transport is None else (None, "")
        self.transport: Transport = transport or AiohttpTransport(*reach, trust)
        self._defaults = None if transport is None else defaults  # the library's own transports send them
        # Media reads land in the reader's buffers (see .wire); through a proxy, aiohttp takes them too.
        self.media: Transport = (
            self.transport
            if transport is not None or proxy_for(self.endpoint) is not None
            else WireTransport(*reach, trust)
        )
        self.sent = False  # whether a request went out (there is something to close)

    def __repr__(self) -> str:
        return f"Session(endpoint={self.endpoint!r})"

    def __reduce__(self) -> Any:
        raise TypeError("a Session holds live connections and credentials; pickle its Destination instead")

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
    ) -> AbstractAsyncContextManager[Response]:
        """GET the object's bytes at media ``path`` as stored (gzip-encoded ones too, which the
        checksums cover); a non-2xx answer raises its typed error naming ``url``."""
        return self.send("GET", url, path, params, {**_GZIP, **headers} if headers else _GZIP, media=True)

    def send(
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
        media: bool = False,
    ) -> AbstractAsyncContextManager[Response]:
        """Send ``method`` to ``path`` of the JSON API (the XML API if ``xml_api``), with a ``json`` or
        ``data`` body if given (bytes, or pieces sent one after the other, never joined); a non-2xx
        answer raises its typed error naming ``url``. With ``answer_timeout``, the whole exchange may
        take that many seconds, and the read timeout does not apply. A ``media`` request (no body) goes
        out through the media transport."""
        params, headers = self.billed(params, headers, xml_api=xml_api)
        if self._defaults is not None:
            headers = {**self._defaults, **headers} if headers else self._defaults
        target = f"{path}?{query_string(params)}" if params else path
        transport = self.media if media else self.transport
        return _Sent(self, transport, method, url, target, headers, json, data, answer_timeout)

    @staticmethod
    async def json_answer(response: Response, url: str, required: Sequence[str] = ()) -> Any:
        """The answer's JSON document (see :func:`http.json_answer`), gzip-compressed or not."""
        body = await response.read()
        if response.headers.get("Content-Encoding", "").strip().lower() == "gzip":
            body = gunzipped(body, url, response.status)
        return json_answer(body, url, response.status, response.headers.get("Content-Type"), required)

    async def close(self) -> None:
        await self.transport.close()
        if self.media is not self.transport:
            await self.media.close()


def _trust(endpoint: str) -> tuple[ssl.SSLContext | None, str]:
    """The certificates an https ``endpoint`` is checked against and where to add one; none for http."""
    if not endpoint.startswith("https://"):
        return None, ""
    try:
        return trusted_certificates()
    except ValueError as exc:
        raise EndpointError(str(exc)) from None


class _Sent:
    """One :meth:`Session.send` as an async context manager whose value is a 2xx answer (any other raises its
    typed error, the answer released). A class, not a generator-based manager: it holds no coroutine frame
    while the answer is read, and small requests, hundreds in flight, allocate less."""

    __slots__ = (
        "_answer_timeout",
        "_data",
        "_exchange",
        "_headers",
        "_json",
        "_method",
        "_session",
        "_target",
        "_transport",
        "_url",
    )

    def __init__(
        self,
        session: Session,
        transport: Transport,
        method: str,
        url: str,
        target: str,
        headers: dict[str, str] | None,
        json: Any,
        data: Body | None,
        answer_timeout: float | None,
    ) -> None:
        self._session, self._method, self._url, self._target, self._headers = session, method, url, target, headers
        self._transport = transport
        self._json, self._data, self._answer_timeout = json, data, answer_timeout
        self._exchange: AbstractAsyncContextManager[Response] | None = None

    async def __aenter__(self) -> Response:
        session, url, headers = self._session, self._url, self._headers
        session.sent = True
        if session.credentials:
            headers = {**(await session._headers(url)), **(headers or {})}
        exchange = self._exchange = self._transport.request(
            self._method,
            self._target,
            headers,
            url=url,
            json=self._json,
            data=self._data,
            answer_timeout=self._answer_timeout,
        )
        response = await exchange.__aenter__()
        if response.status < 400:
            return response
        try:
            text = (await response.read()).decode("utf-8", errors="replace")
            error = error_for_status(
                response.status,
                url,
                error_detail(text),
                retry_after=retry_after_seconds(response.headers.get("Retry-After")),
            )
        except BaseException as exc:  # the error body could not be read: that failure, the answer released
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await self.__aexit__(type(error), error, None)  # releases the answer
        raise error

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            await exchange.__aexit__(exc_type, exc, tb)


def _where_the_endpoint_comes_from(destination: Destination) -> str:
    """What to check when the endpoint cannot be reached: where it was named."""
    if destination.config.endpoint:
        given = "ClientConfig(endpoint=...), or the command line's --endpoint"
        return f"check the endpoint given ({given}; it takes precedence over {EMULATOR_ENV})"
    if destination.emulator:
        return f"check {EMULATOR_ENV} (or pass ClientConfig(endpoint=...))"
    return f"check the network and proxy settings (neither ClientConfig(endpoint=...) nor {EMULATOR_ENV} is set)"


def _untrusted_token_endpoint(exc: google.auth.exceptions.TransportError) -> EndpointError | None:
    """The ``EndpointError`` for a token endpoint whose certificate failed verification, else ``None``."""
    cause = exc.__cause__ or (exc.args[0] if exc.args else None)
    if not isinstance(cause, requests.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" not in str(cause):
        return None
    request_url = getattr(cause.request, "url", None) or "the token endpoint"
    token_endpoint = re.sub(r"^(https://[^/]+).*$", r"\1", request_url)
    return EndpointError(
        f"cannot trust the token endpoint {token_endpoint}: its TLS certificate failed verification "
        f"({verify_failure(str(cause))}); if a proxy or firewall on the way intercepts TLS, add its CA "
        "certificate to the bundle that REQUESTS_CA_BUNDLE names (tokens are fetched through requests)",
        url=token_endpoint,
    )


_lock = threading.Lock()
_sessions: dict[Destination, Session] = {}
_inherited: list[Session] = []  # a forked child's copies of its parent's sessions: never used, never collected


def session_for(destination: Destination | ClientConfig) -> Session:
    """This process's session for ``destination`` (created on first use, anew after fork); a bare
    ``ClientConfig`` is resolved to its destination now."""
    if not isinstance(destination, Destination):
        destination = Destination.of(destination)
    session = _sessions.get(destination)  # a dict read is atomic: the lock only guards creation
    if session is not None:
        return session
    with _lock:
        session = _sessions.get(destination)
        if session is None:
            session = _sessions[destination] = Session(destination)
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
        if not session.sent:
            continue
        try:
            run(session.close(), timeout=5)
        except (RuntimeError, TimeoutError):  # the loop is gone or stuck: nothing left to tidy
            pass
