"""Readable streams over downloaded bytes: parts held in memory, and a large object read ahead; and
the ``bytes`` object a whole read is assembled in, filled in place so it is held once, not twice.

``PartStream`` serves an object too large to hold whole: its parts are fetched in order on the
I/O loop, at most ``allowance`` bytes ahead of the reader, and the whole object's length and
crc32c are checked when the reader reaches the end (an ``IntegrityError`` then, instead of EOF).

Both pickle, so they cross to a DataLoader's main process: a ``MemoryStream`` as its bytes, a
``PartStream`` as its unread read-ahead plus where the rest comes from (fetched anew there). Both
have ``peek``, so ``readline`` is fast without a ``BufferedReader`` (which does not pickle).
"""

from __future__ import annotations

import bisect
import io
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from itertools import accumulate
from typing import Any, Protocol

import google_crc32c

from .._ops.checksums import check_crc32c, crc32c_base64
from .._transport.loop import close_at_exit, wait
from .._transport.transport import FilledBytes
from ..errors import IntegrityError

__all__ = ["FilledBytes", "MemoryStream", "PartSource", "PartStream"]


class MemoryStream(io.RawIOBase):
    """A seekable read-only stream over an object held as consecutive parts, without joining them; ``name``
    says what it holds (a front end's streams are named by the object's URL)."""

    def __init__(self, parts: Sequence[bytes | bytearray | memoryview], name: str = "") -> None:
        super().__init__()
        self.name = name
        self._parts = parts
        self._starts = [0, *accumulate(map(len, parts))][:-1]
        self._size = sum(map(len, parts))
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]  # RawIOBase's takes any buffer; these get what BufferedReader passes
        """Fill ``buffer`` across parts (short only at the end), as readers such as PIL expect of a file."""
        target = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(target) and self._position < self._size:
            index = bisect.bisect_right(self._starts, self._position) - 1
            offset = self._position - self._starts[index]
            chunk = memoryview(self._parts[index])[offset : offset + len(target) - filled]
            target[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            self._position += len(chunk)
        return filled

    def readall(self) -> bytes:
        """The rest in one copy (``RawIOBase.readall`` would go 8 KiB at a time)."""
        if self._position >= self._size:
            return b""
        index = bisect.bisect_right(self._starts, self._position) - 1
        offset = self._position - self._starts[index]
        self._position = self._size
        # A whole part goes in as it is: bytes.join lets other threads run while it copies bytes
        # objects, and holds the interpreter for the whole copy if any piece is a memoryview.
        first = self._parts[index] if offset == 0 else memoryview(self._parts[index])[offset:]
        return b"".join([first, *self._parts[index + 1 :]])

    def peek(self, size: int = 0) -> bytes:
        """Bytes from the position to the end of its part, without moving (what ``readline`` looks ahead in)."""
        if self._position >= self._size:
            return b""
        index = bisect.bisect_right(self._starts, self._position) - 1
        return bytes(memoryview(self._parts[index])[self._position - self._starts[index] :])

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def __reduce__(self) -> tuple[Any, ...]:
        if self.closed:
            raise ValueError("a closed stream cannot be pickled")
        return _memory_stream_at, ([bytes(part) for part in self._parts], self._position, self.name)


def _memory_stream_at(parts: list[bytes], position: int, name: str) -> MemoryStream:
    stream = MemoryStream(parts, name)
    stream.seek(position)
    return stream


class PartSource(Protocol):
    """Where a :class:`PartStream`'s parts come from; pickles to a source that fetches them in any process."""

    def fetch(self, start: int, length: int) -> Future[list[bytes]]:
        """A future of bytes ``[start, start + length)`` of the object, in chunks."""
        ...


class PartStream(io.RawIOBase):
    """A large object read in order, part by part, fetched ahead within ``allowance`` bytes.

    ``source.fetch(start, length)`` returns a future of those bytes (from the I/O loop); ``first``
    holds bytes already read from the start. ``on_close`` runs once, when the stream is closed.
    ``received`` and ``crc`` say how many bytes before ``first`` were received, and their crc32c
    (a stream resumed in another process).
    """

    def __init__(
        self,
        url: str,
        size: int,
        part_size: int,
        allowance: int,
        source: PartSource,
        expected_crc32c: dict[str, str | None],
        on_close: Callable[[], None] | None,
        first: list[bytes],
        *,
        received: int = 0,
        crc: int = 0,
    ) -> None:
        super().__init__()
        self.url, self.size, self.part_size = url, size, part_size
        self._allowance = allowance
        self._ahead = max(1, allowance // part_size - 1)  # the part being read counts too
        self._source = source
        self._expected = expected_crc32c
        self._on_close = on_close
        self._chunks: deque[bytes] = deque()
        self._current = memoryview(b"")
        self._offset = 0  # within _current
        self._received = self._requested = received
        self._crc = crc
        self._pending: deque[Future[list[bytes]]] = deque()
        close_at_exit(self)  # its parts in flight cancelled at exit while the loop runs
        if received:  # resumed: ``first`` is counted in ``received`` and ``crc`` already
            self._chunks.extend(first)
        else:
            self._take(first)
        self._fill()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the unread bytes received so far and the source of the rest; parts still in
        flight are fetched again wherever it is unpickled."""
        if self.closed:
            raise ValueError("a closed stream cannot be pickled")
        unread = [bytes(self._current[self._offset :]), *self._chunks]  # copies the current chunk's rest only
        arguments = (self.url, self.size, self.part_size, self._allowance, self._source, self._expected, None, unread)
        return _resumed_part_stream, (arguments, self._received, self._crc)

    @property
    def name(self) -> str:
        """The object's URL, as every front end's streams are named."""
        return self.url

    def _take(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self._crc = google_crc32c.extend(self._crc, chunk)
            self._received += len(chunk)
        self._requested = max(self._requested, self._received)
        self._chunks.extend(chunks)

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while self._requested < self.size and len(self._pending) < self._ahead:
            length = min(self.part_size, self.size - self._requested)
            self._pending.append(self._source.fetch(self._requested, length))
            self._requested += length

    def peek(self, size: int = 0) -> bytes:
        """Bytes of the current chunk from the position, without moving (at least one unless at the end)."""
        if self._offset == len(self._current) and not self._next_chunk():
            return b""
        return bytes(self._current[self._offset :])

    def _next_chunk(self) -> bool:
        """Make the next chunk current, waiting for its part if needed; ``False`` at the end (checked)."""
        while not self._chunks or not self._chunks[0]:
            if self._chunks:
                self._chunks.popleft()  # an empty chunk
            elif self._pending:
                self._take(wait(self._pending.popleft()))
                self._fill()
            else:
                self._finish()
                return False
        self._current, self._offset = memoryview(self._chunks.popleft()), 0
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]  # RawIOBase's takes any buffer; these get what BufferedReader passes
        """Fill ``buffer`` across chunks (short only at the end), as readers of a file expect."""
        target = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(target):
            if self._offset == len(self._current) and not self._next_chunk():
                break
            chunk = self._current[self._offset : self._offset + len(target) - filled]
            target[filled : filled + len(chunk)] = chunk
            self._offset += len(chunk)
            filled += len(chunk)
        return filled

    def readall(self) -> bytes:
        """The rest as one ``bytes``, each chunk copied into place and let go as it comes, so the rest
        is held once plus the read-ahead (``RawIOBase.readall`` would go 8 KiB at a time, and joining
        the chunks would hold the rest twice); checked at the end, as every read to the end is."""
        unread = len(self._current) - self._offset + sum(map(len, self._chunks)) + self.size - self._received
        buffer = FilledBytes(max(0, unread))
        self.readinto(buffer.view)
        if self._offset < len(self._current) or self._next_chunk():  # checks the end, or finds more bytes
            raise IntegrityError(f"{self.url}: got more bytes than its size, {self.size}", url=self.url)
        return buffer.take()

    def _finish(self) -> None:
        if self._received != self.size:
            raise IntegrityError(f"{self.url}: got {self._received} bytes, expected {self.size}", url=self.url)
        check_crc32c(self.url, crc32c_base64(self._crc), self._expected)

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            for future in self._pending:
                future.cancel()
            self._pending.clear()
            on_close()
        super().close()


def _resumed_part_stream(arguments: tuple[Any, ...], received: int, crc: int) -> PartStream:
    return PartStream(*arguments, received=received, crc=crc)
