"""``torch.distributed.checkpoint`` (DCP) on GCS: :class:`GCSStorageWriter` and :class:`GCSStorageReader`.

Both are torch's ``FileSystemWriter`` / ``FileSystemReader`` over a GCS "file system", so DCP's planning,
resharding, ``async_save`` staging and stream extensions (``ZStandard``) work as they do on disk; only how
bytes move differs. Writing streams each data file out, published only once complete, and writes
``.metadata`` (what makes a checkpoint loadable) last, straight to its name: a GCS object appears whole or
not at all, so the temporary file and rename a file system needs are unnecessary (GCS has no rename).
Reading fetches only the byte ranges a rank's load plan names, as concurrent ranged GETs pinned to one
generation of each file, ahead of DCP in the order DCP reads them, within a byte budget.
"""

from __future__ import annotations

import bisect
import dataclasses
import io
import itertools
import os
import pickle
import queue
import secrets
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Protocol

import google_crc32c
import torch.distributed.checkpoint.filesystem as torch_filesystem
from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ._engines.checkpoints import open_writer, write_config
from ._engines.ranges import read_into_buffer
from ._engines.read_ahead import ReadAhead, Span
from ._engines.shared_spans import Place, Sharing, place, plan_sharing, sweep
from ._ops.checksums import ObjectInfo, crc32c_of_concatenation
from ._ops.client import Client, GCSClient, client_of
from ._ops.paging import ITEM_FIELDS
from ._ops.reads import read_ranges_into
from ._ops.urls import format_url, parse_url
from ._transport.context import LoadStats
from ._transport.loop import run
from .config import ClientConfig, RetryConfig, TransferConfig, WriteConfig
from .errors import InvalidURIError, NotFoundError, UploadError

__all__ = ["GCSStorageReader", "GCSStorageWriter"]


READ_AHEAD = 64 * 1024 * 1024
"""What :class:`GCSStorageReader` holds ahead of DCP unless ``transfer`` says otherwise: DCP copies into
tensors the caller allocated already, so every byte read ahead is held twice. 64 MiB as 32 concurrent 2 MiB
GETs loaded a 256 MiB checkpoint twice as fast as 256 MiB as 16 GETs of 16 MiB, holding 127 MiB
instead of 298."""

COALESCE_GAP = 256 * 1024
"""Items of one file read one after the other are fetched as one range when at most this many unneeded bytes
lie between them: fewer requests for a few wasted bytes."""


class _Publisher(Protocol):
    """What ``open_writer`` returns: a binary writer that publishes on ``close()`` and discards on ``abort()``."""

    def write(self, data: Any) -> int: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


def _url(path: str | os.PathLike[str]) -> str:
    url = os.fspath(path)
    if not isinstance(url, str):
        raise InvalidURIError(f"expected a gs:// URL, got {url!r}")
    return url


# -- writing -------------------------------------------------------------------------------------------------


class _WriteStream(io.RawIOBase):
    """A data file being written: publishes on ``close()``, knows its position (DCP records items by offset).

    Dropped without ``close()`` it aborts, never publishes (``IOBase`` would otherwise close it when collected).
    """

    def __init__(self, writer: _Publisher) -> None:
        super().__init__()
        self._writer = writer
        self._position = 0
        self._done = False
        self._pieces: list[tuple[int, int]] = []  # (crc32c, length) of each write, in order
        self._starts: list[int] = []  # where each write began
        self.error: BaseException | None = None
        """What the writer itself raised (torch.save reports it as an unrelated position mismatch)."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = data if isinstance(data, bytes) else bytes(memoryview(data).cast("B"))  # the writer keeps bytes anyway
        try:
            written = self._writer.write(chunk)
        except BaseException as exc:
            self.error = exc
            raise
        self._pieces.append((google_crc32c.value(chunk if written == len(chunk) else chunk[:written]), written))
        self._starts.append(self._position)
        self._position += written
        return written

    def crc32c(self, start: int, length: int) -> int | None:
        """The crc32c of bytes ``[start, start + length)``, if they are whole writes (DCP writes each item by
        writes of its own, so an item's checksum combines its writes')."""
        first = bisect.bisect_left(self._starts, start)
        if length == 0 or first == len(self._starts) or self._starts[first] != start:
            return 0 if length == 0 else None
        tiles, covered = [], 0
        for crc, size in itertools.islice(self._pieces, first, None):
            tiles.append((crc, size))
            covered += size
            if covered >= length:
                break
        return crc32c_of_concatenation(tiles) if covered == length else None

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass  # the writer sends parts as they fill; only close() can publish

    def close(self) -> None:
        """Publish the file (a no-op once published or aborted)."""
        if self._done:
            return
        self._done = True
        try:
            self._writer.close()
        finally:
            super().close()

    def abort(self) -> None:
        """Give the file up: nothing is published."""
        self._done = True
        try:
            self._writer.abort()
        finally:
            super().close()

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            self.abort()


# -- reading -------------------------------------------------------------------------------------------------


class _ReadStream(io.RawIOBase):
    """A seekable binary view of one object version, read by ranged GETs (all pinned to its generation).

    Bytes the current load plan names come from its read-ahead; any other read fetches a window of
    ``transfer.part_size`` bytes from the position. A window that covers the whole object (a small
    ``.metadata``) is checked against the object's crc32c; partial reads are checked by length only, as GCS
    keeps no checksum for a byte range.
    """

    def __init__(self, fs: _GCSFileSystem, url: str, info: ObjectInfo, ahead: ReadAhead | None) -> None:
        super().__init__()
        self.url, self.info = url, info
        self._fs, self._ahead = fs, ahead
        self._position = 0
        self._window_start = 0
        self._window: bytes | bytearray = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = self.info.size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def read(self, size: int | None = -1) -> bytes:
        remaining = max(0, self.info.size - self._position)
        count = remaining if size is None or size < 0 else min(size, remaining)
        pieces = []
        while count > 0:
            piece = self._bytes_at(self._position, count)
            pieces.append(piece)
            self._position += len(piece)
            count -= len(piece)
        return pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        count = min(len(target), max(0, self.info.size - self._position))
        done = 0
        while done < count:
            piece = self._bytes_at(self._position, count - done)
            target[done : done + len(piece)] = piece
            done += len(piece)
            self._position += len(piece)
        return done

    def _bytes_at(self, position: int, limit: int) -> memoryview:
        """Some (at least one, at most ``limit``) of the bytes at ``position``."""
        if self._ahead is not None:
            view = self._ahead.view(self.url, position, limit)
            if view is not None:
                return view
        offset = position - self._window_start
        if not 0 <= offset < len(self._window):
            length = min(max(limit, self._fs.client.transfer.part_size), self.info.size - position)
            self._window_start, self._window = position, self._fs.read_range(self.url, self.info, position, length)
            offset = 0
        return memoryview(self._window)[offset : offset + limit]


# -- the file system -----------------------------------------------------------------------------------------


class _GCSFileSystem(FileSystemBase):
    """DCP's file operations on GCS: paths are ``gs://`` URLs, directories do not exist, files appear whole.

    Holds settings only (its handle, ``gcs``, and during a load that load's read-ahead), so writers and
    readers pickle.
    """

    def __init__(
        self,
        client: GCSClient | ClientConfig | None,
        transfer: TransferConfig | None,
        retry: RetryConfig | None,
        write: WriteConfig | None = None,
    ) -> None:
        self.client = client_of(client, retry, transfer)
        self.write = write or WriteConfig()
        self.stats = LoadStats()
        self.gcs = Client(self.client, stats=self.stats)
        self.failed_writes: list[str] = []
        self.written: dict[str, _WriteStream] = {}  # files this process published, for their items' checksums
        self.read_ahead: ReadAhead | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "read_ahead": None, "written": {}}

    # -- paths

    def init_path(self, path: str | os.PathLike[str]) -> str:
        bucket, prefix = parse_url(_url(path), allow_prefix=True)
        return format_url(bucket, prefix.rstrip("/"))

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{_url(path).rstrip('/')}/{suffix}"

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            parse_url(_url(checkpoint_id), allow_prefix=True)
        except InvalidURIError:
            return False
        return True

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        """Nothing to do: GCS has no directories."""

    # -- objects

    def object_info(self, url: str) -> ObjectInfo:
        bucket, name = parse_url(url, allow_prefix=False)
        resource = self.gcs.head(bucket, name, ITEM_FIELDS)
        if resource is None:
            raise NotFoundError(f"{url} does not exist", url=url, status=404)
        return ObjectInfo.from_json(resource)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        bucket, name = parse_url(_url(path), allow_prefix=False)
        return self.gcs.head(bucket, name, "generation") is not None

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        url = _url(path)
        if not self.delete(url):
            raise NotFoundError(f"{url} does not exist", url=url, status=404)

    def delete(self, url: str) -> bool:
        """Delete ``url``; ``False`` if it did not exist."""
        bucket, name = parse_url(url, allow_prefix=False)
        return self.gcs.delete(bucket, name)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        """GCS has no rename; the writer never needs one (it writes ``.metadata`` in place)."""
        raise NotImplementedError("GCS objects cannot be renamed; GCSStorageWriter writes .metadata in place")

    # -- streams

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        url = _url(path)
        if mode == "wb":
            stream = _WriteStream(open_writer(url, self.gcs, self.write))
            try:
                yield stream
                stream.close()
                self.written[url] = stream
            except BaseException as exc:
                stream.abort()
                self.failed_writes.append(url)
                if stream.error is not None and stream.error is not exc:
                    raise stream.error from None  # the cause, not what torch.save made of it
                raise
        elif mode == "rb":
            ahead = self.read_ahead
            info = ahead.info(url) if ahead is not None else self.object_info(url)
            with _ReadStream(self, url, info, ahead) as reader:
                yield reader
        else:
            raise ValueError(f"mode must be 'wb' or 'rb' (GCS objects are written whole or read), got {mode!r}")

    def read_range(self, url: str, info: ObjectInfo, start: int, length: int) -> bytearray:
        """Bytes ``[start, start + length)`` of the version ``info`` names; checked against its crc32c (and read
        again while damaged) if that is the whole object."""
        if start == 0 and length == info.size:
            return read_into_buffer(url, info, self.gcs)
        buffer = bytearray(length)
        context = self.gcs.context()
        part_size = self.client.transfer.part_size
        run(read_ranges_into(context, url, info.generation, start, memoryview(buffer), part_size))
        return buffer


# -- the public classes --------------------------------------------------------------------------------------


class GCSStorageWriter(FileSystemWriter):
    """Where ``dcp.save`` / ``dcp.async_save`` write a checkpoint on GCS: ``path`` is a ``gs://bucket/prefix``.

    Data files stream out through :func:`torchdata_gcs.checkpoint.open_writer` as ``write`` says
    (:class:`~torchdata_gcs.WriteConfig`: part size, parts in flight, ``strategy="compose"`` where the XML API is
    missing; the loose ``part_size``, ``max_parts_in_flight`` and ``strategy`` keywords are deprecated) and each is
    published only when complete, and only if the crc32c GCS reports for the object stored is that of the bytes sent
    (else it is deleted: ``IntegrityError``). ``.metadata`` is written last, in one request, straight to its
    name; with ``overwrite=False`` that write also fails if a checkpoint appeared at ``path`` meanwhile.
    ``dcp.async_save``'s future completes once ``.metadata`` is written, or fails with the error that stopped it.
    ``_extensions`` (such as ``[ZStandard()]``) transform each item's bytes as in ``FileSystemWriter``; compress
    that way, not with ``open_writer``'s whole-file ``compression`` (DCP addresses items by byte offset).

    Examples:
        >>> import warnings
        >>> import torch
        >>> import torch.distributed.checkpoint as dcp
        >>> from torchdata_gcs.dcp import GCSStorageReader, GCSStorageWriter
        >>> from torchdata_gcs.testing import Emulator
        >>> warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process, no process group
        >>> with Emulator() as emulator:
        ...     emulator.create_bucket("ckpt")
        ...     client = emulator.client_config
        ...     state = {"w": torch.arange(4.0), "step": 7}
        ...     _ = dcp.save(state, storage_writer=GCSStorageWriter("gs://ckpt/run/step-7", client=client))
        ...     restored = {"w": torch.zeros(4), "step": 0}
        ...     dcp.load(restored, storage_reader=GCSStorageReader("gs://ckpt/run/step-7", client=client))
        ...     sorted(emulator.names("ckpt")), restored
        (['run/step-7/.metadata', 'run/step-7/__0_0.distcp'], {'w': tensor([0., 1., 2., 3.]), 'step': 7})
    """

    def __init__(
        self,
        path: str,
        *,
        client: GCSClient | ClientConfig | None = None,
        retry: RetryConfig | None = None,
        write: WriteConfig | None = None,
        part_size: int | None = None,
        max_parts_in_flight: int | None = None,
        single_file_per_rank: bool = True,
        thread_count: int = 1,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        overwrite: bool = True,
        _extensions: Sequence[StreamTransformExtension] | None = None,
        **writer_options: Any,
    ) -> None:
        unknown = set(writer_options) - {"strategy", "compression"}
        if unknown:
            raise TypeError(f"GCSStorageWriter got unexpected keyword arguments {sorted(unknown)}")
        write = write_config(write, "GCSStorageWriter", part_size=part_size, max_parts_in_flight=max_parts_in_flight,
                             **writer_options)  # fmt: skip
        if write.compression is not None:
            raise ValueError(
                "compression would shift the byte offsets DCP records for each item; compress items instead "
                "with _extensions=[torch.distributed.checkpoint._extension.ZStandard()]"
            )
        super().__init__(
            path,
            single_file_per_rank=single_file_per_rank,
            sync_files=False,  # nothing to fsync: a file exists once its upload completed
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            cache_staged_state_dict=cache_staged_state_dict,
            overwrite=overwrite,
            _extensions=_extensions,
        )
        self.fs: _GCSFileSystem = _GCSFileSystem(client, None, retry, write)  # type: ignore[assignment]  # torch's FsspecWriter declares its fs as fsspec's
        self.path: str = self.fs.init_path(path)

    def _metadata_url(self) -> str:
        """Where this writer's ``finish`` puts the metadata: ``.metadata``, or ``__{rank}.metadata`` when DCP
        saves without rank coordination (``use_collectives=False``)."""
        rank = getattr(self, "rank", None)
        local = not getattr(self, "use_collectives", True) and rank is not None
        return _url(self._get_metadata_path(rank if local else None))

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        plans = super().prepare_global_plan(plans)
        # Before any rank writes data: old metadata must never describe new files, so an interrupted
        # overwrite leaves no checkpoint rather than old metadata pointing into new data files.
        if self.overwrite:
            self.fs.delete(self._metadata_url())
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        self.fs.failed_writes.clear()
        self.fs.written.clear()
        future = super().write_data(plan, planner)
        if self.fs.failed_writes:  # never describe files that were not published
            failed = ", ".join(self.fs.failed_writes)
            raise UploadError(f"writing {failed} failed: nothing was published for it, the checkpoint is not complete")
        for result in future.wait():
            self._note_checksum(result.storage_data)
        self.fs.written.clear()
        return future

    def _note_checksum(self, stored: Any) -> None:
        """Give an item's storage record the crc32c of its bytes (``crc32c``, an attribute that plain DCP readers
        ignore), so that a load can check each item it reads before copying it into the caller's tensors."""
        stream = self.fs.written.get(self.fs.concat_path(self.path, getattr(stored, "relative_path", "")))
        crc = stream.crc32c(stored.offset, stored.length) if stream is not None else None
        if crc is not None:
            stored.crc32c = crc

    def _write_data(self, planner: SavePlanner, file_queue: queue.Queue[Any]) -> Future[list[WriteResult]]:
        """Write the queued files on ``thread_count`` threads, each running torch's one-thread loop, and join
        them all: torch's own threads leave an error of theirs unreported, and run on after one of this thread."""
        threads, copy_ahead = self.thread_count, self.per_thread_copy_ahead
        if threads <= 1:
            return super()._write_data(planner, file_queue)

        def one_thread() -> list[WriteResult]:
            try:
                return super(GCSStorageWriter, self)._write_data(planner, file_queue).wait()
            except BaseException:
                while not file_queue.empty():  # the others finish their current file and stop
                    try:
                        file_queue.get_nowait()
                    except queue.Empty:
                        break
                raise

        # torch's loop reads these settings when it starts: one thread each, and (as torch does with
        # several threads) no overlapping device-to-host copies.
        self.thread_count, self.per_thread_copy_ahead = 1, 0
        try:
            with ThreadPoolExecutor(threads, thread_name_prefix="dcp-gcs-writer") as pool:
                futures = [pool.submit(one_thread) for _ in range(threads)]
                wait(futures)
        finally:
            self.thread_count, self.per_thread_copy_ahead = threads, copy_ahead
        results: list[WriteResult] = []
        for done in futures:
            results += done.result()  # the first error, once every thread has stopped
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write the checkpoint's metadata, which makes it loadable, in one request to its final name."""
        version = getattr(torch_filesystem, "CURRENT_DCP_VERSION", None)
        if version is not None:
            metadata.version = version
        metadata.storage_data = {result.index: result.storage_data for rank in results for result in rank}
        metadata.storage_meta = self.storage_meta()
        url = self._metadata_url()
        bucket, name = parse_url(url, allow_prefix=False)
        replaced = self.fs.gcs.live_generation(bucket, name) if self.overwrite else 0  # so it is retried
        self.fs.gcs.create(bucket, name, pickle.dumps(metadata), if_generation_match=replaced)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _GCSFileSystem.validate_checkpoint_id(checkpoint_id)


class GCSStorageReader(FileSystemReader):
    """Where ``dcp.load`` reads a checkpoint from GCS: ``path`` is the ``gs://bucket/prefix`` it was saved to.

    Each rank fetches only the byte ranges of the items its load plan names (never whole files unless it needs them
    whole), as concurrent ranged GETs of at most ``transfer.part_size`` bytes, ``transfer.max_in_flight`` at once,
    pinned to the generation of each file seen when first read: a file overwritten during the load fails it rather than
    mixing versions. Items of a file at most :data:`COALESCE_GAP` apart share a GET, and several ReadItems of one
    stored item (resharding) fetch its bytes once. Ranges are fetched ahead of DCP, at most
    ``transfer.max_buffered_bytes`` held at once (:data:`READ_AHEAD`, 64 MiB, unless ``transfer`` is given), as 32
    or more concurrent GETs. Every range is checked for its exact length, and every item against the crc32c that
    :class:`GCSStorageWriter` saved with it in the metadata, before DCP copies it into the caller's tensors (a damaged
    one is read again, as retries allow); a file read whole is also checked against GCS's crc32c. Checkpoints saved by
    other writers have no item checksums: their partial reads are checked by length only, as GCS keeps no checksum per
    range. :attr:`stats` counts the requests and bytes. Files written with extensions (``ZStandard``) are decoded
    through ``_extension_registry``. Ranks on one machine that read the same ranges (a replicated state) fetch each
    once between them, through ``/dev/shm``; a rank that cannot get a range so reads it itself.

    Examples:
        >>> import warnings
        >>> import torch
        >>> import torch.distributed.checkpoint as dcp
        >>> from torchdata_gcs.dcp import GCSStorageReader, GCSStorageWriter
        >>> from torchdata_gcs.testing import Emulator
        >>> warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process, no process group
        >>> with Emulator() as emulator:
        ...     emulator.create_bucket("ckpt")
        ...     client = emulator.client_config
        ...     state = {"big": torch.zeros(1024, 1024), "small": torch.ones(3)}
        ...     _ = dcp.save(state, storage_writer=GCSStorageWriter("gs://ckpt/step-1", client=client))
        ...     reader = GCSStorageReader("gs://ckpt/step-1", client=client)
        ...     only_small = {"small": torch.zeros(3)}  # a subset: only its bytes are fetched
        ...     dcp.load(only_small, storage_reader=reader)
        ...     only_small["small"], reader.stats.bytes < 10_000
        (tensor([1., 1., 1.]), True)
    """

    def __init__(
        self,
        path: str,
        *,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        _extension_registry: ExtensionRegistry | None = None,
    ) -> None:
        super().__init__(path, _extension_registry=_extension_registry)
        transfer = transfer or TransferConfig(max_buffered_bytes=READ_AHEAD)
        self.fs: _GCSFileSystem = _GCSFileSystem(client, transfer, retry)  # type: ignore[assignment]  # as above, for the reader
        self.path: str = self.fs.init_path(path)

    @property
    def stats(self) -> LoadStats:
        """Ranged GETs sent and bytes received by this reader so far, ``.metadata`` included (the small
        requests that look up each file's size and generation are not counted)."""
        return self.fs.stats

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            return super().read_metadata(*args, **kwargs)
        except NotFoundError as exc:
            raise NotFoundError(
                f"no DCP checkpoint at {self.path}: {exc} (the save did not finish, or the path is wrong)",
                url=exc.url,
                status=exc.status,
            ) from None

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return dataclasses.replace(plan, storage_data=place())  # tells the coordinator which ranks share a machine

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        # A range several ranks of one machine read (a replicated item) is fetched by one of them for all.
        places = [plan.storage_data if isinstance(plan.storage_data, Place) else None for plan in plans]
        wanted = [
            [(span.url, span.start, span.end) for span in self._spans(self._in_file_order(plan.items))]
            for plan in plans
        ]
        sharings = plan_sharing(places, wanted, secrets.token_hex(6))
        return [dataclasses.replace(plan, storage_data=sharing) for plan, sharing in zip(plans, sharings, strict=True)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        sharing = plan.storage_data if isinstance(plan.storage_data, Sharing) and plan.storage_data.ranges else None
        if sharing is not None:
            sweep()
        # Items are independent (each is loaded, narrowed and copied on its own), so they are read file by file
        # in byte order: neighbours then share a request, and each range is done with once DCP moves past it.
        plan = dataclasses.replace(plan, items=self._in_file_order(plan.items))
        ahead = ReadAhead(
            self.fs.object_info,
            self._spans(plan.items),
            self.fs.client.transfer.max_buffered_bytes,
            self.fs.gcs.context(),
            self._checksums(plan.items),
            sharing,
        )
        self.fs.read_ahead = ahead
        try:
            future = super().read_data(plan, planner)
            ahead.verify_whole_files()
            return future
        finally:
            self.fs.read_ahead = None
            ahead.close()

    def _in_file_order(self, items: list[ReadItem]) -> list[ReadItem]:
        """``items`` grouped by file (in order of first use), by offset within each file."""
        per_file: dict[str, list[ReadItem]] = {}
        for item in items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)

        def offset(item: ReadItem) -> tuple[int, int]:
            stored = self.storage_data[item.storage_index]
            return stored.offset, stored.length

        return [item for group in per_file.values() for item in sorted(group, key=offset)]

    def _checksums(self, items: list[ReadItem]) -> dict[str, list[tuple[int, int, int]]]:
        """Per file, ``(offset, length, crc32c)`` of the items read that were saved with a checksum, by offset."""
        checksums: dict[str, set[tuple[int, int, int]]] = {}
        for item in items:
            stored = self.storage_data[item.storage_index]
            crc = getattr(stored, "crc32c", None)
            if crc is not None:
                url = self.fs.concat_path(self.path, stored.relative_path)
                checksums.setdefault(url, set()).add((stored.offset, stored.length, crc))
        return {url: sorted(found) for url, found in checksums.items()}

    def _spans(self, items: list[ReadItem]) -> list[Span]:
        """The byte ranges ``items`` (in file order) read, in that order; ranges that overlap, touch or lie at most
        ``COALESCE_GAP`` apart share a span of up to ``transfer.part_size`` bytes (a larger item is a span alone).
        A range inside the span before it joins that span whatever its size: several ReadItems of one stored
        item (a rank holding more than one shard of it) then fetch its bytes once."""
        limit = self.fs.client.transfer.part_size
        spans: list[Span] = []
        span: Span | None = None
        for item in items:
            stored = self.storage_data[item.storage_index]
            url = self.fs.concat_path(self.path, stored.relative_path)
            start, end = stored.offset, stored.offset + stored.length
            if (
                span is not None
                and span.url == url
                and span.start <= start <= span.end + COALESCE_GAP
                and (end <= span.end or max(end, span.end) - span.start <= limit)
            ):
                span.end = max(end, span.end)
            else:
                span = Span(url, start, end)
                spans.append(span)
        return spans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _GCSFileSystem.validate_checkpoint_id(checkpoint_id)
