"""Parse and format ``gs://bucket/name`` URLs; pure functions, no I/O.

The object name is everything after the bucket's slash, taken literally as GCS stores it: ``#``,
``?``, ``%``, ``+``, spaces, unicode and ``//`` are part of the name, never URL syntax. Percent
encoding happens only when a request is built (see ``_transport/session.py``).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import reprlib
from collections.abc import Iterable

from ..errors import InvalidURIError

SCHEMES = ("gs://", "gcs://")
MAX_OBJECT_NAME_BYTES = 1024
TEMPORARY_PREFIX = ".torchdata-gcs-tmp/"
"""Where torchdata-gcs writes short-lived objects of its own (composites); listings skip it."""

_BUCKET_CHARS = re.compile(r"[a-z0-9][a-z0-9._-]*[a-z0-9]")
_GOOGLE_LOOKALIKE = re.compile(r"g[o0][o0]g[l1]e")


def validate_bucket(bucket: str) -> str:
    """Return ``bucket`` if it follows GCS's bucket naming rules, else raise ``InvalidURIError``."""
    problem = _bucket_problem(bucket)
    if problem:
        raise InvalidURIError(f"invalid bucket name {bucket!r}: {problem}")
    return bucket


@functools.lru_cache(maxsize=256)
def _bucket_problem(bucket: str) -> str | None:
    """What is wrong with a bucket name, or ``None``; remembered, since every object URL names its bucket."""
    if not 3 <= len(bucket) <= 222:
        return "must be 3 to 222 characters long"
    if not _BUCKET_CHARS.fullmatch(bucket):
        return (
            "may hold only lowercase letters, digits, '-', '_' and '.', and must start and end with a letter or digit"
        )
    parts = bucket.split(".")
    if len(parts) == 1 and len(bucket) > 63:
        return "must be at most 63 characters long unless it contains dots"
    if any(not 1 <= len(part) <= 63 for part in parts):
        return "each dot-separated part must be 1 to 63 characters long"
    if bucket.startswith("goog"):
        return "must not start with 'goog'"
    if _GOOGLE_LOOKALIKE.search(bucket):
        return "must not contain 'google' or a close misspelling of it"
    try:
        ipaddress.IPv4Address(bucket)
    except ValueError:
        return None
    return "must not be an IP address"


def validate_object_name(name: str, *, allow_empty: bool) -> str:
    """Return ``name`` if GCS accepts it as an object name (or, with ``allow_empty``, a prefix)."""
    if not name:
        if allow_empty:
            return name
        raise InvalidURIError("object name must not be empty")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_OBJECT_NAME_BYTES:
        raise InvalidURIError(f"object name is longer than {MAX_OBJECT_NAME_BYTES} bytes: {name[:80]!r}...")
    if "\r" in name or "\n" in name:
        raise InvalidURIError(f"object name must not contain carriage returns or line feeds: {brief(name)}")
    if name in (".", ".."):
        raise InvalidURIError(f"object name must not be {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidURIError(f"object name is not valid unicode: {brief(name)}") from exc
    return name


def parse_url(url: str, *, allow_prefix: bool = True) -> tuple[str, str]:
    """Split ``gs://bucket/name`` (or ``gcs://``) into ``(bucket, name)``.

    With ``allow_prefix`` the name may be empty (``gs://bucket`` or ``gs://bucket/``), meaning the
    whole bucket.

    >>> parse_url("gs://my-bucket/images/cat #1.jpg")
    ('my-bucket', 'images/cat #1.jpg')
    """
    if not isinstance(url, str):
        raise InvalidURIError(not_a_url(url))
    scheme = next((s for s in SCHEMES if url.startswith(s)), None)
    if scheme is None:
        raise InvalidURIError(f"not a GCS URL (expected gs://bucket/name): {brief(url)}")
    bucket, _, name = url[len(scheme) :].partition("/")
    validate_bucket(bucket)
    if not name and not allow_prefix:
        raise InvalidURIError(f"object name must not be empty: {brief(url)} names a bucket or folder, not an object")
    validate_object_name(name, allow_empty=allow_prefix)
    return bucket, name


def url_list(urls: object) -> list[str]:
    """``urls`` as a list: one URL string, or an iterable of them (each checked by :func:`parse_url`).

    >>> url_list("gs://bkt/train/"), url_list(("gs://bkt/a", "gs://bkt/b"))
    (['gs://bkt/train/'], ['gs://bkt/a', 'gs://bkt/b'])
    """
    if isinstance(urls, str):
        listed = [urls]
    elif isinstance(urls, (bytes, bytearray, os.PathLike)) or not isinstance(urls, Iterable):
        raise InvalidURIError(not_a_url(urls))
    else:
        listed = list(urls)
    for url in listed:
        parse_url(url)
    return listed


def not_a_url(value: object) -> str:
    """What an error says of ``value`` given where a URL belongs."""
    accepted = "expected a 'gs://bucket/name' string (or a list of them)"
    if isinstance(value, os.PathLike):
        return f"{accepted}, got the local path {brief(value)}: a pathlib path turns 'gs://' into 'gs:/'"
    return f"{accepted}, got {type(value).__name__}: {brief(value)}"


def format_url(bucket: str, name: str = "") -> str:
    """Build the canonical ``gs://bucket/name`` URL; the inverse of :func:`parse_url`.

    >>> format_url("my-bucket", "a/b?.txt")
    'gs://my-bucket/a/b?.txt'
    """
    validate_bucket(bucket)
    validate_object_name(name, allow_empty=True)
    return f"gs://{bucket}/{name}"


class _Brief(reprlib.Repr):
    """``repr`` cut short, bytes included (sliced before they are shown, so a large payload is never copied whole)."""

    def repr_bytes(self, value: bytes, level: int) -> str:
        shown = repr(value[: self.maxstring])
        return shown + f"... ({len(value):,} bytes)" if len(value) > self.maxstring else shown

    repr_bytearray = repr_bytes


_BRIEF = _Brief()
_BRIEF.maxstring = _BRIEF.maxother = 80


def brief(value: object) -> str:
    """A short ``repr`` of ``value`` for error messages: what it starts with, never all of a payload.

    >>> brief(b"x" * 10_000_000)[-22:]
    '... (10,000,000 bytes)'
    >>> brief("gs://bucket/name")
    "'gs://bucket/name'"
    """
    return _BRIEF.repr(value)


def printable(text: str) -> str:
    """``text`` with control characters escaped, so a name cannot drive the terminal it is printed on.

    >>> printable("a\\x1b[2Jb\\tc")
    'a\\\\x1b[2Jb\\\\tc'
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)
