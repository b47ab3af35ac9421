"""What HTTP means to GCS here: which endpoint and credentials a ``ClientConfig`` names, how an
answer's status and body become a typed error (:func:`error_for_status`, the one translation point),
which answers are worth another attempt, and an endpoint that never answered (:class:`Unanswered`)."""

from __future__ import annotations

import email.utils
import gzip
import json
import os
import time
import zlib
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.oauth2.credentials
import google.oauth2.service_account

from ..config import ClientConfig
from ..errors import (
    AccessDeniedError,
    EndpointError,
    GCSError,
    IntegrityError,
    NotFoundError,
    PreconditionFailedError,
    TransientError,
)

GCS_ENDPOINT = "https://storage.googleapis.com"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)


class Unanswered(Exception):
    """A connection to an endpoint that has never answered in this process was refused, or its host name
    did not resolve: tried again for :data:`.retry.UNANSWERED_DELAYS` only, then :attr:`error` is raised."""

    def __init__(self, error: EndpointError) -> None:
        super().__init__(str(error))
        self.error = error


def resolve_endpoint(config: ClientConfig) -> tuple[str, bool]:
    """Return ``(base_url, is_emulator)``: the explicit endpoint, else the emulator env, else GCS."""
    if config.endpoint:
        return config.endpoint.rstrip("/"), config.endpoint.startswith("http://")
    emulator = os.environ.get(EMULATOR_ENV)
    if emulator:
        url = emulator if "://" in emulator else f"http://{emulator}"
        return url.rstrip("/"), True
    return GCS_ENDPOINT, False


def _key_file(path: str, source: str) -> dict[str, Any]:
    """The JSON document of the key file at ``path`` (named by ``source``); a file that is missing,
    unreadable or not a JSON object raises ``AccessDeniedError`` naming it and what is wrong."""

    def refused(problem: str) -> AccessDeniedError:
        return AccessDeniedError(f"credentials file {path} ({source}) {problem}")

    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except FileNotFoundError:
        raise refused("does not exist") from None
    except IsADirectoryError:
        raise refused("is a directory, not a key file") from None
    except OSError as exc:
        raise refused(f"cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # not UTF-8, or not JSON
        raise refused(f"is not a JSON key file ({exc})") from None
    if not isinstance(document, dict):
        raise refused(f"is not a JSON key file (it holds a JSON {type(document).__name__}, not an object)")
    return document


def _reason(exc: Exception) -> str:
    """google-auth's account of what went wrong, on one line (it often gives a message and a cause)."""
    return ": ".join(str(arg) for arg in exc.args).replace("\n", " ") if exc.args else type(exc).__name__


def _credentials_from_file(path: str) -> google.auth.credentials.Credentials:
    """Load a service-account or authorized-user key file; other kinds belong in ADC."""
    document = _key_file(path, "ClientConfig.credentials_file")
    kind = document.get("type")
    try:
        if kind == "service_account":
            return google.oauth2.service_account.Credentials.from_service_account_info(document, scopes=SCOPES)
        if kind == "authorized_user":
            return google.oauth2.credentials.Credentials.from_authorized_user_info(document, scopes=SCOPES)
    except ValueError as exc:  # google-auth's MalformedError: fields missing or wrong
        raise AccessDeniedError(
            f"credentials file {path} (ClientConfig.credentials_file) is not a usable {kind} key: {_reason(exc)}"
        ) from None
    holds = f"{kind!r} credentials" if kind else 'no "type" of credentials'
    raise AccessDeniedError(
        f"credentials file {path} (ClientConfig.credentials_file) holds {holds}; only service_account "
        "and authorized_user files are accepted here (GOOGLE_APPLICATION_CREDENTIALS takes the other kinds)"
    )


def credentials_for(config: ClientConfig) -> google.auth.credentials.Credentials:
    """The configured credentials object or key file's credentials, else Application Default Credentials.

    A key file that is missing or malformed (given here or named by ``GOOGLE_APPLICATION_CREDENTIALS``)
    raises ``AccessDeniedError`` naming the file and what is wrong with it."""
    if config.credentials is not None:
        return google.auth.credentials.with_scopes_if_required(config.credentials, SCOPES)
    if config.credentials_file:
        return _credentials_from_file(config.credentials_file)
    named = os.environ.get(CREDENTIALS_ENV)
    if named:
        _key_file(named, CREDENTIALS_ENV)  # google-auth's own account of these is vaguer
    try:
        credentials, _ = google.auth.default(scopes=SCOPES)
    except (google.auth.exceptions.DefaultCredentialsError, ValueError) as exc:
        if named:
            raise AccessDeniedError(
                f"credentials file {named} ({CREDENTIALS_ENV}) is not a usable key file: {_reason(exc)}"
            ) from None
        raise AccessDeniedError(
            f"no Google credentials found ({_reason(exc)}): run `gcloud auth application-default login`, set "
            f"{CREDENTIALS_ENV}, or point {EMULATOR_ENV} at an emulator"
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


def gunzipped(body: bytes, url: str, status: int) -> bytes:
    """A gzip-encoded answer's bytes; a damaged or cut one raises ``TransientError``, so it is retried."""
    try:
        return gzip.decompress(body)
    except (OSError, EOFError, zlib.error) as exc:
        raise TransientError(
            f"{url}: the gzip-encoded answer (status {status}, {len(body)} bytes) does not decompress ({exc})",
            url=url,
            status=status,
        ) from None


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


RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses GCS documents as safe to retry with backoff."""


DIGEST_MISMATCHES = ("BadDigest", "InvalidDigest", "CrcMismatch", "Provided CRC32C", "Provided MD5")
"""How GCS's 400 answers begin when a request body does not match the checksum sent with it: the
XML API's error codes (as ``"Code: Message"``) and the JSON API's messages."""


BUCKET_MISSING = ("NoSuchBucket", "The specified bucket does not exist")
"""How GCS's 404 answers say that the bucket does not exist: the XML API's code, the JSON API's message
(also the whole text of a media read's answer)."""


def missing_bucket(bucket: str, url: str | None = None) -> NotFoundError:
    """The error for a bucket that does not exist, met while asking for ``url``; its ``url`` is ``gs://bucket/``."""
    named = f"gs://{bucket}/"
    asked = f" ({url})" if url and url != named else ""
    return NotFoundError(f"bucket {bucket!r} does not exist{asked}", url=named, status=404)


def is_missing_bucket(error: BaseException) -> bool:
    """Whether ``error`` says that a bucket does not exist (as :func:`missing_bucket` makes it): a missing
    bucket is never a missing object to skip or to take as "not there yet".

    >>> is_missing_bucket(missing_bucket("b", "gs://b/x")), is_missing_bucket(NotFoundError("", url="gs://b/x"))
    (True, False)
    """
    url = getattr(error, "url", None)
    return (
        isinstance(error, NotFoundError)
        and isinstance(url, str)
        and url.startswith("gs://")
        and url.find("/", 5) == len(url) - 1
    )


def _not_found(url: str | None, detail: str, message: str) -> NotFoundError:
    """What a 404 means: GCS says whether the bucket or the object is missing (JSON API "The specified
    bucket does not exist." / "No such object: b/o", the same as a media read's text, XML API
    ``NoSuchBucket`` / ``NoSuchKey``). An answer that says neither ("Not Found", as emulators answer)
    is told as either, except for a bucket's own URL; any other answer keeps GCS's words."""
    if not url or not url.startswith("gs://"):
        return NotFoundError(message, url=url, status=404)
    bucket, _, name = url[5:].partition("/")
    if detail.startswith(BUCKET_MISSING):
        return missing_bucket(bucket, url)
    says_nothing = detail.rstrip(".").lower() in ("", "not found")
    if not name and says_nothing:
        return missing_bucket(bucket)
    if name and (detail.startswith("NoSuchKey") or detail == f"No such object: {bucket}/{name}"):
        return NotFoundError(f"object {url} does not exist", url=url, status=404)
    if name and says_nothing:
        return NotFoundError(
            f"{url} does not exist: no such object, or no bucket {bucket!r} "
            f"(GCS answered 404: {detail or 'Not Found'})",
            url=url,
            status=404,
        )
    return NotFoundError(message, url=url, status=404)


def error_for_status(status: int, url: str | None, detail: str, *, retry_after: float | None = None) -> GCSError:
    """Turn an HTTP status GCS answered into the matching error; the one translation point."""
    where = f" ({url})" if url else ""
    message = f"GCS answered {status}{where}: {detail}" if detail else f"GCS answered {status}{where}"
    if status == 404:
        return _not_found(url, detail, message)
    if status in (401, 403):
        return AccessDeniedError(message, url=url, status=status)
    if status == 412:
        return PreconditionFailedError(message, url=url, status=status)
    if status == 400 and detail.startswith(DIGEST_MISMATCHES):  # damaged on the way: a new attempt may cure it
        return IntegrityError(message, url=url, status=status)
    if status in RETRYABLE_STATUSES:
        return TransientError(message, url=url, status=status, retry_after=retry_after)
    return GCSError(message, url=url, status=status)
