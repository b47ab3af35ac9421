"""An fsspec filesystem on this library's engines, for tools that reach storage through fsspec:
Lightning's ``ModelCheckpoint``, ``torch.distributed.checkpoint`` with a ``gs://`` checkpoint id,
pandas and pyarrow (as the README's fsspec section says, call by call).

Which filesystem serves ``gs://`` and ``gcs://``, in every process (DataLoader workers, forked,
spawned or forkserver, and subprocesses alike), through the entry point this package gives fsspec:

- :func:`register` was called in this process or a parent (it sets ``TORCHDATA_GCS_FSSPEC=1``), or
  that variable is set for the job: :class:`GCSFileSystem`;
- ``TORCHDATA_GCS_FSSPEC=0``: gcsfs;
- neither: gcsfs if it is installed (nothing changes for its users), else :class:`GCSFileSystem`.

::

    import torchdata_gcs.fsspec
    torchdata_gcs.fsspec.register()  # needed only where gcsfs is installed too
    fs, path = fsspec.url_to_fs("gs://bucket/data")

What it does on GCS:

- ``find``/``glob``/recursive ``rm``, ``copy`` and ``get`` list a prefix with the parallel lister, not
  directory by directory; ``rm`` of several objects deletes them in batch requests of up to 100;
- ``open(..., "rb")`` is a seekable file of one object version that reads only the ranges asked for,
  a block ahead (concurrent ranged GETs for large reads), so a tar index or a parquet footer costs a
  few small requests;
- ``open(..., "wb")``, ``put`` and large ``pipe`` stream out in parts and publish on a clean close only
  (a ``with`` block left by an exception publishes nothing); ``"xb"``, ``pipe_file(mode="create")``
  and ``put_file(mode="create")`` never replace an existing object;
- within ``with fs.transaction:``, written files are published when it ends cleanly (every part
  uploaded first, then one publishing request per file: GCS has no multi-object commit), and none of
  them if it ends by an exception;
- ``cp`` is a server-side rewrite; nothing passes through this process.

A flat bucket has no directories: a directory is a prefix with objects under it, ``mkdir`` changes
nothing, and an empty directory does not exist. A bucket with a hierarchical namespace has folders,
which outlive their objects: ``ls`` lists them and ``info`` finds them, empty ones too.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import io
import logging
import os
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

import google.auth.credentials
from fsspec.asyn import AsyncFileSystem
from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.registry import register_implementation
from fsspec.spec import AbstractBufferedFile
from fsspec.transaction import Transaction
from fsspec.utils import stringify_path

from torchdata_gcs_fsspec_handler import VARIABLE

from ._engines.download import Loaded, fetch_object, read_ranges_into
from ._engines.listing import list_objects
from ._engines.memory_file import FilledBytes
from ._engines.streams import PartStream
from ._engines.upload import PublishingWriter, StreamingWriter, new_writer
from ._ops.batch import delete_objects
from ._ops.checksums import check_crc32c, crc32c_base64
from ._ops.client import Client
from ._ops.objects import (
    MAX_PAGE_SIZE,
    check_bucket,
    create_object,
    delete_folder,
    delete_object,
    list_page,
    live_generation,
    object_resource,
    rewrite_object,
    storage_layout,
)
from ._ops.paging import PageTrail
from ._ops.patterns import has_magic, tree_glob
from ._ops.urls import TEMPORARY_PREFIX, brief, format_url, validate_bucket, validate_object_name
from ._transport.context import LoadStats, RequestContext, new_context
from ._transport.deadline import call_deadline
from ._transport.loop import io_loop, on_io_loop, run
from .config import ClientConfig, RetryConfig, TransferConfig, WriteConfig
from .errors import AccessDeniedError, InvalidURIError, NotFoundError, PreconditionFailedError

__all__ = ["GCSFile", "GCSFileSystem", "InvalidPathError", "PublishingTransaction", "StagedWriter", "register"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

FILE_FIELDS = "name,size,generation,crc32c,updated"
"""What an ``info`` of a file holds, beyond its ``type``."""

LISTING_CONCURRENCY = 8
"""List requests at once for ``find`` (and the ``rm``, ``copy`` and ``get`` built on it)."""

WRITE_MODES = ("overwrite", "create")

_LISTED: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("listed", default=None)
"""Where ``find`` notes the generation of each file it lists, while an ``rm`` expands its paths."""
_CAT_JOB: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("cat_job", default=None)
"""The request context the whole-object reads of one ``cat`` share, so its requests take turns for its
``TransferConfig.max_in_flight`` slots instead of opening a connection per path at once."""


class InvalidPathError(InvalidURIError, OSError):
    """A path GCS would refuse (no bucket, a bad bucket or object name): an ``InvalidURIError`` (a
    ``ValueError``) that is an ``OSError`` too, as fsspec's callers expect of a filesystem's errors."""


def _on_io_loop(method: Callable[..., Awaitable[T]], *, one_call: bool = True) -> Callable[..., Awaitable[T]]:
    """Run a coroutine method on the process's I/O loop, where its session lives, whatever loop awaits it;
    as one call, which ``RetryConfig.deadline`` bounds as a whole, unless it is not ``one_call``."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> T:
        with call_deadline(self.retry) if one_call else contextlib.nullcontext():
            return await on_io_loop(method(self, *args, **kwargs))  # type: ignore[arg-type]

    return wrapper


class PublishingTransaction(Transaction):  # type: ignore[misc]
    """fsspec's transaction, each file's parts uploaded before any file is published: a failure until then
    (an exception inside ``with``, a part that fails) publishes nothing. Then each file is published by one
    request of its own, in the order opened: GCS cannot publish several objects at once, so a file whose
    publishing fails leaves those before it published, and it and those after it are not (a warning names
    both lists); the error is raised as it came."""

    def complete(self, commit: bool = True) -> None:
        files, self.files = list(self.files), deque()
        published: list[str] = []
        try:
            if commit:
                for staged in files:
                    staged.prepare()
                for staged in files:
                    staged.commit()
                    published.append(staged.url)
        except BaseException:
            if published:
                left = [staged.url for staged in files[len(published) :]]
                logger.warning("a transaction published %s, then failed; not published: %s", published, left)
            raise
        finally:
            for staged in files:
                staged.discard()  # a no-op for those published
            self.fs._intrans = False  # a failed transaction must not defer the filesystem's later writes
            self.fs._transaction = None


def _in_bulk_on_io_loop(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """:func:`_on_io_loop` for a method that may send any number of requests (an ``rm`` of a whole prefix),
    each under its own deadline."""
    return _on_io_loop(method, one_call=False)


FSSPEC_OPTIONS = frozenset(
    {"asynchronous", "loop", "batch_size", "skip_instance_cache", "use_listings_cache", "listings_expiry_time",
     "max_paths"}
)  # fmt: skip
"""The keyword arguments fsspec's own filesystem classes take."""
CONSISTENCY = frozenset({"none", "size", "md5", "crc32c"})
"""gcsfs's ``consistency`` values; reads here are always checked by crc32c, which covers them all."""


def _client_from_gcsfs_options(client: ClientConfig | None, options: dict[str, Any]) -> ClientConfig | None:
    """``client`` with gcsfs's arguments in ``options`` applied (and taken out of it); any other argument
    that fsspec does not take raises ``TypeError`` naming it: ignoring ``token`` or ``endpoint_url`` would
    send requests elsewhere than meant."""
    gcsfs = {key: options.pop(key) for key in ("token", "endpoint_url", "project", "requester_pays", "consistency")
             if key in options}  # fmt: skip
    unknown = sorted(set(options) - FSSPEC_OPTIONS)
    if unknown:
        raise TypeError(f"GCSFileSystem got arguments it does not take: {', '.join(unknown)}")
    if not gcsfs:
        return client
    if client is not None:
        raise TypeError(f"give either client= or gcsfs's {', '.join(sorted(gcsfs))}, not both")
    consistency = gcsfs.get("consistency", "crc32c")
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency must be one of {sorted(CONSISTENCY)}, got {consistency!r}")
    settings: dict[str, Any] = {}
    if gcsfs.get("endpoint_url") is not None:
        settings["endpoint"] = gcsfs["endpoint_url"]
    token = gcsfs.get("token")
    if token == "anon":
        settings["anonymous"] = True
    elif isinstance(token, (str, os.PathLike)) and token not in ("google_default", "cloud"):
        if not os.path.isfile(token):
            raise ValueError(f"token {token!r} is neither 'anon', 'google_default', 'cloud' nor a credentials file")
        settings["credentials_file"] = os.fspath(token)
    elif isinstance(token, google.auth.credentials.Credentials):
        settings["credentials"] = token
    elif token is not None and token not in ("google_default", "cloud"):
        raise TypeError(f"token must be 'anon', 'google_default', 'cloud', a file path or Credentials, got {token!r}")
    payer = gcsfs.get("requester_pays", False)
    if payer is True:
        if not gcsfs.get("project"):
            raise ValueError("requester_pays=True bills project=, which is missing")
        settings["user_project"] = gcsfs["project"]
    elif isinstance(payer, str) and payer:
        settings["user_project"] = payer
    return ClientConfig(**settings)


class GCSFileSystem(AsyncFileSystem):  # type: ignore[misc]
    """GCS as an fsspec ``AsyncFileSystem``, on the same engines as the DataPipes and checkpoints.

    Args:
        client: endpoint and credentials; the default ``ClientConfig()`` takes ``STORAGE_EMULATOR_HOST``,
            then Application Default Credentials.
        retry: how transient failures are retried.
        transfer: requests in flight per call and the part size of concurrent ranged reads.
        write: part size, parts in flight and strategy of streamed writes (``compression`` must be
            ``None``: files are stored as written; fsspec's own ``compression=`` compresses them).
        **storage_options: fsspec's own (``asynchronous``, ``loop``, ``skip_instance_cache``, ...), and
            gcsfs's where they mean something here, so that ``storage_options`` written for gcsfs work
            unchanged: ``token`` (``"anon"``, ``"google_default"``, ``"cloud"`` or ``None``, a credentials
            file path, or a ``google.auth`` ``Credentials``), ``endpoint_url``, ``project``,
            ``requester_pays`` (``True``: bill ``project``; or the project to bill) and ``consistency``
            (every read is checked by crc32c whatever it says). Any other gcsfs argument raises
            ``TypeError`` naming it, rather than being ignored.

    ``stats`` counts the requests, retries and bytes of every call. The filesystem pickles as its
    settings and works after a fork (its requests go out on the I/O loop of whichever process it is in).

    Example:
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.create_bucket("demo")
        ...     fs = GCSFileSystem(client=emulator.client_config)
        ...     fs.pipe_file("gs://demo/logs/a.txt", b"alpha")
        ...     with fs.open("gs://demo/logs/b.txt", "wb") as f:
        ...         _ = f.write(b"beta")
        ...     fs.ls("gs://demo/logs", detail=False), fs.cat("gs://demo/logs/b.txt")
        (['demo/logs/a.txt', 'demo/logs/b.txt'], b'beta')
    """

    protocol = ("gs", "gcs")
    root_marker = ""
    transaction_type = PublishingTransaction

    def __init__(
        self,
        client: ClientConfig | None = None,
        retry: RetryConfig | None = None,
        transfer: TransferConfig | None = None,
        write: WriteConfig | None = None,
        **storage_options: Any,
    ) -> None:
        client = _client_from_gcsfs_options(client, storage_options)
        if not storage_options.get("asynchronous"):
            storage_options.setdefault("loop", io_loop())
        super().__init__(**storage_options)
        self.client = client or ClientConfig()
        self.retry = retry or RetryConfig()
        self.transfer = transfer or TransferConfig()
        self.write = write or WriteConfig()
        if self.write.compression is not None:
            raise ValueError(
                "GCSFileSystem stores files as written: pass compression= to fsspec.open instead of WriteConfig"
            )
        self.stats = LoadStats()
        self._hierarchical: dict[str, bool] = {}  # bucket -> whether it has a hierarchical namespace

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the blocking methods run on: the I/O loop of the current process (fork-safe)."""
        return self._loop if self.asynchronous else io_loop()  # type: ignore[no-any-return]

    # -- paths -----------------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """fsspec's, for paths that are text only. Every call with a path passes here, or through
        :meth:`_expand_path`, :meth:`_pipe` or :meth:`_copy`, before any request: a path that is not
        text (``None``, a number, bytes) is refused with a ``TypeError`` saying so."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return super()._strip_protocol(_path_text(path)).lstrip("/")  # "/bucket/x" is "bucket/x", as in gcsfs

    async def _expand_path(self, path: Any, *args: Any, **kwargs: Any) -> list[str]:
        if not isinstance(path, (str, os.PathLike)):  # several paths: fsspec takes any iterable of them
            if isinstance(path, (bytes, bytearray)) or not isinstance(path, Iterable):
                _path_text(path)
            path = [_path_text(p) for p in path]
        return await super()._expand_path(path, *args, **kwargs)  # type: ignore[no-any-return]

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

    def split_path(self, path: str) -> tuple[str, str]:
        """``(bucket, name)`` of a path with or without ``gs://``; the name may be empty (the bucket)."""
        bucket, _, name = self._strip_protocol(path).partition("/")
        if not bucket:
            raise InvalidPathError(f"{path!r} names no bucket: GCSFileSystem does not list buckets")
        try:
            validate_bucket(bucket)
            validate_object_name(name, allow_empty=True)
        except InvalidURIError as exc:
            raise InvalidPathError(str(exc), url=exc.url) from exc
        return bucket, name

    def _object(self, path: str) -> tuple[str, str, str]:
        """``(bucket, name, url)`` of a path that must name an object."""
        bucket, name = self.split_path(path)
        if not name:
            raise IsADirectoryError(f"{path!r} is a bucket, not an object")
        return bucket, name, format_url(bucket, name)

    def _job(self, budget: int | None = None) -> RequestContext:
        """A request context for one call (``budget``: bytes it may hold ahead, if not the transfer's)."""
        transfer = self.transfer if budget is None else replace(self.transfer, max_buffered_bytes=budget)
        return new_context(self.client, transfer, self.retry, self.stats)

    @staticmethod
    def _file(bucket: str, resource: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": f"{bucket}/{resource['name']}",
            "type": "file",
            "size": int(resource["size"]),
            "generation": int(resource["generation"]),
            "crc32c": resource.get("crc32c"),
            "updated": resource.get("updated"),
        }

    @staticmethod
    def _directory(path: str) -> dict[str, Any]:
        return {"name": path.rstrip("/"), "type": "directory", "size": 0}

    # -- metadata and listing --------------------------------------------------------------------

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        """fsspec's, and a path GCS would refuse does not exist (``isdir`` says so already)."""
        try:
            return await super()._exists(path, **kwargs)  # type: ignore[no-any-return]
        except InvalidPathError:
            return False

    @_on_io_loop
    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        bucket, name = self.split_path(path)
        job = self._job()
        if not name:
            await check_bucket(job, bucket)  # NotFoundError, a FileNotFoundError, if missing
            return self._directory(bucket)
        resource = await object_resource(job, bucket, name, FILE_FIELDS)
        if resource is not None:
            return self._file(bucket, resource)
        if await self._is_directory(job, bucket, name):
            return self._directory(f"{bucket}/{name}")
        raise NotFoundError(f"{format_url(bucket, name)}: no such object or directory", url=format_url(bucket, name))

    @staticmethod
    async def _is_directory(job: RequestContext, bucket: str, name: str) -> bool:
        """Whether ``name/`` holds objects, or is a folder of a bucket with a hierarchical namespace (empty
        ones too), with ``storage.objects.list`` alone: a listing of ``name``'s level from ``name/`` to
        ``name0`` (``0`` follows ``/``) holds at most that one prefix."""
        parent = name.rpartition("/")[0]
        params: dict[str, Any] = {
            "prefix": f"{parent}/" if parent else "",
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",
            "startOffset": f"{name}/",
            "endOffset": f"{name}0",
            "maxResults": 1,
            "fields": "prefixes,nextPageToken",
        }
        # GCS may answer a page with nothing in it but a token; the range holds one prefix at most
        return any([page.get("prefixes") async for page in _pages(job, bucket, params)])

    @_on_io_loop
    async def _ls(self, path: str, detail: bool = False, **kwargs: Any) -> list[Any]:
        bucket, name = self.split_path(path)
        prefix = f"{name}/" if name else ""
        params: dict[str, Any] = {
            "prefix": prefix,
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",  # folders of a hierarchical namespace, empty ones too
            "maxResults": MAX_PAGE_SIZE,
            "fields": f"items({FILE_FIELDS}),prefixes,nextPageToken",
        }
        job = self._job()
        entries: list[dict[str, Any]] = []
        folders: set[str] = set()  # a page may name again a prefix an earlier page named
        placeholder = False  # a zero-byte "name/" object: a folder made in the console, empty or not
        async for page in _pages(job, bucket, params):
            folders.update(page.get("prefixes", []))
            for item in page.get("items", []):
                if item["name"] == prefix:
                    placeholder = True
                else:
                    entries.append(self._file(bucket, item))
        entries += (self._directory(f"{bucket}/{p}") for p in folders - {TEMPORARY_PREFIX})
        if not entries and name and not placeholder:
            entries = [await self._info(path)]  # a file lists as itself; nothing at all raises
            if entries[0]["type"] == "directory":
                entries = []
        entries.sort(key=lambda entry: entry["name"])
        return entries if detail else [entry["name"] for entry in entries]

    async def _glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        """fsspec's glob, with GCS asked for the names it may select only (``matchGlob``, see ``_find``)."""
        narrowed = tree_glob(self.split_path(path)[1])
        return await super()._glob(path, maxdepth=maxdepth, **kwargs, **({"match_glob": narrowed} if narrowed else {}))

    async def _find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        match_glob: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Everything under ``path`` (and ``path`` itself if it is an object) from one parallel flat listing,
        at most ``maxdepth`` levels below ``path`` if given (as gcsfs does: a missing bucket raises).
        ``match_glob``: a GCS ``matchGlob`` that GCS may apply to the listing (the caller still filters)."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        bucket, name = self.split_path(path)
        client = Client(self.client, self.retry)
        batches = await asyncio.to_thread(
            lambda: list(list_objects(client, bucket, name, MAX_PAGE_SIZE, LISTING_CONCURRENCY, match_glob=match_glob))
        )
        found = {entry["name"]: entry for batch in batches for entry in (self._file(bucket, item) for _, item in batch)}
        if withdirs:
            top = f"{bucket}/{name}".rstrip("/")
            for entry_name in list(found):
                parent = entry_name.rpartition("/")[0]
                while parent.startswith(top) and parent not in found:
                    found[parent] = self._directory(parent)
                    parent = parent.rpartition("/")[0]
        if maxdepth is not None:
            deepest = f"{bucket}/{name}".rstrip("/").count("/") + maxdepth
            found = {entry_name: entry for entry_name, entry in found.items() if entry_name.count("/") <= deepest}
        listed = _LISTED.get()
        if listed is not None:  # an rm deletes what it found only while it is the generation listed
            listed.update((n, entry["generation"]) for n, entry in found.items() if entry["type"] == "file")
        names = sorted(found)
        return {n: found[n] for n in names} if detail else names

    # -- reading ---------------------------------------------------------------------------------

    @_in_bulk_on_io_loop
    async def _cat(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        """fsspec's; the paths' reads share one request context: at most ``TransferConfig.max_in_flight``
        requests at once, on the connections the earlier ones leave open."""
        token = _CAT_JOB.set(self._job(budget=sys.maxsize))
        try:
            return await super()._cat(path, *args, **kwargs)
        finally:
            _CAT_JOB.reset(token)

    @_on_io_loop
    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        _, _, url = self._object(path)
        if not start and end is None:  # the whole object: one GET (ranges above a part), checked by crc32c
            job = _CAT_JOB.get() or self._job(budget=sys.maxsize)
            data, _ = await fetch_object(job, url, None, 0, in_one_buffer=True)
            return data if isinstance(data, bytes) else b"".join(data)  # type: ignore[arg-type]
        info = await self._info(path)
        if info["type"] != "file":
            raise IsADirectoryError(f"{url} is a directory")
        size = info["size"]
        start, end = _resolve(start, size), _resolve(end, size) if end is not None else size
        return await self._read_version(url, info, start, end)

    async def _read_version(self, url: str, info: dict[str, Any], start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the version ``info`` describes, as concurrent ranged GETs of the part
        size; checked by length, and by crc32c when they are the whole object."""
        if end <= start:
            return b""
        buffer = FilledBytes(end - start)  # the bytes returned, held once
        crc = await read_ranges_into(self._job(), url, info["generation"], start, buffer.view, self.transfer.part_size)
        if start == 0 and end == info["size"]:
            check_crc32c(url, crc32c_base64(crc), {"GCS": info["crc32c"]})
        return buffer.take()

    @_on_io_loop
    async def _get_file(self, rpath: str, lpath: str, callback: Callback = DEFAULT_CALLBACK, **kwargs: Any) -> None:
        """Download one object to ``lpath``; an object larger than a few parts streams through, read ahead
        while it is written. ``lpath`` is replaced only once every byte arrived and checked."""
        _, _, url = self._object(rpath)
        try:
            data, _ = await fetch_object(self._job(budget=4 * self.transfer.part_size), url, None, 0)
        except NotFoundError:
            if not await self._isdir(rpath):  # a recursive get hands directories over too
                raise
            os.makedirs(lpath, exist_ok=True)
            return
        await asyncio.to_thread(_write_local, data, lpath, callback)

    def open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        """fsspec's; a text writer (``"w"``, ``"x"``) publishes nothing when its ``with`` block is left
        by an exception, as a binary one does."""
        if "b" in mode or "r" in mode:
            return super().open(path, mode, **kwargs)
        text = {key: kwargs.pop(key) for key in ("encoding", "errors", "newline") if key in kwargs}
        return _TextWriter(super().open(path, mode.replace("t", "") + "b", **kwargs), **text)

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        cache_type: str = "readahead",
        **kwargs: Any,
    ) -> GCSFile | PublishingWriter | StagedWriter:
        """A seekable reader (``"rb"``), or a writer that publishes on a clean close (``"wb"``; ``"xb"``
        only if the object does not exist); within ``fs.transaction``, writers publish when it commits."""
        if mode == "rb":
            return GCSFile(self, path, block_size=block_size, cache_type=cache_type, cache_options=cache_options)
        if mode in ("wb", "xb"):
            _, _, url = self._object(path)
            if mode == "xb" and self.exists(path):  # said at open; the publish checks again, atomically
                raise FileExistsError(f"{url} exists")
            writer = new_writer(url, self.client, self.retry, self.write, only_if_new=mode == "xb")
            return writer if autocommit else StagedWriter(writer)
        raise NotImplementedError(
            f"mode {mode!r}: GCS objects are written whole, never appended to or updated in place"
        )

    # -- writing ---------------------------------------------------------------------------------

    @_on_io_loop
    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        bucket, name, url = self._object(path)
        only_if_new = _only_if_new(mode)
        data = bytes(value)
        if len(data) <= self.write.part_size and not self._intrans:
            job = self._job()
            replaced = 0 if only_if_new else await live_generation(job, bucket, name)
            await create_object(job, bucket, name, data, if_generation_match=replaced)
        else:
            await asyncio.to_thread(self._write_chunks, url, [data], only_if_new)

    @_on_io_loop
    async def _put_file(
        self, lpath: str, rpath: str, mode: str = "overwrite", callback: Callback = DEFAULT_CALLBACK, **kwargs: Any
    ) -> None:
        if os.path.isdir(lpath):
            return  # GCS has no directories: the files under one carry it
        _, _, url = self._object(rpath)
        only_if_new = _only_if_new(mode)
        callback.set_size(os.path.getsize(lpath))

        def chunks() -> Iterable[bytes]:
            with open(lpath, "rb") as local:
                while chunk := local.read(self.write.part_size):
                    yield chunk
                    callback.relative_update(len(chunk))

        await asyncio.to_thread(self._write_chunks, url, chunks(), only_if_new)

    def _write_chunks(self, url: str, chunks: Iterable[bytes], only_if_new: bool) -> None:
        """Stream ``chunks`` out as ``url``, published at the end, or within a transaction when it commits."""
        writer = new_writer(url, self.client, self.retry, self.write, only_if_new=only_if_new)
        try:
            for chunk in chunks:
                writer.write(chunk)
        except BaseException:
            writer.abort()
            raise
        if self._intrans:
            self.transaction.files.append(StagedWriter(writer))
        else:
            writer.close()

    @_on_io_loop
    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy one object server-side; a directory (met by a recursive ``copy`` or ``mv``) has nothing to copy
        but its objects, which are copied on their own, as fsspec's filesystems make a directory there."""
        source, destination = self._object(path1), self._object(path2)
        try:
            await rewrite_object(self._job(), source[:2], destination[:2])
        except NotFoundError:
            if not await self._is_directory(self._job(), *source[:2]):
                raise

    # -- removing and directories ----------------------------------------------------------------

    @_on_io_loop
    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        bucket, name, url = self._object(path)
        if not await delete_object(self._job(), bucket, name):
            raise NotFoundError(f"{url}: no such object", url=url)

    @_in_bulk_on_io_loop
    async def _rm(
        self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None, **kwargs: Any
    ) -> None:
        """Delete every object ``path`` expands to; directories go with their objects (a directory without
        ``recursive=True`` raises ``IsADirectoryError``), and with ``recursive=True`` and no ``maxdepth`` the
        folders of a hierarchical namespace go too; a glob without it skips the directories it matches. Buckets
        are never deleted: one named without ``recursive=True`` raises ``IsADirectoryError`` (gcsfs deletes an
        empty one).

        One object goes by a plain delete; more go in batch requests of up to 100 deletes, each only if the
        object is still the generation its listing found (else its live generation is asked first), and an
        object replaced since is deleted alone, as a single ``rm`` deletes it."""
        listed: dict[str, int] = {}
        watching = _LISTED.set(listed)
        try:
            paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        finally:
            _LISTED.reset(watching)
        job = self._job()
        objects = [(p, bucket, name) for p in paths for bucket, name in [self.split_path(p)] if name]
        buckets = [p for p in paths if not self.split_path(p)[1]]
        if buckets and not recursive:  # gcsfs deletes an empty bucket here; buckets are not deleted by rm
            await check_bucket(job, buckets[0])  # NotFoundError, a FileNotFoundError, if missing
            raise IsADirectoryError(f"{buckets[0]} is a bucket: rm does not delete buckets")
        deleted = await self._delete_objects(job, objects, listed)
        named = {self._strip_protocol(p).rstrip("/") for p in ([path] if isinstance(path, str) else path)}
        missed = [p for (p, _, _), gone in zip(objects, deleted) if not gone]
        if not recursive:  # a directory a glob matched is skipped, as gcsfs does; one named is refused
            missed = [p for p in missed if p in named or not await self._isdir(p)]
        if missed and not recursive:
            if await self._isdir(missed[0]):
                raise IsADirectoryError(f"{missed[0]} is a directory: remove it with recursive=True")
            raise NotFoundError(f"gs://{missed[0]}: no such object", url=f"gs://{missed[0]}")
        if recursive:
            tops = [] if maxdepth is not None else [path] if isinstance(path, str) else path  # deeper ones stay
            folders = await asyncio.gather(
                *(self._remove_folders(job, *self.split_path(top)) for top in tops if not has_magic(top))
            )
            if not any(deleted) and not any(folders):
                raise NotFoundError(f"nothing to remove under {path}", url=str(path))

    async def _remove_folders(self, job: RequestContext, bucket: str, name: str) -> int:
        """Delete the folder ``name/`` of a bucket with a hierarchical namespace and every folder under it,
        deepest first, once their objects are gone (GCS deletes only empty folders, and keeps them otherwise);
        returns how many went. A flat bucket pays one listing: only if something is left under ``name/`` is
        the bucket's storage layout asked (once per bucket). Without ``storage.folders.delete`` the folders
        stay, with a warning: the objects are gone, which is what removing them asked."""
        if not name or not await self._is_directory(job, bucket, name):
            return 0
        if bucket not in self._hierarchical:
            layout = await storage_layout(job, bucket)
            self._hierarchical[bucket] = bool((layout.get("hierarchicalNamespace") or {}).get("enabled"))
        if not self._hierarchical[bucket]:
            return 0
        level, folders = [f"{name}/"], [f"{name}/"]
        while level:
            below = await asyncio.gather(*(self._subfolders(job, bucket, folder) for folder in level))
            level = [folder for found in below for folder in found]
            folders += level
        removed = 0
        try:
            for depth in sorted({folder.count("/") for folder in folders}, reverse=True):
                at_depth = [folder for folder in folders if folder.count("/") == depth]
                removed += sum(await asyncio.gather(*(delete_folder(job, bucket, folder) for folder in at_depth)))
        except AccessDeniedError as exc:
            logger.warning(
                "the objects under %s are removed, its empty folders stay: %s", format_url(bucket, name), exc
            )
        return removed

    @staticmethod
    async def _subfolders(job: RequestContext, bucket: str, folder: str) -> list[str]:
        """The folders (and prefixes of objects) one level under ``folder``."""
        params = {
            "prefix": folder,
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",
            "maxResults": MAX_PAGE_SIZE,
            "fields": "prefixes,nextPageToken",
        }
        listed = [prefix async for page in _pages(job, bucket, params) for prefix in page.get("prefixes", [])]
        return list(dict.fromkeys(listed))  # a page may name again a prefix an earlier page named

    async def _delete_objects(
        self, job: RequestContext, objects: list[tuple[str, str, str]], listed: dict[str, int]
    ) -> list[bool]:
        """Delete ``objects`` (path, bucket, name), those of ``listed`` paths by that generation; whether each
        was there to delete."""
        if len(objects) == 1:
            return [await delete_object(job, *objects[0][1:])]
        unknown = [(bucket, name) for p, bucket, name in objects if p not in listed]
        found = await asyncio.gather(*(live_generation(job, bucket, name) for bucket, name in unknown))
        generations = {**dict(zip(unknown, found)), **{(b, n): listed[p] for p, b, n in objects if p in listed}}
        deleted = dict.fromkeys(generations, False)
        for bucket in {bucket for _, bucket, _ in objects}:
            versions = [(n, g) for (b, n), g in generations.items() if b == bucket and g]
            for (name, _), outcome in zip(versions, await delete_objects(job, bucket, versions, live=True)):
                if isinstance(outcome, PreconditionFailedError):  # replaced since it was listed
                    outcome = await delete_object(job, bucket, name)
                if isinstance(outcome, BaseException):
                    raise outcome
                deleted[bucket, name] = outcome
        return [deleted[bucket, name] for _, bucket, name in objects]

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Nothing to make (GCS has no directories); a bucket that does not exist raises ``FileNotFoundError``
        (buckets are not created here). An identity that may write objects but not list them (Storage Object
        Creator) cannot tell whether the bucket exists: it passes, and its first write will say."""
        try:
            await self._info(self.split_path(path)[0])
        except AccessDeniedError:
            pass

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        await self._mkdir(path)


class GCSFile(AbstractBufferedFile):  # type: ignore[misc]
    """A read-only, seekable file over one version of an object (the live one when opened): it reads
    only the ranges asked for, a block ahead (``cache_type`` is fsspec's), and a version replaced while
    it is open fails its next read with ``NotFoundError`` instead of mixing two versions' bytes.

    Reads of a part or more go out as concurrent ranged GETs of ``TransferConfig.part_size``; a read of
    the whole object is checked against its crc32c, a partial one by its length (GCS keeps no checksum
    per range).
    """

    DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024

    def __init__(
        self,
        fs: GCSFileSystem,
        path: str,
        *,
        block_size: int | None = None,
        cache_type: str = "readahead",
        cache_options: dict[str, Any] | None = None,
    ) -> None:
        info = fs.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(f"{path} is a directory")
        super().__init__(
            fs, info["name"], "rb", block_size, cache_type=cache_type, cache_options=cache_options, size=info["size"]
        )
        self.details = info
        self.url = format_url(*fs.split_path(info["name"]))

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs: GCSFileSystem = self.fs
        return run(fs._read_version(self.url, self.details, start, min(end, self.size)))


class StagedWriter(io.RawIOBase):
    """A writer opened within an fsspec transaction: its parts go out as they are written, but the
    object is published by ``commit()`` when the transaction ends cleanly, and ``discard()`` (the
    transaction failed) publishes nothing; closing it only stops writes."""

    def __init__(self, writer: StreamingWriter) -> None:
        super().__init__()
        self._writer = writer
        self.url = writer.url

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._writer.tell()

    def write(self, data: Any) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("write to a closed file")
        return self._writer.write(data)  # type: ignore[no-any-return]

    def prepare(self) -> None:
        """Upload every part written, leaving only the publishing (see ``StreamingWriter.prepare``)."""
        self._writer.prepare()

    def commit(self) -> None:
        self._writer.close()

    def discard(self) -> None:
        self._writer.abort()


class _TextWriter(io.TextIOWrapper):
    """Text over a binary writer that, left by an exception, aborts the writer instead of publishing it."""

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None or not isinstance(self.buffer, PublishingWriter):
            return super().__exit__(exc_type, exc, traceback)  # type: ignore[no-any-return]
        self.buffer.abort()
        with contextlib.suppress(Exception):  # the text still pending has nowhere to go: the write failed
            self.close()
        return None


async def _pages(job: RequestContext, bucket: str, params: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The pages of the listing ``params`` asks for, following ``nextPageToken`` (``params`` is updated)."""
    url = format_url(bucket, params.get("prefix") or params.get("startOffset", ""))
    trail = PageTrail(url)
    while True:
        page = await list_page(job, bucket, params, url=url)
        yield page
        token = trail.follow_json(page)
        if token is None:
            return
        params["pageToken"] = token


def _path_text(path: Any) -> str:
    """``path`` as fsspec reads it (a str, or an ``os.PathLike`` naming one); ``TypeError`` saying what
    it is otherwise, rather than an error from deep inside fsspec."""
    text = stringify_path(path)
    if not isinstance(text, str):
        raise TypeError(f"a GCS path must be a str such as 'gs://bucket/name', got {type(path).__name__} {brief(path)}")
    return text


def _resolve(offset: int | None, size: int) -> int:
    """An offset of fsspec's (``None``: 0, negative: from the end) as a position within ``size`` bytes."""
    if offset is None:
        return 0
    return max(0, size + offset) if offset < 0 else min(offset, size)


def _only_if_new(mode: str) -> bool:
    if mode not in WRITE_MODES:
        raise ValueError(f"mode must be one of {WRITE_MODES}, got {mode!r}")
    return mode == "create"


def _write_local(data: Loaded, lpath: str, callback: Callback) -> None:
    """Write a downloaded object to ``lpath`` through a temporary file beside it, renamed over ``lpath``
    only when complete, so a failed download leaves what was there before."""
    folder = os.path.dirname(os.path.abspath(lpath))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as local:
            if isinstance(data, PartStream):
                callback.set_size(data.size)
                with data:
                    shutil.copyfileobj(data, local, data.part_size)
            else:
                local.writelines([data] if isinstance(data, bytes) else data)
            callback.relative_update(local.tell())
        os.replace(temporary, lpath)
    except BaseException:
        os.unlink(temporary)
        raise


def register(protocols: Iterable[str] = ("gs", "gcs")) -> None:
    """Make :class:`GCSFileSystem` the handler of ``protocols`` in this process, replacing any other
    (such as gcsfs), so ``fsspec.open``, ``fsspec.url_to_fs`` and every tool built on them use it; and of
    ``gs://`` and ``gcs://`` in the processes started from now on, DataLoader workers included.

    Child processes learn it from ``TORCHDATA_GCS_FSSPEC=1``, set here, which they inherit. A forkserver
    already running keeps the environment it started with: call this before the first forkserver worker
    starts, or set the variable for the whole job instead.

    Example:
        >>> import fsspec, os
        >>> register()
        >>> type(fsspec.filesystem("gs", skip_instance_cache=True)).__name__, os.environ["TORCHDATA_GCS_FSSPEC"]
        ('GCSFileSystem', '1')
    """
    os.environ[VARIABLE] = "1"
    for protocol in protocols:
        register_implementation(protocol, GCSFileSystem, clobber=True)
