"""The per-process HTTP transport to GCS's JSON API.

Endpoint and credentials are resolved here, lazily, once per process and configuration; the
transport is never pickled (DataPipes pickle their ``ClientConfig`` and each worker builds its own
transport). Non-2xx answers become typed errors through ``errors.error_for_status``.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.auth.transport.requests
import google.oauth2.credentials
import google.oauth2.service_account
import requests
from google.auth.transport.requests import AuthorizedSession
from requests.adapters import HTTPAdapter

from ..config import ClientConfig
from ..errors import (
    AccessDeniedError,
    GCSError,
    IntegrityError,
    NotFoundError,
    PreconditionFailedError,
    TransientError,
)
from . import lifecycle

logger = logging.getLogger(__name__)

GCS_ENDPOINT = "https://storage.googleapis.com"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
_POOL_SIZE = 1024  # upper bound of TransferConfig.max_in_flight; urllib3 opens connections lazily


def resolve_endpoint(config: ClientConfig) -> tuple[str, bool]:
    """Return ``(base_url, is_emulator)``: the explicit endpoint, else the emulator env, else GCS."""
    if config.endpoint:
        return config.endpoint.rstrip("/"), config.endpoint.startswith("http://")
    emulator = os.environ.get(EMULATOR_ENV)
    if emulator:
        url = emulator if "://" in emulator else f"http://{emulator}"
        return url.rstrip("/"), True
    return GCS_ENDPOINT, False


def _credentials_from_file(path: str) -> google.auth.credentials.Credentials:
    """Load a service-account or authorized-user key file; other kinds belong in ADC."""
    try:
        with open(path, encoding="utf-8") as file:
            kind = json.load(file).get("type")
    except (OSError, ValueError, AttributeError) as exc:
        raise google.auth.exceptions.DefaultCredentialsError(f"cannot read {path}: {exc}") from None
    if kind == "service_account":
        return google.oauth2.service_account.Credentials.from_service_account_file(path, scopes=SCOPES)
    if kind == "authorized_user":
        return google.oauth2.credentials.Credentials.from_authorized_user_file(path, scopes=SCOPES)
    raise google.auth.exceptions.DefaultCredentialsError(
        f"{path} holds {kind!r} credentials; only service_account and authorized_user files are "
        "accepted here (use GOOGLE_APPLICATION_CREDENTIALS for other kinds)"
    )


def _credentials(config: ClientConfig) -> google.auth.credentials.Credentials:
    """The configured key file's credentials, else Application Default Credentials."""
    try:
        if config.credentials_file:
            return _credentials_from_file(config.credentials_file)
        credentials, _ = google.auth.default(scopes=SCOPES)
    except (google.auth.exceptions.DefaultCredentialsError, ValueError) as exc:
        source = config.credentials_file or "Application Default Credentials"
        raise AccessDeniedError(
            f"no usable Google credentials from {source} ({exc}): run `gcloud auth application-default "
            "login`, set GOOGLE_APPLICATION_CREDENTIALS, or point STORAGE_EMULATOR_HOST at an emulator"
        ) from None
    return credentials


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_detail(text: str) -> str:
    """The message of a GCS error body: JSON API ``{"error": {"message"}}``, XML API
    ``<Error><Code/><Message/></Error>`` as ``"Code: Message"``, or the start of any other body.

    >>> error_detail('<?xml version="1.0"?><Error><Code>BadDigest</Code><Message>No match.</Message></Error>')
    'BadDigest: No match.'
    """
    try:
        return str(json.loads(text)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        pass
    if text.lstrip().startswith("<"):
        try:
            root = ElementTree.fromstring(text)
        except ElementTree.ParseError:
            pass
        else:
            code, message = root.findtext("Code"), root.findtext("Message")
            if code:
                return f"{code}: {message or ''}".strip()[:300]
    return text.strip()[:300]


class Transport:
    """One process's connection pool and credentials for one ``ClientConfig``."""

    def __init__(self, config: ClientConfig) -> None:
        self.endpoint, is_emulator = resolve_endpoint(config)
        anonymous = config.anonymous if config.anonymous is not None else is_emulator
        # Anonymous requests go out bare: an AuthorizedSession would try to "refresh" on a 401.
        self._session = requests.Session() if anonymous else AuthorizedSession(_credentials(config))
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=_POOL_SIZE, max_retries=0)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        # Resolve proxy and CA-bundle variables once: requests re-reads the whole environment on
        # every request otherwise, a quarter of the client's time per small object.
        settings = self._session.merge_environment_settings(self.endpoint, {}, None, None, None)
        self._session.proxies, self._session.verify = settings["proxies"], settings["verify"]
        self._session.trust_env = False
        self._user_project = config.user_project
        self._refresh_lock = threading.Lock()
        self._timeout = (config.connect_timeout, config.read_timeout)

    def __repr__(self) -> str:
        return f"Transport(endpoint={self.endpoint!r})"

    @property
    def user_project(self) -> str | None:
        return self._user_project

    @property
    def credentials(self) -> google.auth.credentials.Credentials | None:
        """The credentials requests are signed with; ``None`` when they go out anonymous."""
        return getattr(self._session, "credentials", None)

    @property
    def anonymous(self) -> bool:
        """Whether requests go out without credentials."""
        return self.credentials is None

    def authorization(self) -> dict[str, str]:
        """Headers that authenticate a request sent outside this session; refreshes an expired token.

        May block on the token endpoint: call it off the I/O loop when :meth:`token_is_fresh` is false.
        """
        credentials = self.credentials
        if credentials is None:
            return {}
        with self._refresh_lock:
            if not credentials.valid:
                try:
                    credentials.refresh(google.auth.transport.requests.Request(self._session))
                except google.auth.exceptions.RefreshError as exc:
                    raise AccessDeniedError(f"could not refresh the credentials: {exc}") from None
            return {"Authorization": f"Bearer {credentials.token}"}

    def token_is_fresh(self) -> bool:
        """Whether :meth:`authorization` answers without a network call."""
        credentials = getattr(self._session, "credentials", None)
        return credentials is None or bool(credentials.valid)

    def __reduce__(self) -> Any:
        raise TypeError("a Transport holds live connections and credentials; pickle its ClientConfig instead")

    def object_path(self, bucket: str, name: str, *, media: bool = False) -> str:
        """JSON API path of an object; the name is percent-encoded whole (``/`` included)."""
        prefix = "/download" if media else ""
        return f"{prefix}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    def bucket_objects_path(self, bucket: str) -> str:
        return f"/storage/v1/b/{quote(bucket, safe='')}/o"

    def xml_path(self, bucket: str, name: str = "") -> str:
        """XML API path of a bucket (``/bucket``) or an object (``/bucket/name``, encoded whole)."""
        return f"/{quote(bucket, safe='')}" + (f"/{quote(name, safe='')}" if name else "")

    def billed(
        self, params: dict[str, Any], headers: dict[str, str] | None, *, xml_api: bool
    ) -> tuple[dict[str, Any], dict[str, str] | None]:
        """``params`` and ``headers`` naming the project billed for requests to requester-pays buckets:
        the JSON API takes it as the ``userProject`` parameter, the XML API as the
        ``x-goog-user-project`` header."""
        if not self._user_project:
            return params, headers
        if xml_api:
            return params, {**(headers or {}), "x-goog-user-project": self._user_project}
        return {**params, "userProject": self._user_project}, headers

    def request(
        self,
        method: str,
        path: str,
        *,
        url: str,
        params: dict[str, Any] | None = None,
        stream: bool = False,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        xml_api: bool = False,
    ) -> requests.Response:
        """Send one request (to the XML API if ``xml_api``, else the JSON API); raise the typed error
        for any non-2xx answer (``url`` names the object)."""
        params, headers = self.billed(dict(params or {}), headers, xml_api=xml_api)
        try:
            response = self._session.request(
                method, self.endpoint + path, params=params, data=data, headers=headers, stream=stream, timeout=self._timeout
            )
        except google.auth.exceptions.RefreshError as exc:
            raise AccessDeniedError(f"could not refresh the credentials for {url}: {exc}", url=url) from None
        if response.status_code >= 400:
            with response:
                raise error_for_status(
                    response.status_code,
                    url,
                    error_detail(response.text),
                    retry_after=retry_after_seconds(response.headers.get("Retry-After")),
                )
        return response

    def get_json(self, path: str, *, url: str, params: dict[str, Any] | None = None) -> Any:
        with self.request("GET", path, url=url, params=params) as response:
            return json_answer(response.content, url, response.status_code, response.headers.get("Content-Type"))


def json_answer(body: bytes, url: str, status: int, content_type: str | None, required: Sequence[str] = ()) -> Any:
    """The JSON document of a 2xx answer, with the ``required`` fields; anything else (a proxy's or a
    captive portal's page, a cut answer) raises ``TransientError``, so it is retried."""
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    missing = [field for field in required if not isinstance(document, dict) or field not in document]
    if document is None or missing:
        problem = f"lacks {', '.join(missing)}" if document is not None else "is not JSON"
        raise TransientError(
            f"{url}: the answer (status {status}, {content_type or 'no content type'}, {len(body)} bytes) {problem}",
            url=url,
            status=status,
        )
    return document


_lock = threading.Lock()
_transports: dict[tuple[ClientConfig, str | None], Transport] = {}


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _transports.clear()


lifecycle.after_fork(_forget_after_fork)


def transport_for(config: ClientConfig) -> Transport:
    """This process's transport for ``config``, created on first use (after fork, anew)."""
    key = (config, os.environ.get(EMULATOR_ENV))
    with _lock:
        transport = _transports.get(key)
        if transport is None:
            transport = _transports[key] = Transport(config)
            logger.debug("created %r in process %d", transport, os.getpid())
        return transport


RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses GCS documents as safe to retry with backoff."""


DIGEST_MISMATCHES = ("BadDigest", "InvalidDigest", "CrcMismatch", "Provided CRC32C", "Provided MD5")
"""How GCS's 400 answers begin when a request body does not match the checksum sent with it: the
XML API's error codes (as ``"Code: Message"``) and the JSON API's messages."""


def error_for_status(status: int, url: str | None, detail: str, *, retry_after: float | None = None) -> GCSError:
    """Turn an HTTP status GCS answered into the matching error; the one translation point."""
    where = f" ({url})" if url else ""
    message = f"GCS answered {status}{where}: {detail}" if detail else f"GCS answered {status}{where}"
    if status == 404:
        return NotFoundError(message, url=url, status=status)
    if status in (401, 403):
        return AccessDeniedError(message, url=url, status=status)
    if status == 412:
        return PreconditionFailedError(message, url=url, status=status)
    if status == 400 and detail.startswith(DIGEST_MISMATCHES):  # damaged on the way: a new attempt may cure it
        return IntegrityError(message, url=url, status=status)
    if status in RETRYABLE_STATUSES:
        return TransientError(message, url=url, status=status, retry_after=retry_after)
    return GCSError(message, url=url, status=status)
