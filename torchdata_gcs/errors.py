"""The exception tree of torchdata-gcs, every exception and warning it raises:

    Exception
    └── GCSError                                   .url, .status
        ├── NotFoundError          FileNotFoundError   404: no such bucket or object (version)
        ├── AccessDeniedError      PermissionError     401, 403: these credentials may not
        ├── PreconditionFailedError FileExistsError    412: a generation precondition did not hold
        ├── InvalidURIError        ValueError          a URL, bucket or object name GCS would refuse
        ├── TransientError         ConnectionError     429, 5xx, resets, timeouts: retries ran out
        │   └── DeadlineExceededError                  RetryConfig.deadline came first
        ├── EndpointError          ConnectionError     the endpoint cannot be reached or trusted
        ├── IntegrityError         OSError             bytes damaged on the way (size or crc32c)
        ├── UploadError            OSError             a write failed: nothing was published
        ├── ListingError                               pages that repeat or go back; ranks that cannot share one
        ├── ResumeError            ValueError          a saved state that does not fit what it is loaded into
        ├── RankFailedError                            another rank of a shared load failed or stopped
        └── NoMultipartListing                         the endpoint lists no multipart uploads
    UserWarning
    ├── MissingObjectWarning                           a missing object was skipped, as asked
    ├── ComposeFallbackWarning                         objects loaded one by one, not composed
    ├── CacheWarning                                   the local cache cannot be used: read from GCS
    └── ShardWarning                                   a bad shard skipped, as asked; an index not written

Each error also derives from the builtin a caller would naturally catch, so ``except
FileNotFoundError`` works on a missing object. Errors pickle across worker processes and never carry
credentials, request headers or payloads.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "CacheWarning",
    "ComposeFallbackWarning",
    "DeadlineExceededError",
    "EndpointError",
    "GCSError",
    "IntegrityError",
    "InvalidURIError",
    "ListingError",
    "MissingObjectWarning",
    "NoMultipartListing",
    "NotFoundError",
    "PreconditionFailedError",
    "RankFailedError",
    "ResumeError",
    "ShardWarning",
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
    """The bucket or object does not exist (HTTP 404); the message says which, and ``url`` is
    ``gs://bucket/`` when it is the bucket."""


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


class DeadlineExceededError(TransientError):
    """A request, or a call of several (a checkpoint save, an fsspec call), did not end within
    ``RetryConfig.deadline``, which bounds every attempt, every wait between them and every byte.
    (Not a ``TimeoutError``: fsspec would replace one with its own, which says nothing.)"""


class EndpointError(GCSError, ConnectionError):
    """The endpoint cannot be reached or trusted: its TLS certificate failed verification (never
    retried), or, before it has answered once in this process, the connection was refused or its host
    name does not resolve (retried for a few seconds only, then raised). ``url`` is the endpoint's."""


class IntegrityError(GCSError, OSError):
    """Bytes damaged on the way: a download that does not match the size or crc32c GCS recorded for
    the object, or an upload GCS refused because its body did not match the checksum sent with it; or
    a file torchdata-gcs wrote for itself (a shared listing's manifest) that no longer holds what it wrote."""


class UploadError(GCSError, OSError):
    """A write failed and was aborted: nothing was published (the object, if it existed, is unchanged)."""


class ListingError(GCSError):
    """A listing answered with pages GCS never sends: a page token handed out a second time, a page with
    nothing after what earlier pages listed (following them would page, and bill, forever), or names out
    of order. The listing stops; ``url`` names the prefix listed. Also: the ranks of a job that lists once
    asked for different listings, or did not meet within the process group's timeout."""


class ResumeError(GCSError, ValueError):
    """A saved state refused by ``load_state_dict``: malformed, or taken over another listing or order, where
    resuming would skip or repeat objects. The message says what differs; nothing was changed."""


class RankFailedError(GCSError):
    """A rank of a process group loading files together (once per machine) failed or stopped, so the others
    cannot finish: ``rank`` is the global rank that stopped, when it ran on this machine (else ``None``)."""

    def __init__(self, message: str, *, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class NoMultipartListing(GCSError):
    """The endpoint answered the listing of multipart uploads with something else (an emulator without
    the XML API lists objects instead)."""


class MissingObjectWarning(UserWarning):
    """An object was skipped because it no longer exists and the caller asked to skip it."""


class ComposeFallbackWarning(UserWarning):
    """Objects are loaded one by one because composites cannot be used (permissions) or kept ones
    are not reused (input order)."""


class CacheWarning(UserWarning):
    """The local cache could not be created, read or written (a full disk, no permission, locks that do not
    work on its file system, entries removed or damaged): the objects concerned are read from GCS instead."""


class ShardWarning(UserWarning):
    """A tar shard's samples were skipped because it is damaged, cut or gone and the caller asked to skip bad
    shards; or a shard's index could not be written beside it (it is made again next time)."""
