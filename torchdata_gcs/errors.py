"""The exception tree of torchdata-gcs.

Every error derives from :class:`GCSError`; each subclass also derives from the builtin a caller
would naturally catch, so ``except FileNotFoundError`` works on a missing object. Errors carry the
``gs://`` URL they concern and the HTTP status when there was one, pickle across worker processes,
and never carry credentials or request headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "AccessDeniedError",
    "ComposeFallbackWarning",
    "GCSError",
    "IntegrityError",
    "InvalidURIError",
    "MissingObjectWarning",
    "NotFoundError",
    "PreconditionFailedError",
    "TransientError",
    "UploadError",
]


class GCSError(Exception):
    """Root of every error raised by torchdata-gcs.

    Attributes:
        url: the ``gs://`` URL the error concerns, when there is one.
        status: the HTTP status GCS answered, when there was one.
    """

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotFoundError(GCSError, FileNotFoundError):
    """The bucket or object does not exist (HTTP 404)."""


class AccessDeniedError(GCSError, PermissionError):
    """The credentials may not do this (HTTP 401 or 403)."""


class PreconditionFailedError(GCSError, FileExistsError):
    """A generation or metageneration precondition did not hold (HTTP 412)."""


class InvalidURIError(GCSError, ValueError):
    """A URL, bucket name or object name that GCS would not accept."""


class TransientError(GCSError, ConnectionError):
    """GCS kept failing with retryable errors (429, 5xx, resets, timeouts) until retries ran out.

    Attributes:
        retry_after: seconds GCS asked the client to wait (``Retry-After``), when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, url=url, status=status)
        self.retry_after = retry_after


class IntegrityError(GCSError, OSError):
    """Bytes damaged on the way: a download that does not match the size or crc32c GCS recorded for
    the object, or an upload GCS refused because its body did not match the checksum sent with it."""


class UploadError(GCSError, OSError):
    """A write failed and was aborted: nothing was published (the object, if it existed, is unchanged)."""


class MissingObjectWarning(UserWarning):
    """An object was skipped because it no longer exists and the caller asked to skip it."""


class ComposeFallbackWarning(UserWarning):
    """Objects are loaded one by one because composites cannot be used (permissions) or kept ones
    are not reused (input order)."""


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


@contextmanager
def library_errors_first() -> Iterator[None]:
    """Raise the library's own error when a serializer reports it as one of its own.

    ``torch.save`` turns a failed write into ``RuntimeError: [enforce fail at inline_container.cc]``
    with the write's ``GCSError`` only in its ``__context__``, where ``except GCSError`` cannot see it;
    this raises that ``GCSError`` instead, caused by the serializer's error.
    """
    try:
        yield
    except Exception as exc:
        ours = _first_gcs_error(exc)
        if ours is None or ours is exc:
            raise
        exc.__context__ = exc.__cause__ = None  # ``ours`` is raised caused by ``exc``: no cycle back
        raise ours from exc


def _first_gcs_error(exc: BaseException) -> GCSError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, GCSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
