"""What a path names: a bucket, an object name and, with ``version_aware``, one version of the object, as
fsspec and gcsfs spell paths (with or without ``gs://``; a trailing ``/`` below the bucket kept); a path that
is not text, or that GCS would refuse, raises before any request is made."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from fsspec.asyn import AsyncFileSystem
from fsspec.utils import stringify_path

from .._ops.urls import brief, format_url, validate_bucket, validate_object_name
from ..errors import InvalidURIError

__all__ = ["InvalidPathError", "Paths", "folders_of"]

VERSION = re.compile(r"(?s)(.*)(?:#|\?generation=)(\d+)")
"""A path naming one version of an object, ``name#<generation>`` (or gcsfs's ``name?generation=<generation>``)."""


class InvalidPathError(InvalidURIError, OSError):
    """A path GCS would refuse (no bucket, a bad bucket or object name): an ``InvalidURIError`` (a
    ``ValueError``) that is an ``OSError`` too, as fsspec's callers expect of a filesystem's errors."""


class Paths(AsyncFileSystem):  # type: ignore[misc]  # fsspec ships no types: to mypy its classes are Any
    """The filesystem's paths: how fsspec's path arguments are read, and what bucket, name and version each
    names."""

    protocol = ("gs", "gcs")
    root_marker = ""
    version_aware: bool

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """fsspec's, for paths that are text only, keeping a trailing ``/`` below the bucket as gcsfs does
        (``bucket/x/``: written, the object ``x/``; read or listed, the directory ``x``). Every call with a
        path passes here, or through :meth:`_expand_path`, :meth:`_pipe` or :meth:`_copy`, before any
        request: a path that is not text (``None``, a number, bytes) is refused with a ``TypeError``."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = _path_text(path)
        stripped = super()._strip_protocol(text).lstrip("/")  # "/bucket/x" is "bucket/x", as in gcsfs
        return f"{stripped}/" if text.endswith("/") and "/" in stripped else stripped

    async def _expand_path(self, path: Any, *args: Any, **kwargs: Any) -> list[str]:
        if not isinstance(path, (str, os.PathLike)):  # several paths: fsspec takes any iterable of them
            if isinstance(path, (bytes, bytearray)) or not isinstance(path, Iterable):
                _path_text(path)
            path = [_path_text(p) for p in path]
        expanded: list[str] = await super()._expand_path(path, *args, **kwargs)
        return expanded

    async def _pipe(self, path: Any, value: Any = None, **kwargs: Any) -> Any:
        for name in path if isinstance(path, dict) else [path]:
            _path_text(name)
        return await super()._pipe(path, value, **kwargs)

    async def _copy(self, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> Any:
        for name in [
            *(path1 if isinstance(path1, list) else [path1]),
            *(path2 if isinstance(path2, list) else [path2]),
        ]:
            _path_text(name)
        return await super()._copy(path1, path2, *args, **kwargs)

    @classmethod
    def _get_kwargs_from_urls(cls, path: str) -> dict[str, Any]:
        """``version_aware=True`` for a URL naming a version (``gs://b/o#<generation>``), as gcsfs does."""
        name = cls._strip_protocol(path).partition("/")[2]
        return {"version_aware": True} if VERSION.fullmatch(name) else {}

    def split_path(self, path: str) -> tuple[str, str]:
        """``(bucket, name)`` of a path with or without ``gs://``; the name may be empty (the bucket), and has
        no trailing ``/``: ``x/`` and ``x`` name the same directory (:meth:`_object` keeps it, for objects)."""
        return self._split_version(path)[:2]

    def _split_version(self, path: str) -> tuple[str, str, int | None]:
        """``(bucket, name, generation)``: with ``version_aware``, a name ending ``#<generation>`` (or
        ``?generation=<generation>``) names that version; else ``generation`` is ``None``."""
        bucket, _, name = self._strip_protocol(path).rstrip("/").partition("/")
        generation = None
        version = VERSION.fullmatch(name) if self.version_aware else None
        if version:
            name, generation = version[1], int(version[2])
        if not bucket:
            raise InvalidPathError(f"{path!r} names no bucket")
        try:
            validate_bucket(bucket)
            validate_object_name(name, allow_empty=True)
        except InvalidURIError as exc:
            raise InvalidPathError(str(exc), url=exc.url) from exc
        return bucket, name, generation

    def _object(self, path: str, *, version: bool = False) -> tuple[str, str, str]:
        """``(bucket, name, url)`` of a path that must name an object; ``bucket/x/`` names the object ``x/``
        (a folder's placeholder, such as ``touch("bucket/x/")`` writes), never ``x``. One naming a version of
        it is refused unless ``version`` (the caller reads, copies or deletes it): a write makes a new version."""
        bucket, name, generation = self._split_version(path)
        if not name:
            raise IsADirectoryError(f"{path!r} is a bucket, not an object")
        name += "/" if self._strip_protocol(path).endswith("/") else ""
        if generation is not None and not version:
            raise InvalidPathError(
                f"{path!r} names one version of an object: only reads, rm and a copy from it take one", url=path
            )
        return bucket, name, format_url(bucket, name)


def folders_of(path: str) -> list[str]:
    """The directories ``path`` lies in, below its bucket: ``bucket/a/b/c`` in ``bucket/a/b`` and ``bucket/a``;
    a folder placeholder ``bucket/a/b/`` in those same two."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[:depth]) for depth in range(len(parts), 1, -1)]


def _path_text(path: Any) -> str:
    """``path`` as fsspec reads it (a str, or an ``os.PathLike`` naming one); ``TypeError`` saying what
    it is otherwise, rather than an error from deep inside fsspec."""
    text = stringify_path(path)
    if not isinstance(text, str):
        raise TypeError(f"a GCS path must be a str such as 'gs://bucket/name', got {type(path).__name__} {brief(path)}")
    return text
