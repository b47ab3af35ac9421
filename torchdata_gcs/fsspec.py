"""An fsspec filesystem on this library's engines, for tools that reach storage through fsspec:
Lightning's ``ModelCheckpoint``, ``torch.distributed.checkpoint`` with a ``gs://`` checkpoint id,
pandas and pyarrow. README's fsspec section says what each call does on GCS, and
``docs/gcsfs-compatibility.md`` sets every argument, method and attribute beside gcsfs's.

In every process, ``gs://`` and ``gcs://`` are served by :class:`GCSFileSystem` once :func:`register`
was called there or in a parent (it sets ``TORCHDATA_GCS_FSSPEC=1``) or that variable is set; by gcsfs
with ``TORCHDATA_GCS_FSSPEC=0``; otherwise by gcsfs if it is installed, else by :class:`GCSFileSystem`::

    import torchdata_gcs.fsspec
    torchdata_gcs.fsspec.register()  # needed only where gcsfs is installed too
    fs, path = fsspec.url_to_fs("gs://bucket/data")
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import functools
import io
import itertools
import json
import logging
import mimetypes
import os
import re
import shutil
import sys
import tempfile
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import google.auth
import google.auth.credentials
import google.auth.exceptions
from fsspec.asyn import AsyncFileSystem, sync, sync_wrapper
from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.registry import available_protocols, register_implementation
from fsspec.spec import AbstractBufferedFile
from fsspec.transaction import Transaction
from fsspec.utils import other_paths, stringify_path

from torchdata_gcs_fsspec_handler import VARIABLE

from ._engines.download import Loaded, fetch_object
from ._engines.listing import list_objects_async
from ._engines.publishing import PublishingWriter, StreamingWriter
from ._engines.ranges import read_span, read_span_async
from ._engines.streams import PartStream
from ._engines.upload import new_writer
from ._ops.attributes import ObjectAttributes, fixed_fields, kms_key, user_metadata
from ._ops.batch import delete_objects
from ._ops.checksums import ObjectInfo, crc32c_base64, crc32c_of_concatenation, crc32c_value
from ._ops.client import Client, GCSClient, RequestContext, client_of
from ._ops.objects import (
    MAX_SOURCES,
    check_bucket,
    compose_object,
    create_bucket,
    create_object,
    delete_bucket,
    delete_folder,
    delete_object,
    list_buckets,
    list_page,
    live_generation,
    object_resource,
    patch_object,
    rewrite_object,
    storage_layout,
)
from ._ops.paging import MAX_PAGE_SIZE, PageTrail
from ._ops.patterns import has_magic, tree_glob
from ._ops.reads import media_read_url
from ._ops.signing import signed_url, signing_credentials
from ._ops.urls import TEMPORARY_PREFIX, brief, format_url, validate_bucket, validate_object_name
from ._transport.loop import io_loop
from .config import ClientConfig, RetryConfig, TransferConfig, WriteConfig
from .errors import AccessDeniedError, GCSError, InvalidURIError, NotFoundError, PreconditionFailedError

__all__ = [
    "BucketExistsError",
    "BucketNotEmptyError",
    "GCSFile",
    "GCSFileSystem",
    "InvalidPathError",
    "PublishingTransaction",
    "StagedWriter",
    "register",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)

LS_FIELDS = "items,prefixes,nextPageToken"
"""What ``ls`` asks of a listing: every object's whole resource (but its ACL, which listings leave out), as
``info`` and gcsfs give it."""
WRITE_OPTIONS = ("content_type", "metadata", "fixed_key_metadata", "kms_key_name")
"""The keyword arguments of ``open(..., "wb")``, ``pipe`` and ``put``, beyond fsspec's own."""

LISTING_CONCURRENCY = 8
"""List requests at once for ``find`` (and the ``rm``, ``copy`` and ``get`` built on it)."""

WRITE_MODES = ("overwrite", "create")

VERSION = re.compile(r"(?s)(.*)(?:#|\?generation=)(\d+)")
"""A path naming one version of an object, ``name#<generation>`` (or gcsfs's ``name?generation=<generation>``)."""

SIGN_OPTIONS = frozenset(
    {"method", "content_md5", "content_type", "response_type", "response_disposition", "generation", "headers",
     "query_parameters", "version"}
)  # fmt: skip
"""The arguments of google-cloud-storage's ``generate_signed_url`` that :meth:`GCSFileSystem.sign` takes."""

_LISTED: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("listed", default=None)
"""Where ``find`` notes the generation of each file it lists, while an ``rm`` expands its paths."""
_CAT_CONTEXT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("cat_context", default=None)
"""The request context the whole-object reads of one ``cat`` share, so its requests take turns for its
``TransferConfig.max_in_flight`` slots instead of opening a connection per path at once."""


class InvalidPathError(InvalidURIError, OSError):
    """A path GCS would refuse (no bucket, a bad bucket or object name): an ``InvalidURIError`` (a
    ``ValueError``) that is an ``OSError`` too, as fsspec's callers expect of a filesystem's errors."""


class BucketExistsError(GCSError, FileExistsError):
    """``mkdir`` of a bucket whose name is taken (GCS answers 409): bucket names are global, so a bucket of
    another project takes the name as well."""


class BucketNotEmptyError(GCSError, OSError):
    """``rmdir`` of a bucket that holds objects (GCS answers 409): GCS deletes only empty buckets."""


def _on_io_loop(method: Callable[..., Awaitable[T]], *, one_call: bool = True) -> Callable[..., Awaitable[T]]:
    """Run a coroutine method on the process's I/O loop, where its session lives, whatever loop awaits it;
    as one call, which ``RetryConfig.deadline`` bounds as a whole, unless it is not ``one_call``."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> T:
        return await self._gcs.call(method(self, *args, **kwargs), one_call=one_call)

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
GCSFS_ONLY = frozenset(
    {"MIN_CHUNK_SIZE_FOR_CONCURRENCY", "base", "batch_url_base", "call", "close_session", "default_block_size",
     "grpc_client", "make_bucket_requester_pays", "retries", "scopes", "session",
     "sync_process_limits_to_offset_and_length"}
)  # fmt: skip
"""gcsfs's public names that have no counterpart here: asked for, they raise an ``AttributeError`` that
points to the compatibility table, which says what to use instead."""
PROJECT_VARIABLE = "GCSFS_DEFAULT_PROJECT"
"""gcsfs's environment variable naming the project when ``project=`` is not given."""
CONSISTENCY = frozenset({"none", "size", "md5", "crc32c"})
"""gcsfs's ``consistency`` values; reads here are always checked by crc32c, which covers them all."""


def _listings_cache_options(options: dict[str, Any]) -> None:
    """gcsfs's ``cache_timeout`` in ``options`` as fsspec's listings cache options: ``None`` (gcsfs's
    default) caches listings until invalidated, seconds expire them, 0 or less caches none."""
    if "cache_timeout" not in options:
        return
    timeout = options.pop("cache_timeout")
    if "listings_expiry_time" in options:
        raise TypeError("give either gcsfs's cache_timeout or fsspec's listings_expiry_time, not both")
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"cache_timeout must be seconds or None, got {timeout!r}")
    if timeout <= 0:
        options["use_listings_cache"] = False
    else:
        options["listings_expiry_time"] = timeout


def _default_project(config: ClientConfig) -> str | None:
    """The project of a filesystem made without ``project=``, as gcsfs finds it: ``GCSFS_DEFAULT_PROJECT``, else
    the project the credentials of ``config`` belong to (a service-account key's, a credentials object's, or the
    one Application Default Credentials name, as ``google.auth.default()`` finds it); ``None`` if none does
    (anonymous access has no credentials)."""
    if os.environ.get(PROJECT_VARIABLE):
        return os.environ[PROJECT_VARIABLE]
    if config.anonymous:
        return None
    if config.credentials is not None:
        return getattr(config.credentials, "project_id", None) or getattr(config.credentials, "quota_project_id", None)
    if config.credentials_file:
        try:
            with open(config.credentials_file) as key:
                document = json.load(key)
        except (OSError, ValueError):  # its first request says what is wrong with it
            return None
        return (document.get("project_id") or document.get("quota_project_id")) if isinstance(document, dict) else None
    try:
        return google.auth.default()[1]  # type: ignore[no-any-return]
    except (google.auth.exceptions.DefaultCredentialsError, ValueError):
        return None


def _client_from_gcsfs_options(
    client: GCSClient | ClientConfig | None, options: dict[str, Any]
) -> GCSClient | ClientConfig | None:
    """``client`` with gcsfs's arguments in ``options`` applied (and taken out of it); any other argument
    that fsspec does not take raises ``TypeError`` naming it: ignoring ``token`` or ``endpoint_url`` would
    send requests elsewhere than meant. Dropped, as gcsfs leaves them unused: an argument named after another
    fsspec protocol, which holds that protocol's options (fsspec's form for chained URLs; Hugging Face
    ``datasets`` adds ``hf`` to the options it is given), and ``client_kwargs``, an HTTP client's settings that
    ``datasets`` hands every filesystem it opens a compressed file on (here proxies always come from the
    environment)."""
    gcsfs = {key: options.pop(key) for key in ("token", "endpoint_url", "project", "requester_pays", "consistency")
             if key in options}  # fmt: skip
    for key in set(options) & ({"client_kwargs"} | (set(available_protocols()) - {"gs", "gcs"})):
        del options[key]
    unknown = sorted(set(options) - FSSPEC_OPTIONS)
    if unknown:
        raise TypeError(f"GCSFileSystem got arguments it does not take: {', '.join(unknown)}")
    if not gcsfs.keys() - {"project"}:  # the project alone is the filesystem's (its buckets), not the client's
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
        project = gcsfs.get("project") or _default_project(ClientConfig(**settings))
        if not project:
            raise ValueError(
                f"requester_pays=True bills project=, which is missing (nor does {PROJECT_VARIABLE} or the "
                "credentials name one)"
            )
        settings["user_project"] = project
    elif isinstance(payer, str) and payer:
        settings["user_project"] = payer
    return ClientConfig(**settings)


class GCSFileSystem(AsyncFileSystem):  # type: ignore[misc]
    """GCS as an fsspec ``AsyncFileSystem``, on the same engines as the DataPipes and checkpoints.

    Args:
        client: a ``GCSClient`` (or the ``ClientConfig`` of one): endpoint, credentials, transport; the default
            takes ``STORAGE_EMULATOR_HOST``, then Application Default Credentials.
        retry: how transient failures are retried, in place of the client's own.
        transfer: requests in flight per call and the part size of concurrent ranged reads, in place of the
            client's own.
        write: part size, parts in flight and strategy of streamed writes (``compression`` must be
            ``None``: files are stored as written; fsspec's own ``compression=`` compresses them).
        **storage_options: fsspec's own (``asynchronous``, ``loop``, ``skip_instance_cache``, ...), and
            gcsfs's where they mean something here, so that ``storage_options`` written for gcsfs work
            unchanged: ``token`` (``"anon"``, ``"google_default"``, ``"cloud"`` or ``None``, a credentials
            file path, or a ``google.auth`` ``Credentials``), ``endpoint_url``, ``project``,
            ``requester_pays`` (``True``: bill ``project``; or the project to bill), ``consistency``
            (every read is checked by crc32c whatever it says), ``version_aware`` (see below), ``cache_timeout``
            (seconds a listing is kept, as ``listings_expiry_time``; 0 or less keeps none), ``block_size`` (how
            far ahead ``open()``'s readers read: 4 MiB by default, ``0`` only what is asked) and
            ``kms_key_name``, the Cloud KMS key every write (and what ``cp``, ``mv_file`` and ``merge`` make) is
            encrypted with unless the write names its own (gcsfs takes it per file). Any other gcsfs argument
            raises ``TypeError`` naming it, rather than being ignored. ``encoding``, ``errors``
            and ``newline`` are the defaults of text-mode ``open()`` (Hugging Face ``datasets`` passes a
            file's encoding so when it streams). ``project`` (with ``client=`` too) is also
            the project whose buckets ``ls("")`` lists and ``mkdir("bucket")`` creates, in
            ``default_location`` if given (else GCS's default, the ``US`` multi-region).

    Directory listings are cached as gcsfs caches them (fsspec's ``use_listings_cache``, default on,
    ``listings_expiry_time``, default never, and ``max_paths``): ``ls`` keeps each directory's listing in
    ``dircache``, and ``info``, ``exists``, ``isdir`` and ``ls`` answer from the cached listing of a path's
    parent. Writes and deletes through this filesystem drop the listings they change, so it never lists
    stale what it changed itself; what another process writes shows once the listing expires, after
    ``invalidate_cache()``, or with ``ls(..., refresh=True)``. Reads (``open``, ``cat``) always ask GCS.

    With ``version_aware=True`` (as gcsfs) a path ``bucket/name#<generation>`` names that version of the
    object, noncurrent ones too: ``info``, ``exists``, ``cat``, ``open``, ``get`` and ``cp`` read it, ``rm``
    deletes it for good; ``ls`` and ``find`` with ``versions=True`` list every version so named. Without it,
    ``#`` is part of a name.

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
        client: GCSClient | ClientConfig | None = None,
        retry: RetryConfig | None = None,
        transfer: TransferConfig | None = None,
        write: WriteConfig | None = None,
        **storage_options: Any,
    ) -> None:
        kms_key_name = storage_options.pop("kms_key_name", None)
        _listings_cache_options(storage_options)
        self._project: str | None = storage_options.get("project")
        self._project_known = bool(self._project)
        self.requester_pays: bool | str = storage_options.get("requester_pays", False)
        """gcsfs's: ``True`` bills ``project`` for requests to requester-pays buckets, a string bills that project."""
        self.default_location: str | None = storage_options.pop("default_location", None)
        version_aware = bool(storage_options.pop("version_aware", False))
        self.block_size: int | None = storage_options.pop("block_size", None)  # gcsfs's; open()'s default
        self._text = {
            key: storage_options.pop(key) for key in ("encoding", "errors", "newline") if key in storage_options
        }
        client = _client_from_gcsfs_options(client, storage_options)
        if not storage_options.get("asynchronous"):
            storage_options.setdefault("loop", io_loop())
        super().__init__(**storage_options)
        self.client = client_of(client, retry, transfer)
        """The client every request goes through: its ``config``, ``retry``, ``transfer`` and ``endpoint``."""
        self.write = write or WriteConfig()
        if self.write.compression is not None:
            raise ValueError(
                "GCSFileSystem stores files as written: pass compression= to fsspec.open instead of WriteConfig"
            )
        self.kms_key_name = kms_key(kms_key_name)
        """The Cloud KMS key every write (``cp`` too) encrypts with unless it names its own; ``None``: the
        bucket's default encryption."""
        self._gcs = Client(self.client)
        self.stats = self._gcs.stats
        self.version_aware = version_aware
        self._hierarchical: dict[str, bool] = {}  # bucket -> whether it has a hierarchical namespace
        self._invalidations = itertools.count()
        self._epoch = next(self._invalidations)  # changes with every invalidation of the listings cache
        self._writers: dict[int, weakref.ref[StreamingWriter]] = {}  # writers opened here, until seen closed

    def __getattr__(self, name: str) -> Any:
        if name in GCSFS_ONLY:
            raise AttributeError(
                f"GCSFileSystem has no {name!r} (gcsfs's): docs/gcsfs-compatibility.md says what to use instead"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def project(self) -> str | None:
        """The project whose buckets ``ls("")`` lists and in which ``mkdir("bucket")`` creates one: ``project=``,
        else ``GCSFS_DEFAULT_PROJECT``, else the credentials' own (see :func:`_default_project`), looked up once
        when first needed; ``None`` if none names one."""
        if not self._project_known:
            self._project, self._project_known = _default_project(self.client.config), True
        return self._project

    @property
    def on_google(self) -> bool:
        """Whether requests go to Google's endpoint (a ``*.googleapis.com`` host), not an emulator or another
        server, as gcsfs's ``on_google`` tells."""
        host = urlsplit(self.client.endpoint).hostname or ""
        return host == "googleapis.com" or host.endswith(".googleapis.com")

    @property
    def buckets(self) -> list[str]:
        """The names of ``project``'s buckets, as gcsfs's ``buckets``: ``ls("")``."""
        return self.ls("")  # type: ignore[no-any-return]

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the blocking methods run on: the I/O loop of the current process (fork-safe)."""
        return self._loop if self.asynchronous else io_loop()  # type: ignore[no-any-return]

    # -- paths -----------------------------------------------------------------------------------

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

    async def _pinned(self, path: str) -> ObjectInfo | None:
        """The version a ``name#<generation>`` path names, to read it; ``None`` for the live one."""
        if self._split_version(path)[2] is None:
            return None
        return _version(await self._info(path))

    def _context(self, budget: int | None = None) -> RequestContext:
        """A request context for one call (``budget``: bytes it may hold ahead, if not the transfer's)."""
        if budget is None:
            return self._gcs.context()
        return self._gcs.replace(transfer=replace(self.client.transfer, max_buffered_bytes=budget)).context()

    @staticmethod
    def _file(bucket: str, resource: dict[str, Any], versions: bool = False) -> dict[str, Any]:
        """The ``info`` of an object: its JSON resource as GCS gives it (``contentType``, ``md5Hash``,
        ``metadata``, ``timeCreated``, ``etag``...), as gcsfs returns it, with ``name`` the path (with
        ``versions``, ``name#<generation>``, as listings of versions name them), ``type``, ``size``,
        ``generation`` and ``metageneration`` as ints, and ``mtime``/``ctime``, aware datetimes of
        ``updated``/``timeCreated``."""
        entry = {
            **resource,
            "name": f"{bucket}/{resource['name']}" + (f"#{resource['generation']}" if versions else ""),
            "type": "file",
            "size": int(resource["size"]),
            "generation": int(resource["generation"]),
            "crc32c": resource.get("crc32c"),
        }
        if "metageneration" in resource:
            entry["metageneration"] = int(resource["metageneration"])
        for field, key in (("updated", "mtime"), ("timeCreated", "ctime")):
            if field in resource:
                entry[key] = _timestamp(resource[field])
        return entry

    @staticmethod
    def _directory(path: str) -> dict[str, Any]:
        return {"name": path.rstrip("/"), "type": "directory", "size": 0}

    # -- the listings cache ----------------------------------------------------------------------

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget the listings cached for ``path``, its parents and every directory under it (all of them if
        ``None``): the next ``ls``, ``info`` or ``exists`` there asks GCS. Writes and deletes through this
        filesystem do it themselves; call it after another process wrote, or pass ``refresh=True`` to ``ls``."""
        if path is None:
            self.dircache.clear()
            self._epoch = next(self._invalidations)
        else:
            self._drop_listings([path], under=True)

    def _drop_listings(self, paths: Iterable[str], under: bool = False, written: bool = False) -> None:
        """Forget the listings cached for ``paths`` and their parents, which an object written or deleted at
        one of them changes; with ``under``, those of every directory under them too (a tree removed), in
        one pass over the cache. With ``written`` (objects written, none deleted), a directory's listing that
        names the directory below already stays, as gcsfs keeps it: a write there cannot change it."""
        keys = {self._strip_protocol(path).rstrip("/") for path in paths}
        doomed: set[str] = set()
        for key in keys:
            doomed.add(key)
            child, parent = key, key.rpartition("/")[0]
            while parent and parent not in doomed:
                doomed.add(parent)
                child, parent = parent, parent.rpartition("/")[0]
                if written and parent and self._lists_directory(parent, child):
                    break
        for cached in list(self.dircache) if under else []:
            above = cached.rpartition("/")[0]
            while above and above not in keys:
                above = above.rpartition("/")[0]
            if above:
                doomed.add(cached)
        for key in doomed:
            self.dircache.pop(key, None)
        self._epoch = next(self._invalidations)

    def _lists_directory(self, key: str, name: str) -> bool:
        """Whether the listing cached for ``key`` names the directory ``name``."""
        listing = self.dircache.get(key) or []
        return any(entry["name"] == name and entry["type"] == "directory" for entry in listing)

    def _track(self, writer: StreamingWriter) -> StreamingWriter:
        """Note ``writer`` until it closes: the listings over its object are dropped now, and none is kept
        while it is open, as its object appears when it closes (which the writer tells no one)."""
        for number, ref in list(self._writers.items()):
            if (noted := ref()) is None or noted.closed:
                self._writers.pop(number, None)
        self._writers[id(writer)] = weakref.ref(writer)
        self._drop_listings([writer.url], written=True)
        return writer

    def _writing_under(self, key: str) -> bool:
        """Whether a writer of this filesystem that has not closed yet writes under the directory ``key``."""
        for ref in list(self._writers.values()):
            writer = ref()
            if writer is not None and not writer.closed and self._strip_protocol(writer.url).startswith(f"{key}/"):
                return True
        return False

    def _cached_entries(self, key: str) -> list[dict[str, Any]] | None:
        """Copies of the entries named ``key`` (a file, a directory or both) in the cached listing of its
        parent; ``None`` if that listing is not cached; ``FileNotFoundError`` if it is and names neither."""
        parent = key.rpartition("/")[0]
        listing = self.dircache.get(parent) if parent and not key.endswith("/") else None
        if listing is None:
            return None
        entries = [dict(entry) for entry in listing if entry["name"] == key]
        if not entries:
            url = format_url(*self.split_path(key))
            raise NotFoundError(
                f"{url}: no such object or directory in the cached listing of gs://{parent}/ (refresh=True or "
                "invalidate_cache() asks GCS again)",
                url=url,
            )
        return entries

    # -- metadata and listing --------------------------------------------------------------------

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        """fsspec's, and a path GCS would refuse does not exist (``isdir`` says so already)."""
        try:
            return await super()._exists(path, **kwargs)  # type: ignore[no-any-return]
        except InvalidPathError:
            return False

    @_on_io_loop
    async def _info(self, path: str, refresh: bool = False, **kwargs: Any) -> dict[str, Any]:
        """What ``path`` is: from the cached listing of its parent if there is one (as gcsfs answers), else
        from GCS; ``refresh=True`` always asks GCS (reads do: they need the live version)."""
        bucket, name, generation = self._split_version(path)
        cached = None if refresh or not name or generation is not None else self._cached_entries(f"{bucket}/{name}")
        if cached:
            return next((entry for entry in cached if entry["type"] == "file"), cached[0])
        context = self._context()
        if not name:
            await check_bucket(context, bucket)  # NotFoundError, a FileNotFoundError, if missing
            return self._directory(bucket)
        directory_only = self._strip_protocol(path).endswith("/")  # "f.txt/" is not the object f.txt
        resource = None if directory_only else await object_resource(context, bucket, name, None, generation=generation)
        if resource is not None:
            return self._file(bucket, resource)
        if generation is not None:
            url = f"{format_url(bucket, name)}#{generation}"
            raise NotFoundError(f"{url}: no such object version", url=url)
        if await self._is_directory(context, bucket, name):
            return self._directory(f"{bucket}/{name}")
        raise NotFoundError(f"{format_url(bucket, name)}: no such object or directory", url=format_url(bucket, name))

    async def _versions(self, context: RequestContext, bucket: str, name: str) -> list[dict[str, Any]]:
        """Every version, noncurrent ones too, of the object ``name`` and of the objects under ``name/`` (all
        of the bucket's for an empty name), each named ``name#<generation>``, in name order."""
        params = {
            "prefix": name,
            "versions": "true",
            "maxResults": MAX_PAGE_SIZE,
            "fields": "items,nextPageToken",  # every version's whole resource, as info gives it
        }
        under = f"{name.rstrip('/')}/" if name else ""
        entries = [
            self._file(bucket, item, versions=True)
            async for page in _pages(context, bucket, params)
            for item in page.get("items", [])
            if item["name"] == name or item["name"].startswith(under)
        ]
        return sorted(entries, key=lambda entry: entry["name"])

    @staticmethod
    async def _is_directory(context: RequestContext, bucket: str, name: str) -> bool:
        """Whether ``name/`` holds objects, or is a folder of a bucket with a hierarchical namespace (empty
        ones too), with ``storage.objects.list`` alone: a listing of ``name``'s level from ``name/`` to
        ``name0`` (``0`` follows ``/``) holds at most that one prefix."""
        name = name.rstrip("/")
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
        return any([page.get("prefixes") async for page in _pages(context, bucket, params)])

    @_on_io_loop
    async def _ls(
        self, path: str, detail: bool = False, refresh: bool = False, versions: bool = False, **kwargs: Any
    ) -> list[Any]:
        """The entries one level under ``path`` (a file lists as itself). A directory's listing is kept in
        ``dircache`` (fsspec's options ``use_listings_cache``, ``listings_expiry_time``, ``max_paths``) and
        answers later calls until it expires or is invalidated; ``refresh=True`` drops it and lists anew.
        ``versions``: every version of each file, noncurrent ones too, each named ``name#<generation>``, as
        gcsfs lists them (never cached)."""
        if not self._strip_protocol(path):  # "" or "gs://": the project's buckets, as gcsfs lists them
            buckets = await list_buckets(self._context(), self._project_for("list buckets"))
            found = sorted(({**b, **self._directory(b["name"])} for b in buckets), key=lambda b: b["name"])
            return found if detail else [b["name"] for b in found]
        bucket, name = self.split_path(path)
        key = f"{bucket}/{name}".rstrip("/")
        if refresh:
            self.invalidate_cache(key)
        cached = None if versions else self.dircache.get(key)
        if cached is None and not versions:
            itself = self._cached_entries(key)  # a file lists as itself; a name its parent lacks raises
            cached = itself if itself and all(entry["type"] == "file" for entry in itself) else None
        if cached is not None:
            return [dict(entry) for entry in cached] if detail else [entry["name"] for entry in cached]
        keep = not versions and not self._writing_under(key)  # an open writer's object shows when it closes
        epoch = self._epoch  # an invalidation while listing: the listing may not hold what was changed
        prefix = f"{name}/" if name else ""
        params: dict[str, Any] = {
            "prefix": prefix,
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",  # folders of a hierarchical namespace, empty ones too
            "maxResults": MAX_PAGE_SIZE,
            "fields": LS_FIELDS,
            **({"versions": "true"} if versions else {}),
        }
        context = self._context()
        entries: list[dict[str, Any]] = []
        folders: set[str] = set()  # a page may name again a prefix an earlier page named
        placeholder = False  # a zero-byte "name/" object: a folder made in the console, empty or not
        async for page in _pages(context, bucket, params):
            folders.update(page.get("prefixes", []))
            for item in page.get("items", []):
                if item["name"] == prefix and item["size"] == "0":
                    placeholder = True
                else:
                    entries.append(self._file(bucket, item, versions))
        entries += (self._directory(f"{bucket}/{p}") for p in folders - {TEMPORARY_PREFIX})
        if placeholder:  # the folder lists itself, as gcsfs lists it (and as info describes it)
            entries.append(self._directory(key))
        entries.sort(key=lambda entry: entry["name"])
        if entries and keep and self._epoch == epoch:
            self.dircache[key] = [dict(entry) for entry in entries]
        if not entries and name:
            entries = [await self._info(path)]  # a file lists as itself; nothing at all raises
            if entries[0]["type"] == "directory":
                entries = []
            elif versions:  # each of its versions
                entries = await self._versions(context, bucket, name)
        return entries if detail else [entry["name"] for entry in entries]

    def created(self, path: str) -> datetime.datetime:
        """When the object was created (its ``timeCreated``), timezone-aware, as gcsfs gives it."""
        return self._file_time(path, "ctime")

    def modified(self, path: str) -> datetime.datetime:
        """When the object or its metadata last changed (its ``updated``), timezone-aware, as gcsfs gives it."""
        return self._file_time(path, "mtime")

    def _file_time(self, path: str, key: str) -> datetime.datetime:
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(f"{path} is a directory: GCS keeps times for objects only")
        return info[key]  # type: ignore[no-any-return]

    async def _getxattr(self, path: str, attr: str) -> str:
        """The user metadata value ``attr`` of an object; ``KeyError`` if it has none, as gcsfs raises."""
        return (await self._info(path)).get("metadata", {})[attr]  # type: ignore[no-any-return]

    getxattr = sync_wrapper(_getxattr)

    @_on_io_loop
    async def _setxattrs(
        self,
        path: str,
        content_type: str | None = None,
        content_encoding: str | None = None,
        fixed_key_metadata: dict[str, str | None] | None = None,
        **metadata: str | None,
    ) -> dict[str, str]:
        """Change an object's metadata in place, as gcsfs's ``setxattrs``: the user metadata ``metadata``
        (a key given ``None`` is removed; others are kept), ``content_type``, ``content_encoding`` and the
        ``fixed_key_metadata`` (``cache_control``, ``content_disposition``, ``content_encoding``,
        ``content_language``, ``custom_time``; ``None`` clears one). Returns the user metadata after it.

        One PATCH, conditional on the generation and metageneration read first, so retried safely; an object
        changed meanwhile is read again and patched anew."""
        bucket, name, _ = self._object(path)
        patch: dict[str, Any] = {"metadata": user_metadata(metadata, removable=True)}
        patch.update(fixed_fields(fixed_key_metadata, removable=True))
        if content_encoding is not None:
            patch.update(fixed_fields({"content_encoding": content_encoding}))
        if content_type is not None:
            patch["contentType"] = ObjectAttributes.of(content_type).content_type
        try:
            resource = await patch_object(self._context(), bucket, name, patch)
        finally:  # cached listings describe the object's metadata; a failed request may have patched it
            self._drop_listings([path], written=True)
        return resource.get("metadata", {})  # type: ignore[no-any-return]

    setxattrs = sync_wrapper(_setxattrs)

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
        prefix: str = "",
        **kwargs: Any,
    ) -> Any:
        """Everything under ``path`` (and ``path`` itself if it is an object) from one parallel flat listing,
        at most ``maxdepth`` levels below ``path`` if given (as gcsfs does: a missing bucket raises).
        ``prefix``, as gcsfs's: only the names under ``path`` that start with ``path/prefix``, which GCS
        selects (its ``prefix`` parameter); ``path`` itself is not among them, and with ``withdirs`` only the
        directories that start so are. ``match_glob``: a GCS ``matchGlob`` that GCS may apply to the listing
        (the caller still filters). It neither reads nor fills the listings cache."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__} {brief(prefix)}")
        bucket, name, generation = self._split_version(path)
        within = name
        if prefix:
            within = (name if not name or name.endswith("/") else f"{name}/") + prefix
            self.split_path(f"{bucket}/{within}")  # a prefix GCS would refuse raises InvalidPathError
        if generation is not None:  # one version: itself alone, never the live object or what is under its name
            version = self._strip_protocol(path)
            try:
                found = {version: {**await self._info(path), "name": version}}
            except FileNotFoundError:
                found = {}
        elif kwargs.get("versions"):  # every version of every object, each named name#<generation>, as gcsfs does
            found = {
                entry["name"]: entry
                for entry in await self._versions(self._context(), bucket, name)
                if entry["name"].startswith(f"{bucket}/{within}")
            }
        else:
            top = f"{bucket}/{name}".rstrip("/")
            # a whole listing is kept as gcsfs keeps it, but not for an rm, which drops what it listed
            whole = not prefix and match_glob is None and not self._writing_under(top) and _LISTED.get() is None
            epoch = self._epoch  # an invalidation while listing: the listing may not hold what was changed
            batches = [
                batch
                async for batch in list_objects_async(
                    self._gcs,
                    bucket,
                    within,
                    MAX_PAGE_SIZE,
                    LISTING_CONCURRENCY,
                    match_glob=match_glob,
                    as_prefix=bool(prefix),
                    item_fields=None,
                    placeholders=True,
                )
            ]
            found = {entry["name"]: entry for batch in batches for entry in (self._file(bucket, b) for _, b in batch)}
            if whole and await self._objects_tell_folders(bucket):
                self._keep_listings(top, [entry for n, entry in found.items() if n.startswith(f"{top}/")], epoch)
        if withdirs:
            top = f"{bucket}/{within}" if prefix else f"{bucket}/{name}".rstrip("/")
            for entry_name in list(found):
                parent = entry_name.rpartition("/")[0]
                while "/" in parent and parent.startswith(top) and parent not in found:  # never the bucket
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

    async def _objects_tell_folders(self, bucket: str) -> bool:
        """Whether a listing of the bucket's objects tells all its folders: not in a hierarchical namespace,
        whose empty folders hold no object."""
        try:
            return not await self._has_folders(self._context(), bucket)
        except NotFoundError:  # GCS answers it for every bucket it lists: a server without it has no folders
            self._hierarchical[bucket] = False
            return True
        except GCSError:  # not known: the listings stay GCS's
            return False

    async def _has_folders(self, context: RequestContext, bucket: str) -> bool:
        """Whether the bucket has a hierarchical namespace, whose folders outlive their objects (asked once)."""
        if bucket not in self._hierarchical:
            layout = await storage_layout(context, bucket)
            self._hierarchical[bucket] = bool((layout.get("hierarchicalNamespace") or {}).get("enabled"))
        return self._hierarchical[bucket]

    def _keep_listings(self, top: str, entries: list[dict[str, Any]], epoch: int) -> None:
        """Keep in ``dircache`` the listing of ``top`` and of every directory under it, as ``ls`` lists them,
        from ``entries``: every object under ``top/`` (as gcsfs's ``find`` does), unless the listings cache
        was invalidated since ``epoch``."""
        listings: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        for entry in entries:
            child = entry["name"].rpartition("/")[0]
            if entry["name"].endswith("/") and entry["size"] == 0:  # a folder placeholder: the folder lists itself
                listings.setdefault(child, {})[child, "directory"] = self._directory(child)
            else:
                listings.setdefault(child, {})[entry["name"], "file"] = entry
            while len(child) > len(top):  # each directory is an entry of its parent's listing
                parent = child.rpartition("/")[0]
                listings.setdefault(parent, {})[child, "directory"] = self._directory(child)
                child = parent
        if self._epoch != epoch:
            return
        for key, listing in listings.items():
            ordered = sorted(listing.items(), key=lambda item: (item[0][0], item[0][1] != "file"))
            self.dircache[key] = [dict(entry) for _, entry in ordered]

    # -- URLs ------------------------------------------------------------------------------------

    def url(self, path: str, generation: int | None = None) -> str:
        """The JSON API URL of the object's bytes on the configured endpoint (of ``generation``, or of the one
        a ``name#<generation>`` path names), as gcsfs gives it, but with the name's ``/`` percent-encoded as
        GCS's JSON API asks. Reading it needs credentials, unless the object is public."""
        bucket, name, _ = self._object(path, version=True)
        generation = _one_generation(path, generation, self._split_version(path)[2])
        return media_read_url(self.client.endpoint, bucket, name, generation)

    def sign(
        self,
        path: str,
        expiration: int | datetime.timedelta | datetime.datetime = 100,
        *,
        now: datetime.datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """A V4 signed URL of the object on the configured endpoint: whoever holds it may make that one request
        (``GET`` unless ``method=``) without credentials, for ``expiration`` (seconds, a ``timedelta``, or the
        moment it ends; seven days at most) from ``now`` (the current time if ``None``).

        Signed with the private key of the filesystem's service-account credentials (``token=`` a key file or
        ``service_account.Credentials``); others raise ``AccessDeniedError``. Takes the arguments gcsfs passes
        on to google-cloud-storage's ``generate_signed_url``: ``method`` (``"RESUMABLE"`` starts a resumable
        upload), ``content_md5``, ``content_type``, ``response_type``, ``response_disposition``,
        ``generation`` (or a ``name#<generation>`` path), ``headers``, ``query_parameters``, and ``version``,
        which must be ``"v4"`` (gcsfs's default is V2, which GCS keeps for old keys only); any other raises
        ``TypeError`` naming it."""
        unknown = sorted(set(kwargs) - SIGN_OPTIONS)
        if unknown:
            raise TypeError(f"sign() got arguments it does not take: {', '.join(unknown)}")
        if kwargs.get("version", "v4") != "v4":
            raise ValueError(f"only V4 signed URLs are made here, not {kwargs['version']!r}")
        bucket, name, _ = self._object(path, version=True)
        generation = _one_generation(path, kwargs.get("generation"), self._split_version(path)[2])
        headers = dict(kwargs.get("headers") or {})
        headers.update({key: kwargs[arg] for arg, key in _SIGNED_HEADERS.items() if kwargs.get(arg) is not None})
        query = dict(kwargs.get("query_parameters") or {})
        query.update({key: kwargs[arg] for arg, key in _SIGNED_QUERY.items() if kwargs.get(arg) is not None})
        if generation is not None:
            query["generation"] = generation
        return signed_url(
            signing_credentials(self.client.config),
            self.client.endpoint,
            bucket,
            name,
            expiration=expiration,
            method=kwargs.get("method", "GET"),
            headers=headers,
            query=query,
            now=now,
        )

    # -- reading ---------------------------------------------------------------------------------

    @_in_bulk_on_io_loop
    async def _cat(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        """fsspec's; the paths' reads share one request context: at most ``TransferConfig.max_in_flight``
        requests at once, on the connections the earlier ones leave open."""
        token = _CAT_CONTEXT.set(self._context(budget=sys.maxsize))
        try:
            return await super()._cat(path, *args, **kwargs)
        finally:
            _CAT_CONTEXT.reset(token)

    @_on_io_loop
    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        _, _, url = self._object(path, version=True)
        if not start and end is None:  # the whole object: one GET (ranges above a part), checked by crc32c
            pinned = await self._pinned(path)
            context = _CAT_CONTEXT.get() or self._context(budget=sys.maxsize)
            data, _ = await fetch_object(context, url, pinned, 0)
            return data if isinstance(data, bytes) else b"".join(data)  # type: ignore[arg-type]
        info = await self._info(path, refresh=True)
        if info["type"] != "file":
            raise IsADirectoryError(f"{url} is a directory")
        size = info["size"]
        start, end = _resolve(start, size), _resolve(end, size) if end is not None else size
        return await read_span_async(url, _version(info), start, end, self._gcs)

    @_on_io_loop
    async def _get_file(self, rpath: str, lpath: str, callback: Callback = DEFAULT_CALLBACK, **kwargs: Any) -> None:
        """Download one object to ``lpath``; an object larger than a few parts streams through, read ahead
        while it is written. ``lpath`` is replaced only once every byte arrived and checked. A folder placeholder
        (``bucket/x/``) makes ``lpath`` a directory."""
        _, name, url = self._object(rpath, version=True)
        if name.endswith("/"):  # a folder placeholder (a recursive get hands them over): an empty folder here
            os.makedirs(lpath, exist_ok=True)
            return
        try:
            pinned = await self._pinned(rpath)
            data, _ = await fetch_object(self._context(budget=4 * self.client.transfer.part_size), url, pinned, 0)
        except NotFoundError:
            if not await self._isdir(rpath):  # a recursive get hands directories over too
                raise
            os.makedirs(lpath, exist_ok=True)
            return
        await asyncio.to_thread(_write_local, data, lpath, callback)

    def open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        """fsspec's; a text writer (``"w"``, ``"x"``) publishes nothing when its ``with`` block is left
        by an exception, as a binary one does. Text modes take the filesystem's ``encoding``, ``errors``
        and ``newline`` unless given their own."""
        if "b" not in mode:
            kwargs = {**self._text, **kwargs}
        if "b" in mode or "r" in mode:
            return super().open(path, mode, **kwargs)
        text = {key: kwargs.pop(key) for key in ("encoding", "errors", "newline") if key in kwargs}
        writer = _TextWriter(super().open(path, mode.replace("t", "") + "b", **kwargs), **text)
        writer.mode = mode  # as open() gives a text file its mode; its name is its buffer's
        return writer

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
        only if the object does not exist); within ``fs.transaction``, writers publish when it commits.
        A writer takes ``content_type`` (else guessed from the name's extension, as gcsfs does, or
        ``application/octet-stream``), ``metadata`` (user metadata, str to str) and ``fixed_key_metadata``
        (gcsfs's: ``cache_control``, ``content_disposition``, ``content_encoding``, ``content_language``,
        ``custom_time``) and ``kms_key_name`` (else the filesystem's); any other keyword raises ``TypeError``
        naming it. It has ``fs``, ``path``, ``name`` and ``mode``, as fsspec's files do."""
        if mode == "rb":
            block_size = self.block_size if block_size is None else block_size
            return GCSFile(self, path, block_size=block_size, cache_type=cache_type, cache_options=cache_options)
        if mode in ("wb", "xb"):
            _, _, url = self._object(path)
            attributes = self._attributes(kwargs, path)
            if mode == "xb" and self.exists(path):  # said at open; the publish checks again, atomically
                raise FileExistsError(f"{url} exists")
            writer = self._new_writer(url, mode == "xb", attributes)
            opened = writer if autocommit else StagedWriter(writer)
            # what fsspec's buffered files tell of themselves
            opened.fs, opened.path, opened.name, opened.mode = self, path, path, mode
            return opened
        raise NotImplementedError(
            f"mode {mode!r}: GCS objects are written whole, never appended to or updated in place"
        )

    # -- writing ---------------------------------------------------------------------------------

    @_on_io_loop
    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Write ``value`` as one object; ``kwargs``: what ``open(path, "wb")`` takes (see ``_open``)."""
        bucket, name, url = self._object(path)
        only_if_new = _only_if_new(mode)
        attributes = self._attributes(kwargs, path)
        data = bytes(value)
        if len(data) <= self.write.part_size and not self._intrans:
            context = self._context()
            replaced = 0 if only_if_new else await live_generation(context, bucket, name)
            try:
                await create_object(
                    context,
                    bucket,
                    name,
                    data,
                    if_generation_match=replaced,
                    content_type=attributes.content_type,
                    fields=attributes.fields(),
                    kms_key_name=attributes.kms_key_name,
                )
            finally:  # a failed request may have written all the same
                self._drop_listings([path], written=True)
        else:
            await asyncio.to_thread(self._write_chunks, url, [data], only_if_new, attributes)

    @_on_io_loop
    async def _put_file(
        self, lpath: str, rpath: str, mode: str = "overwrite", callback: Callback = DEFAULT_CALLBACK, **kwargs: Any
    ) -> None:
        """Upload one file; ``kwargs``: what ``open(path, "wb")`` takes (see ``_open``), the content type
        guessed from the local file's name, as gcsfs does."""
        if os.path.isdir(lpath):
            return  # GCS has no directories: the files under one carry it
        _, _, url = self._object(rpath)
        only_if_new = _only_if_new(mode)
        attributes = self._attributes(kwargs, lpath)
        callback.set_size(os.path.getsize(lpath))

        def chunks() -> Iterable[bytes]:
            with open(lpath, "rb") as local:
                while chunk := local.read(self.write.part_size):
                    yield chunk
                    callback.relative_update(len(chunk))

        await asyncio.to_thread(self._write_chunks, url, chunks(), only_if_new, attributes)

    def _attributes(self, options: dict[str, Any], name: str) -> ObjectAttributes:
        """The attributes a write's keyword arguments ``options`` give the object (see ``_open``), its content
        type guessed from ``name`` if not given, its KMS key the filesystem's if not given; ``TypeError``
        naming any other keyword."""
        unknown = sorted(set(options) - set(WRITE_OPTIONS))
        if unknown:
            raise TypeError(f"GCSFileSystem writes take {', '.join(WRITE_OPTIONS)}; got {', '.join(unknown)}")
        content_type = options.get("content_type") or mimetypes.guess_type(name)[0] or "application/octet-stream"
        return ObjectAttributes.of(
            content_type,
            options.get("metadata"),
            options.get("fixed_key_metadata"),
            options.get("kms_key_name", self.kms_key_name),
        )

    def _new_writer(self, url: str, only_if_new: bool, attributes: ObjectAttributes) -> StreamingWriter:
        """A streamed writer of ``url`` (a name ending in ``/`` is meant), tracked until it closes."""
        writer = new_writer(
            url, self._gcs, self.write, only_if_new=only_if_new, folder_name=True, attributes=attributes
        )
        return self._track(writer)

    def _write_chunks(self, url: str, chunks: Iterable[bytes], only_if_new: bool, attributes: ObjectAttributes) -> None:
        """Stream ``chunks`` out as ``url``, published at the end, or within a transaction when it commits."""
        writer = self._new_writer(url, only_if_new, attributes)
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
        """Copy one object server-side (the version a ``name#<generation>`` source names, if it does); a
        directory (met by a recursive ``copy`` or ``mv``) has nothing to copy but its objects, which are copied
        on their own, as fsspec's filesystems make a directory there."""
        source, destination = self._object(path1, version=True), self._object(path2)
        generation = self._split_version(path1)[2]
        try:
            await rewrite_object(
                self._context(),
                source[:2],
                destination[:2],
                source_generation=generation,
                kms_key_name=self.kms_key_name,
            )
        except NotFoundError:
            if generation is not None or not await self._is_directory(self._context(), *source[:2]):
                raise
        finally:
            self._drop_listings([path2], written=True)

    @_on_io_loop
    async def _mv_file(self, path1: str, path2: str) -> None:
        """Move one object: copy its live version in GCS, then delete the source if it is still that version
        (``ifGenerationMatch``: in a bucket with object versioning it stays as a noncurrent version, as
        gcsfs leaves it). A source replaced in between is not deleted: its new bytes were not moved."""
        (bucket, name, url), destination = self._object(path1), self._object(path2)
        context = self._context()
        generation = await live_generation(context, bucket, name)
        if not generation:
            raise NotFoundError(f"{url}: no such object", url=url)
        try:
            copied = (bucket, name)
            await rewrite_object(
                context, copied, destination[:2], source_generation=generation, kms_key_name=self.kms_key_name
            )
            with contextlib.suppress(PreconditionFailedError):  # replaced since: the newer object stays
                await delete_object(context, bucket, name, if_generation_match=generation)
        finally:
            self._drop_listings([path1, path2])

    mv_file = sync_wrapper(_mv_file)

    @_in_bulk_on_io_loop
    async def _mv(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Move each object on its own (:meth:`_mv_file`: a rewrite in GCS, then a delete of the generation
        copied), as gcsfs moves them, at most ``batch_size`` at once (else ``TransferConfig.max_in_flight``),
        sources and destinations paired as ``copy`` pairs them. A directory named without ``recursive=True``
        raises ``IsADirectoryError`` (gcsfs moves nothing); those a glob matches are skipped. Every object is
        tried; the first failure is raised after, but a directory's own path, which has no object to move, is no
        failure. Any other keyword raises ``TypeError`` naming it."""
        if kwargs:
            raise TypeError(f"mv got arguments it does not take: {', '.join(sorted(kwargs))}")
        if path1 == path2:
            return
        if isinstance(path1, list) and isinstance(path2, list):
            sources, targets = [self._strip_protocol(p) for p in path1], [self._strip_protocol(p) for p in path2]
        else:
            sources = await self._expand_path(path1, recursive=recursive, maxdepth=maxdepth)
            named = isinstance(path1, str)
            if named and (not recursive or maxdepth is not None):  # directories are moved only with their tree
                kept = [p for p in sources if not p.endswith("/") and not await self._isdir(p)]
                if not kept and not has_magic(path1) and sources:
                    raise IsADirectoryError(f"{path1} is a directory: move it with recursive=True")
                sources = kept
            if not sources:
                return
            into = isinstance(path2, str) and (path2.endswith("/") or await self._isdir(path2))
            # as fsspec's copy: a glob's one object, or a path without "/" moved into a directory, keeps its name
            keep_name = named and (
                (has_magic(path1) and len(sources) == 1) or (not has_magic(path1) and into and not path1.endswith("/"))
            )
            targets = other_paths(sources, path2, exists=keep_name, flatten=not named)
        if len(sources) != len(targets):
            raise ValueError(f"mv got {len(sources)} sources but {len(targets)} destinations")
        slots = asyncio.Semaphore(batch_size or self.client.transfer.max_in_flight)

        async def move(source: str, target: str) -> None:
            async with slots:
                await self._mv_file(source, target)

        outcomes = await asyncio.gather(
            *(move(s, t) for s, t in zip(sources, targets, strict=True)), return_exceptions=True
        )
        failed = [
            (s, outcome) for s, outcome in zip(sources, outcomes, strict=True) if isinstance(outcome, BaseException)
        ]
        holding = {folder for source in sources for folder in _folders_of(source)} if failed else set()
        for source, outcome in failed:
            if recursive and isinstance(outcome, FileNotFoundError) and source.rstrip("/") in holding:
                continue  # a directory's own path, listed beside its objects
            raise outcome

    mv = sync_wrapper(_mv)

    def merge(self, path: str, paths: list[str]) -> None:
        """Write ``path`` as the concatenation of the objects ``paths``, in their order, by one compose in
        GCS: no bytes pass through this process. The sources must be in ``path``'s bucket and at most
        ``MAX_SOURCES`` (GCS's limit for one compose); an existing ``path`` is replaced.

        Example:
            >>> from torchdata_gcs.testing import Emulator
            >>> with Emulator() as emulator:
            ...     emulator.create_bucket("demo")
            ...     fs = GCSFileSystem(client=emulator.client_config)
            ...     _ = fs.pipe({"demo/a": b"al", "demo/b": b"pha"})
            ...     fs.merge("demo/ab", ["demo/a", "demo/b"])
            ...     fs.cat("demo/ab")
            b'alpha'
        """
        sync(self.loop, self._merge, path, paths)

    @_on_io_loop
    async def _merge(self, path: str, paths: list[str]) -> None:
        bucket, name, url = self._object(path)
        sources = [self._object(source) for source in paths]
        if not sources or len(sources) > MAX_SOURCES:
            raise ValueError(f"merge takes 1 to {MAX_SOURCES} objects (one GCS compose), got {len(sources)}")
        elsewhere = [source_url for source_bucket, _, source_url in sources if source_bucket != bucket]
        if elsewhere:
            raise ValueError(f"merge composes objects of {url}'s bucket only, not {elsewhere[0]}")
        context = self._context()
        found = await asyncio.gather(
            *(
                object_resource(context, bucket, source, "size,generation,crc32c", missing_ok=False)
                for _, source, _ in sources
            )
        )
        pieces = [(crc32c_value(resource["crc32c"]), int(resource["size"])) for resource in found if resource]
        attributes = self._attributes({}, path)
        try:
            await compose_object(
                context,
                bucket,
                name,
                [
                    (source, int(resource["generation"]))
                    for (_, source, _), resource in zip(sources, found, strict=True)
                    if resource
                ],
                if_generation_match=await live_generation(context, bucket, name),
                composite=(sum(size for _, size in pieces), crc32c_base64(crc32c_of_concatenation(pieces))),
                content_type=attributes.content_type,
                kms_key_name=attributes.kms_key_name,
            )
        finally:
            self._drop_listings([path], written=True)

    # -- removing and directories ----------------------------------------------------------------

    @_on_io_loop
    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        bucket, name, url = self._object(path, version=True)
        try:
            deleted = await delete_object(self._context(), bucket, name, generation=self._split_version(path)[2])
        finally:
            self._drop_listings([path])
        if not deleted:
            raise NotFoundError(f"{url}: no such object", url=url)

    @_in_bulk_on_io_loop
    async def _rm(
        self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None, **kwargs: Any
    ) -> None:
        """Delete every object ``path`` expands to; directories go with their objects (a directory without
        ``recursive=True`` raises ``IsADirectoryError``), and with ``recursive=True`` and no ``maxdepth`` the
        folders of a hierarchical namespace go too; a glob without it skips the directories it matches. Buckets
        are never deleted: one named without ``recursive=True`` raises ``IsADirectoryError`` (gcsfs deletes an
        empty one), and with it only its objects go (an empty one: nothing, and no error).

        One object goes by a plain delete; more go in batch requests of up to 100 deletes, each only if the
        object is still the generation its listing found (else its live generation is asked first), and an
        object replaced since is deleted alone, as a single ``rm`` deletes it."""
        listed: dict[str, int] = {}
        watching = _LISTED.set(listed)
        try:
            paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        finally:
            _LISTED.reset(watching)
        context = self._context()
        objects = [(p, *self._object(p, version=True)[:2]) for p in paths if self.split_path(p)[1]]
        buckets = [p for p in paths if not self.split_path(p)[1]]
        if buckets and not recursive:  # gcsfs deletes an empty bucket here; buckets are not deleted by rm
            await check_bucket(context, buckets[0])  # NotFoundError, a FileNotFoundError, if missing
            raise IsADirectoryError(f"{buckets[0]} is a bucket: rm does not delete buckets")
        try:
            deleted = await self._delete_objects(context, objects, listed)
        finally:
            self._drop_listings(p for p, _, _ in objects)
        named = {self._strip_protocol(p) for p in ([path] if isinstance(path, str) else path)}
        missed = [p for (p, _, _), gone in zip(objects, deleted, strict=True) if not gone]
        if not recursive:  # a directory a glob matched is skipped, as gcsfs does; one named is refused
            missed = [p for p in missed if p in named or not await self._isdir(p)]
        emptied = {
            folder for p, gone in zip(objects, deleted, strict=True) if gone for folder in _folders_of(p[0])
        }  # named with what they held (as rm(find(path, withdirs=True)) names them), gone with it
        for p in missed if not recursive else []:
            if await self._isdir(p):
                raise IsADirectoryError(f"{p} is a directory: remove it with recursive=True")
            if self._strip_protocol(p).rstrip("/") not in emptied:
                raise NotFoundError(f"gs://{p}: no such object", url=f"gs://{p}")
        if recursive:
            tops = [] if maxdepth is not None else [path] if isinstance(path, str) else path  # deeper ones stay
            tops = [top for top in tops if self._split_version(top)[2] is None]  # a version is no folder
            folders = await asyncio.gather(
                *(self._remove_folders(context, *self.split_path(top)) for top in tops if not has_magic(top))
            )
            if not any(deleted) and not any(folders) and not buckets:  # an existing bucket names something
                raise NotFoundError(f"nothing to remove under {path}", url=str(path))

    async def _remove_folders(self, context: RequestContext, bucket: str, name: str) -> int:
        """Delete the folder ``name/`` of a bucket with a hierarchical namespace and every folder under it,
        deepest first, once their objects are gone (GCS deletes only empty folders, and keeps them otherwise);
        returns how many went, folder placeholders included. A flat bucket pays one listing: only if something
        is left under ``name/`` are its placeholders looked for and the bucket's storage layout asked (once per
        bucket). Without ``storage.folders.delete`` the folders stay, with a warning: the objects are gone,
        which is what removing them asked. A whole bucket (``name`` empty) pays one listing, for placeholders."""
        if not name:
            return await self._remove_placeholders(context, bucket, name)
        if not await self._is_directory(context, bucket, name):
            return 0
        placeholders = await self._remove_placeholders(context, bucket, name)
        if not await self._has_folders(context, bucket):
            return placeholders
        level, folders = [f"{name}/"], [f"{name}/"]
        while level:
            below = await asyncio.gather(*(self._subfolders(context, bucket, folder) for folder in level))
            level = [folder for found in below for folder in found]
            folders += level
        removed = placeholders
        try:
            for depth in sorted({folder.count("/") for folder in folders}, reverse=True):
                at_depth = [folder for folder in folders if folder.count("/") == depth]
                removed += sum(await asyncio.gather(*(delete_folder(context, bucket, folder) for folder in at_depth)))
        except AccessDeniedError as exc:
            logger.warning(
                "the objects under %s are removed, its empty folders stay: %s", format_url(bucket, name), exc
            )
        finally:
            self.invalidate_cache(f"{bucket}/{name}")
        return removed

    @staticmethod
    async def _remove_placeholders(context: RequestContext, bucket: str, name: str) -> int:
        """Delete the folder placeholders under ``name/`` (the whole bucket if ``name`` is empty): zero-byte
        ``.../`` objects, such as ``touch("dir/")`` writes (left if made meanwhile); each only while it is the
        generation listed. How many went."""
        params = {
            "prefix": f"{name}/" if name else "",
            "maxResults": MAX_PAGE_SIZE,
            "fields": "items(name,size,generation),nextPageToken",
        }
        left = [
            (item["name"], int(item["generation"]))
            async for page in _pages(context, bucket, params)
            for item in page.get("items", [])
            if item["name"].endswith("/") and int(item["size"]) == 0
        ]
        gone = await asyncio.gather(*(delete_object(context, bucket, n, if_generation_match=g) for n, g in left))
        return sum(gone)

    @staticmethod
    async def _subfolders(context: RequestContext, bucket: str, folder: str) -> list[str]:
        """The folders (and prefixes of objects) one level under ``folder``."""
        params = {
            "prefix": folder,
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",
            "maxResults": MAX_PAGE_SIZE,
            "fields": "prefixes,nextPageToken",
        }
        listed = [prefix async for page in _pages(context, bucket, params) for prefix in page.get("prefixes", [])]
        return list(dict.fromkeys(listed))  # a page may name again a prefix an earlier page named

    async def _delete_objects(
        self, context: RequestContext, objects: list[tuple[str, str, str]], listed: dict[str, int]
    ) -> list[bool]:
        """Delete ``objects`` (path, bucket, name), those of ``listed`` paths by that generation; whether each
        was there to delete."""
        pinned = {p: g for p, _, _ in objects if (g := self._split_version(p)[2]) is not None}
        if len(objects) == 1 or pinned:  # a version named by its generation goes for good, by a delete of its own
            deletes = (delete_object(context, bucket, name, generation=pinned.get(p)) for p, bucket, name in objects)
            return list(await asyncio.gather(*deletes))
        unknown = [(bucket, name) for p, bucket, name in objects if p not in listed]
        found = await asyncio.gather(*(live_generation(context, bucket, name) for bucket, name in unknown))
        generations = {
            **dict(zip(unknown, found, strict=True)),
            **{(b, n): listed[p] for p, b, n in objects if p in listed},
        }
        deleted = dict.fromkeys(generations, False)
        for bucket in {bucket for _, bucket, _ in objects}:
            versions = [(n, g) for (b, n), g in generations.items() if b == bucket and g]
            for (name, _), outcome in zip(
                versions, await delete_objects(context, bucket, versions, live=True), strict=True
            ):
                if isinstance(outcome, PreconditionFailedError):  # replaced since it was listed
                    outcome = await delete_object(context, bucket, name)
                if isinstance(outcome, BaseException):
                    raise outcome
                deleted[bucket, name] = outcome
        return [deleted[bucket, name] for _, bucket, name in objects]

    @_on_io_loop
    async def _mkdir(self, path: str, create_parents: bool = False, location: str | None = None, **kwargs: Any) -> None:
        """As gcsfs's: ``mkdir("bucket")`` creates the bucket in ``project`` (in ``location``, else
        ``default_location``, else GCS's default) unless it exists (``BucketExistsError`` if its name is taken
        elsewhere). A deeper path has nothing to make (GCS has no directories) but its bucket: a missing one
        is created with ``create_parents=True`` and raises ``FileNotFoundError`` otherwise. An identity that
        may write objects but not list them (Storage Object Creator) cannot tell whether the bucket exists:
        a deeper path passes, and its first write will say."""
        bucket, name = self.split_path(path)
        exists = await self._bucket_exists(bucket)
        if exists or (exists is None and name):
            return
        if name and not create_parents:
            url = format_url(bucket)
            raise NotFoundError(f"bucket {bucket!r} does not exist: mkdir creates it with create_parents=True", url=url)
        try:
            await create_bucket(
                self._context(), self._project_for("create a bucket"), bucket, location or self.default_location
            )
        except GCSError as exc:
            if exc.status != 409:
                raise
            raise BucketExistsError(f"a bucket named {bucket!r} exists already: {exc}", url=exc.url) from None
        self.invalidate_cache(bucket)

    @_on_io_loop
    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Nothing to make (GCS has no directories; buckets are made by ``mkdir``); a bucket that does not
        exist raises ``FileNotFoundError``."""
        with contextlib.suppress(AccessDeniedError):  # listing refused: its first write will say
            await check_bucket(self._context(), self.split_path(path)[0])  # NotFoundError if missing

    @_on_io_loop
    async def _rmdir(self, path: str) -> None:
        """As gcsfs's: delete the bucket ``path`` names, if empty (``BucketNotEmptyError`` otherwise); a deeper
        path has nothing to delete (GCS has no directories)."""
        bucket, name = self.split_path(path)
        if name:
            return
        try:
            await delete_bucket(self._context(), bucket)
        except GCSError as exc:
            if exc.status != 409:
                raise
            raise BucketNotEmptyError(f"bucket {bucket!r} holds objects: {exc}", url=exc.url) from None
        finally:
            self.invalidate_cache(bucket)

    rmdir = sync_wrapper(_rmdir)  # fsspec makes no blocking twin of _rmdir itself

    async def _bucket_exists(self, bucket: str) -> bool | None:
        """Whether the bucket exists, asked with ``storage.objects.list`` alone; ``None`` if listing is refused."""
        try:
            await check_bucket(self._context(), bucket)
        except NotFoundError:
            return False
        except AccessDeniedError:
            return None
        return True

    def _project_for(self, purpose: str) -> str:
        if not self.project:
            raise ValueError(
                f"to {purpose}, GCSFileSystem needs project= (or {PROJECT_VARIABLE}, or credentials that name a "
                "project): the Google Cloud project they belong to"
            )
        return self.project


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
        info = fs.info(path, refresh=True)  # the live version, whatever a cached listing says
        if info["type"] != "file":
            raise IsADirectoryError(f"{path} is a directory")
        super().__init__(
            fs, info["name"], "rb", block_size, cache_type=cache_type, cache_options=cache_options, size=info["size"]
        )
        self.details = info
        self._gs_url = format_url(*fs.split_path(info["name"]))

    def url(self) -> str:
        """The HTTP URL of the version this file reads (``fs.url`` of its generation), as gcsfs's ``url()``."""
        return self.fs.url(self.path, generation=self.details["generation"])  # type: ignore[no-any-return]

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs: GCSFileSystem = self.fs
        return read_span(self._gs_url, _version(self.details), start, min(end, self.size), fs._gcs)


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

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self._writer.readinto(buffer)  # type: ignore[no-any-return]  # refused, as every writer refuses it

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


async def _pages(context: RequestContext, bucket: str, params: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The pages of the listing ``params`` asks for, following ``nextPageToken`` (``params`` is updated)."""
    url = format_url(bucket, params.get("prefix") or params.get("startOffset", ""))
    trail = PageTrail(url)
    while True:
        page = await list_page(context, bucket, params, url=url)
        yield page
        token = trail.follow_json(page)
        if token is None:
            return
        params["pageToken"] = token


_SIGNED_HEADERS = {"content_type": "Content-Type", "content_md5": "Content-MD5"}
"""``sign`` arguments that are headers the signed request must carry."""
_SIGNED_QUERY = {"response_type": "response-content-type", "response_disposition": "response-content-disposition"}
"""``sign`` arguments that are query parameters of the signed URL."""


def _folders_of(path: str) -> list[str]:
    """The directories ``path`` lies in, below its bucket: ``bucket/a/b/c`` in ``bucket/a/b`` and ``bucket/a``;
    a folder placeholder ``bucket/a/b/`` in those same two."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[:depth]) for depth in range(len(parts), 1, -1)]


def _one_generation(path: str, *generations: int | str | None) -> int | None:
    """The one generation given (as an argument, in the path), or ``None``; two that differ raise ``ValueError``."""
    given = {int(generation) for generation in generations if generation is not None}
    if len(given) > 1:
        raise ValueError(f"{path!r}: two different generations given, {sorted(given)}")
    return given.pop() if given else None


def _path_text(path: Any) -> str:
    """``path`` as fsspec reads it (a str, or an ``os.PathLike`` naming one); ``TypeError`` saying what
    it is otherwise, rather than an error from deep inside fsspec."""
    text = stringify_path(path)
    if not isinstance(text, str):
        raise TypeError(f"a GCS path must be a str such as 'gs://bucket/name', got {type(path).__name__} {brief(path)}")
    return text


def _version(info: dict[str, Any]) -> ObjectInfo:
    """The object version an ``info`` entry describes."""
    return ObjectInfo(info["size"], info["generation"], info["crc32c"])


def _resolve(offset: int | None, size: int) -> int:
    """An offset of fsspec's (``None``: 0, negative: from the end) as a position within ``size`` bytes."""
    if offset is None:
        return 0
    return max(0, size + offset) if offset < 0 else min(offset, size)


def _timestamp(text: str) -> datetime.datetime:
    """A timezone-aware datetime of a GCS RFC 3339 time (``2026-11-26T19:24:13.719Z``)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


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
