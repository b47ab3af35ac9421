"""The writers that publish an object on a clean ``close()``, never otherwise: the base of them all, and the
streaming writer, whose parts go out concurrently as they fill, whichever way they are then assembled (see
``upload``)."""

from __future__ import annotations

import io
import logging
import mmap
from collections import deque
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, Literal, TypeVar

from .._ops.attributes import ObjectAttributes
from .._ops.checksums import crc32c_base64, crc32c_extend, crc32c_of_concatenation
from .._ops.client import Client
from .._ops.objects import check_published, object_resource
from .._ops.urls import brief, parse_url
from .._transport import reaper
from .._transport.context import LoadStats, RequestContext
from .._transport.deadline import tidying
from .._transport.loop import close_at_exit, run, submit, wait, wait_unless_on_io_loop
from ..config import MAX_PART_SIZE, TransferConfig, WriteConfig
from ..errors import GCSError, InvalidURIError, UploadError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PARTS_IN_FLIGHT",
    "DEFAULT_PART_SIZE",
    "MAX_PARTS",
    "PublishingWriter",
    "StreamingWriter",
    "part_size",
]

T = TypeVar("T")

DEFAULT_PART_SIZE = WriteConfig.part_size
DEFAULT_PARTS_IN_FLIGHT = WriteConfig.max_parts_in_flight
"""Defaults: 8 connections, each with its own per-connection throughput; about 72 MiB held."""
MAX_PARTS = 10_000
PARTS_PER_SIZE = 1000
"""Parts of one size before the size doubles."""
WRITE_SLICE = 1024 * 1024
"""A write is copied into its part in slices of this size, each hashed there while it is in cache."""


def part_size(number: int, base: int, parts_per_size: int = PARTS_PER_SIZE) -> int:
    """Size of part ``number`` (from 1): ``base``, doubled every ``parts_per_size`` parts, at most
    :data:`MAX_PART_SIZE`.

    >>> [part_size(n, 5, parts_per_size=2) for n in range(1, 7)]
    [5, 5, 10, 10, 20, 20]
    >>> part_size(10_000, 4 * 1024**3) == MAX_PART_SIZE
    True
    """
    return min(base << ((number - 1) // parts_per_size), MAX_PART_SIZE)


def _new_part(size: int) -> memoryview:
    """An empty buffer for one part: an anonymous mapping of its own, which goes back to the OS when the writer
    drops it. Parts of megabytes on the heap raise glibc's mmap threshold and then fragment the heap, so a
    save's memory grew with its size (``benchmarks/README.md``, checkpoint memory)."""
    return memoryview(mmap.mmap(-1, size)) if size else memoryview(bytearray())


class PublishingWriter(io.RawIOBase):
    """A writer that publishes on a clean ``close()`` and never otherwise: leaving a ``with`` block by an
    exception aborts it, and so does being dropped unclosed (``IOBase`` would close, so publish, when collected)."""

    def readable(self) -> bool:
        return False

    def readinto(self, buffer: object) -> int:
        """Refused, as Python's own files opened for writing refuse it (``read``, ``readline`` come here)."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        raise io.UnsupportedOperation(f"{type(self).__name__} is opened for writing: it cannot be read")

    def _unpublished(self) -> bool:
        """Whether the writer is still open, neither published nor aborted."""
        raise NotImplementedError

    def abort(self) -> None:
        """Publish nothing."""
        raise NotImplementedError

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if self._unpublished():
            self.abort()


# What every StreamingWriter does, however it assembles the parts:
# - parts are uploaded on the I/O loop as they fill, at most ``max_parts_in_flight`` held at once,
#   so memory stays near ``part_size x (max_parts_in_flight + 1)`` whatever the object's size;
# - part sizes double every ``PARTS_PER_SIZE`` parts, so ``MAX_PARTS`` parts reach past GCS's 5 TiB
#   object limit from ``MIN_PART_SIZE`` parts;
# - the object is published only by a clean close; an exception inside ``with``, a writer dropped
#   without closing, or a part that fails after retries discards the parts, and nothing is published;
#   a process ended by a signal leaves that to its reaper, handed the undo (abort the upload, delete
#   the parts) at the first part;
# - a payload that fits one part goes out in a single request;
# - every part travels with its crc32c, so GCS refuses a part damaged on the way and it is sent again;
# - the published object's crc32c is compared with that of the bytes written; a mismatch deletes it.
#   GCS does not promise the generation and checksum headers in the answer that publishes a multipart
#   upload: when they are missing (or the answer was lost), they are asked of the object's metadata.
class StreamingWriter(PublishingWriter):
    """Write one object as it is produced; publish it on a clean close, never otherwise. With
    ``only_if_new``, publishing fails with ``PreconditionFailedError`` (a ``FileExistsError``) where
    the object already exists, and nothing is replaced. The object carries ``attributes`` (content type,
    metadata), whichever way it is published.

    A name ending in ``/`` (a folder's placeholder) is refused, as a path meant as a folder usually is by
    mistake, unless ``folder_name`` says it is meant (fsspec's ``touch("dir/")``). ``client`` is the front
    end's handle: its endpoint and retry policy (the writer's requests are not counted in its stats).

    Subclasses say how parts are started, uploaded, assembled and discarded.
    """

    strategy: ClassVar[Literal["multipart", "compose"]] = "multipart"

    def __init__(
        self,
        url: str,
        *,
        client: Client,
        part_size: int = DEFAULT_PART_SIZE,
        max_parts_in_flight: int = DEFAULT_PARTS_IN_FLIGHT,
        parts_per_size: int = PARTS_PER_SIZE,
        only_if_new: bool = False,
        attributes: ObjectAttributes | None = None,
        folder_name: bool = False,
    ) -> None:
        super().__init__()
        self.check_settings(part_size, max_parts_in_flight)
        close_at_exit(
            self, StreamingWriter.abort
        )  # dropped unpublished at exit: its parts discarded while the loop runs
        self._only_if_new = only_if_new
        self.attributes = attributes or ObjectAttributes()
        """The published object's content type and metadata."""
        self.url = url
        self._bucket, self._name = parse_url(url, allow_prefix=False)
        if self._name.endswith("/") and not folder_name:
            raise InvalidURIError(f"{brief(url)} names a folder: write to an object name that does not end in '/'")
        self._client = client
        parts = client.replace(transfer=TransferConfig(max_in_flight=max_parts_in_flight), stats=LoadStats())
        self._context: RequestContext = parts.context()
        self._base, self._parts_per_size, self._max_in_flight = part_size, parts_per_size, max_parts_in_flight
        self._buffer = _new_part(0)  # the part being filled: its first ``_filled`` bytes
        self._filled = 0
        self._part_crc = 0  # their crc32c
        self._sent_crcs: list[tuple[int, int]] = []  # (crc32c, length) of each part sent, in order
        self._size = 0
        self._started = False
        self._prepared = False  # every part sent: only publishing is left
        self._sent = 0  # parts handed to the I/O loop
        self._pending: deque[tuple[Future[tuple[int, Any]], memoryview]] = deque()  # each with its part's buffer
        self._spare: list[memoryview] = []  # buffers of parts sent, filled again (their pages already mapped in)
        self._parts: dict[int, Any] = {}  # part number -> what assembling it needs
        self._state = "open"  # then "published" or "aborted"
        self._watched: reaper.Watch | None = None  # what the reaper undoes if the process ends mid-upload
        self.generation: int | None = None
        """The published object's generation, once closed cleanly."""

    @classmethod
    def check_settings(cls, part_size: int, max_parts_in_flight: int) -> None:
        """Raise ``ValueError`` for settings GCS or the writer cannot work with (``WriteConfig``'s rules)."""
        WriteConfig(part_size=part_size, max_parts_in_flight=max_parts_in_flight, strategy=cls.strategy)

    @property
    def bytes_written(self) -> int:
        return self._size

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        """Bytes written so far (where the next write lands in the object)."""
        return self._size

    def write(self, data: Any) -> int:
        if self._state != "open" or self._prepared:
            raise ValueError(f"write to a {'prepared' if self._state == 'open' else self._state} writer ({self.url})")
        view = memoryview(data).cast("B")
        try:
            self._take(view)
        except BaseException:
            self.abort()
            raise
        self._size += len(view)
        return len(view)

    def _take(self, view: memoryview) -> None:
        """Copy ``view`` into the part being filled, each slice hashed where it landed (the bytes sent, read once
        more while in cache); a full part goes out once more bytes follow it (so the last part is always sent by
        ``close``), handed over as it is, not copied."""
        while view:
            if self._filled == len(self._buffer):
                if self._filled:
                    self._send_part(self._buffer, self._part_crc)
                self._buffer = self._empty_part(part_size(self._sent + 1, self._base, self._parts_per_size))
                self._filled, self._part_crc = 0, 0
            portion = view[: min(WRITE_SLICE, len(self._buffer) - self._filled)]
            landed = self._buffer[self._filled : self._filled + len(portion)]
            landed[:] = portion
            self._part_crc = crc32c_extend(self._part_crc, landed)
            self._filled += len(portion)
            view = view[len(portion) :]

    def _empty_part(self, size: int) -> memoryview:
        """A buffer for the next part: that of a part sent and done with, if one of ``size`` is spare (its pages
        are mapped in already: filling a new mapping faults each page in, a cost as large as the copy), else a
        new one. At most ``max_parts_in_flight + 1`` are ever held."""
        while self._pending and self._pending[0][0].done():
            self._collect(self._pending.popleft())
        spare = [buffer for buffer in self._spare if len(buffer) == size]
        self._spare = spare[1:]
        return spare[0] if spare else _new_part(size)

    def close(self) -> None:
        """Publish the object (a no-op once published or aborted); on any failure abort and raise."""
        if self._state != "open":
            return
        try:
            self.prepare()
            if not self._started:
                self.generation = self._client.create(
                    self._bucket,
                    self._name,
                    bytes(self._buffer[: self._filled]),
                    if_generation_match=self._replaced(),
                    content_type=self.attributes.content_type,
                    fields=self.attributes.fields(),
                    kms_key_name=self.attributes.kms_key_name,
                )
            else:
                self.generation = self._publish()
        except BaseException:
            self.abort()
            raise
        self._state = "published"
        self._buffer, self._filled, self._spare = _new_part(0), 0, []
        super().close()

    def prepare(self) -> None:
        """Take no more writes and upload every part, so that only publishing is left (a payload under one
        part has nothing to prepare: one request publishes it). A transaction prepares all its files before
        it publishes any, so that a failure up to then publishes nothing. On failure, abort and raise."""
        if self._state != "open" or self._prepared:
            return
        self._prepared = True
        if not self._started:
            return
        try:
            self._send_part(self._buffer[: self._filled], self._part_crc)
            while self._pending:
                self._collect(self._pending.popleft())
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Give the upload up: nothing is published and the parts sent are discarded."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._buffer, self._filled, self._spare = _new_part(0), 0, []
        pending = [future for future, _ in self._pending]
        self._pending.clear()
        if self._started:
            try:  # a writer collected on the I/O thread only schedules the discarding
                wait_unless_on_io_loop(tidying(self._discard(pending)))
            except Exception as exc:  # noqa: BLE001 - parts left behind are billed until removed
                logger.warning("could not discard the parts of %s: %r", self.url, exc)
        super().close()

    def _unpublished(self) -> bool:
        return getattr(self, "_state", None) == "open"

    # -- parts -----------------------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return run(coroutine)

    def _send_part(self, data: memoryview, crc32c: int) -> None:
        if not self._started:
            self._start()
            self._started = True
        if self._sent == MAX_PARTS:
            raise UploadError(f"{self.url}: more than {MAX_PARTS} parts; use a larger part_size", url=self.url)
        while len(self._pending) >= self._max_in_flight:
            self._collect(self._pending.popleft())
        self._sent += 1
        self._sent_crcs.append((crc32c, len(data)))
        upload = self._upload_part(self._sent, data, crc32c)
        self._pending.append((submit(upload), data))

    def _collect(self, pending: tuple[Future[tuple[int, Any]], memoryview]) -> None:
        future, buffer = pending
        try:
            number, token = wait(future)  # interrupted (Ctrl-C): the part is cancelled, no longer pending
        except GCSError as exc:
            raise UploadError(f"{self.url}: a part failed ({exc}); the upload was aborted", url=self.url) from exc
        self._parts[number] = token
        self._spare.append(buffer)

    def _publish(self) -> int:
        """Assemble the parts; check the object's crc32c against the bytes written (deleting it on a
        mismatch) and return its generation."""
        generation, reported = self._assemble()
        if generation is None or reported is None:
            generation, reported = self._published_version(generation)
        self._run(
            check_published(
                self._context, self._bucket, self._name, generation, reported, crc32c_base64(self._crc32c())
            )
        )
        return generation

    def _crc32c(self) -> int:
        """The crc32c of every byte written, from those of the parts."""
        return crc32c_of_concatenation(self._sent_crcs)

    def _replaced(self) -> int:
        """The generation publishing replaces, its precondition: 0 (none) with ``only_if_new``, else
        the live one's, asked now; a writer that replaces it meanwhile makes the publish fail."""
        return 0 if self._only_if_new else self._client.live_generation(self._bucket, self._name)

    async def _stored_version(self, generation: int | None = None) -> tuple[dict[str, Any] | None, bool]:
        """The resource (``size,generation,crc32c``) of the version the parts were assembled into, asked of
        GCS (of ``generation`` if known, else the live version), or ``None``; and whether it is this
        upload's: a live version counts only if it holds exactly the bytes written."""
        resource = await object_resource(
            self._context, self._bucket, self._name, "size,generation,crc32c", generation=generation
        )
        ours = resource is not None and (
            generation is not None
            or (int(resource["size"]) == self._size and resource.get("crc32c") == crc32c_base64(self._crc32c()))
        )
        return resource, ours

    def _published_version(self, generation: int | None) -> tuple[int, str | None]:
        """Generation and crc32c of the version the parts were assembled into (see :meth:`_stored_version`);
        a version not known to be this upload's raises ``UploadError``, and it is left alone."""
        # Looked at past the call's deadline too: else an error would not say whether the object was published.
        resource, ours = self._run(tidying(self._stored_version(generation)))
        if resource is None or not ours:
            now = "no object" if resource is None else f"generation {resource['generation']}, other bytes"
            raise UploadError(
                f"{self.url}: the upload's outcome is unknown (its answer was lost or said nothing) and the URL "
                f"holds {now}; nothing was deleted",
                url=self.url,
            )
        return int(resource["generation"]), resource.get("crc32c")

    # -- what a strategy provides ----------------------------------------------------------------

    def _start(self) -> None:
        """Called before the first part."""

    def _upload_part(self, number: int, data: memoryview, crc32c: int) -> Coroutine[Any, Any, tuple[int, Any]]:
        """A coroutine that uploads part ``number`` (whose crc32c is ``crc32c``) and returns
        ``(number, token)``. It must not refer to the writer, or a dropped writer would live until
        its parts finish."""
        raise NotImplementedError

    def _assemble(self) -> tuple[int | None, str | None]:
        """Publish the object from ``self._parts``; its generation and crc32c as the answer reported
        them (``None`` for what it did not say)."""
        raise NotImplementedError

    async def _discard(self, pending: Sequence[Future[tuple[int, Any]]]) -> None:
        """Remove every part sent; ``pending`` are the parts still in flight."""
        raise NotImplementedError
