"""Files: objects read whole or in spans (``cat``, ``get``, the seekable :class:`GCSFile`), written whole or
streamed (``pipe``, ``put``, ``open(..., "wb")``), published at once or when an fsspec transaction commits
(:class:`StagedWriter`, :class:`PublishingTransaction`); and an object's URLs, plain and signed."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import io
import logging
import mimetypes
import os
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.spec import AbstractBufferedFile
from fsspec.transaction import Transaction

from .._engines.download import Loaded, fetch_object
from .._engines.publishing import PublishingWriter, StreamingWriter
from .._engines.ranges import read_span, read_span_async
from .._engines.streams import PartStream
from .._engines.upload import new_writer
from .._ops.attributes import ObjectAttributes
from .._ops.checksums import ObjectInfo
from .._ops.client import RequestContext
from .._ops.objects import create_object, live_generation
from .._ops.reads import media_read_url
from .._ops.signing import signed_url, signing_credentials
from .._ops.urls import format_url
from ..config import WriteConfig
from ..errors import NotFoundError
from .calls import in_bulk_on_io_loop, on_io_loop
from .listing import Listing

__all__ = ["Files", "GCSFile", "PublishingTransaction", "StagedWriter"]

logger = logging.getLogger(__name__)

WRITE_OPTIONS = ("content_type", "metadata", "fixed_key_metadata", "kms_key_name")
"""The keyword arguments of ``open(..., "wb")``, ``pipe`` and ``put``, beyond fsspec's own."""

WRITE_MODES = ("overwrite", "create")

SIGN_OPTIONS = frozenset(
    {"method", "content_md5", "content_type", "response_type", "response_disposition", "generation", "headers",
     "query_parameters", "version"}
)  # fmt: skip
"""The arguments of google-cloud-storage's ``generate_signed_url`` that :meth:`GCSFileSystem.sign` takes."""

_SIGNED_HEADERS = {"content_type": "Content-Type", "content_md5": "Content-MD5"}
"""``sign`` arguments that are headers the signed request must carry."""

_SIGNED_QUERY = {"response_type": "response-content-type", "response_disposition": "response-content-disposition"}
"""``sign`` arguments that are query parameters of the signed URL."""

_CAT_CONTEXT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("cat_context", default=None)
"""The request context the whole-object reads of one ``cat`` share, so its requests take turns for its
``TransferConfig.max_in_flight`` slots instead of opening a connection per path at once."""


class PublishingTransaction(Transaction):  # type: ignore[misc]  # fsspec ships no types: to mypy its classes are Any
    """fsspec's transaction, each file's parts uploaded before any file is published: a failure until then
    (an exception inside ``with``, a part that fails) publishes nothing. Then each file is published by one
    request of its own, in the order opened: GCS cannot publish several objects at once, so a file whose
    publishing fails leaves those before it published, and it and those after it are not (a warning names
    both lists); the error is raised as it came."""

    files: deque[StagedWriter]  # the writers opened within it, in order (fsspec's ``open`` adds them)

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


class Files(Listing):
    """Reading and writing objects, and their URLs."""

    write: WriteConfig
    kms_key_name: str | None
    block_size: int | None
    _text: dict[str, Any]  # the defaults of text-mode open(): encoding, errors, newline

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

    async def _pinned(self, path: str) -> ObjectInfo | None:
        """The version a ``name#<generation>`` path names, to read it; ``None`` for the live one."""
        if self._split_version(path)[2] is None:
            return None
        return _version(await self._info(path))

    @in_bulk_on_io_loop
    async def _cat(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        """fsspec's; the paths' reads share one request context: at most ``TransferConfig.max_in_flight``
        requests at once, on the connections the earlier ones leave open."""
        token = _CAT_CONTEXT.set(self._context(budget=sys.maxsize))
        try:
            return await super()._cat(path, *args, **kwargs)
        finally:
            _CAT_CONTEXT.reset(token)

    @on_io_loop
    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        _, _, url = self._object(path, version=True)
        if not start and end is None:  # the whole object: one GET (ranges above a part), checked by crc32c
            pinned = await self._pinned(path)
            context = _CAT_CONTEXT.get() or self._context(budget=sys.maxsize)
            data, _ = await fetch_object(context, url, pinned, 0)
            return data if isinstance(data, bytes) else b"".join(data)
        info = await self._info(path, refresh=True)
        if info["type"] != "file":
            raise IsADirectoryError(f"{url} is a directory")
        size = info["size"]
        start, end = _resolve(start, size), _resolve(end, size) if end is not None else size
        return await read_span_async(url, _version(info), start, end, self._gcs)

    @on_io_loop
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
            opened.fs, opened.path, opened.name, opened.mode = (  # type: ignore[union-attr]  # io writers lack them
                self, path, path, mode
            )  # fmt: skip
            return opened
        raise NotImplementedError(
            f"mode {mode!r}: GCS objects are written whole, never appended to or updated in place"
        )

    @on_io_loop
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

    @on_io_loop
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


class GCSFile(AbstractBufferedFile):  # type: ignore[misc]  # fsspec ships no types: to mypy its classes are Any
    """A read-only, seekable file over one version of an object (the live one when opened): it reads
    only the ranges asked for, a block ahead (``cache_type`` is fsspec's), and a version replaced while
    it is open fails its next read with ``NotFoundError`` instead of mixing two versions' bytes.

    Reads of a part or more go out as concurrent ranged GETs of ``TransferConfig.part_size``; a read of
    the whole object is checked against its crc32c, a partial one by its length (GCS keeps no checksum
    per range).
    """

    DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
    fs: Files

    def __init__(
        self,
        fs: Files,
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
        return self.fs.url(self.path, generation=self.details["generation"])

    def _fetch_range(self, start: int, end: int) -> bytes:
        return read_span(self._gs_url, _version(self.details), start, min(end, self.size), self.fs._gcs)


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
        return self._writer.readinto(buffer)  # refused, as every writer refuses it

    def tell(self) -> int:
        return self._writer.tell()

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed file")
        return self._writer.write(data)

    def prepare(self) -> None:
        """Upload every part written, leaving only the publishing (see ``StreamingWriter.prepare``)."""
        self._writer.prepare()

    def commit(self) -> None:
        self._writer.close()

    def discard(self) -> None:
        self._writer.abort()


class _TextWriter(io.TextIOWrapper):
    """Text over a binary writer that, left by an exception, aborts the writer instead of publishing it."""

    mode: str  # as open() gives a text file its mode (io.TextIOWrapper itself has none)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc_type is None or not isinstance(self.buffer, PublishingWriter):
            super().__exit__(exc_type, exc, traceback)
            return
        self.buffer.abort()
        with contextlib.suppress(Exception):  # the text still pending has nowhere to go: the write failed
            self.close()


def _one_generation(path: str, *generations: int | str | None) -> int | None:
    """The one generation given (as an argument, in the path), or ``None``; two that differ raise ``ValueError``."""
    given = {int(generation) for generation in generations if generation is not None}
    if len(given) > 1:
        raise ValueError(f"{path!r}: two different generations given, {sorted(given)}")
    return given.pop() if given else None


def _version(info: dict[str, Any]) -> ObjectInfo:
    """The object version an ``info`` entry describes."""
    return ObjectInfo(info["size"], info["generation"], info["crc32c"])


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
