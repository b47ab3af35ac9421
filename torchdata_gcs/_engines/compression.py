"""Block-wise zstd for checkpoints, compressed and decompressed on several threads.

Blocks are independent, so they compress and decompress in parallel, each into its own slice of the
output. Two formats, all integers little-endian:

- Standard zstd (the default): per block, a skippable frame that indexes it, then the block's zstd
  frame (with its content size and checksum). ``zstd -d`` and any zstd library read it (they skip
  skippable frames); our reader uses the index to decompress blocks in parallel::

      skippable frame: INDEX_MAGIC u32, payload size u32 (8), compressed size u32, raw size u32
      zstd frame:      compressed size bytes

  then one more skippable frame, the table of every block, so that a reader can plan ranges of
  whole blocks from the object's last bytes and decompress each range as it arrives::

      TABLE_MAGIC u32, payload size u32 (entries + 12),
      per block: compressed size u32, raw size u32,
      blocks u32, crc32c of the per-block entries u32, TABLE_TAG (4 bytes)

- Byte grouping (``Zstd(byte_grouping=True)``), smaller on float data but readable only here::

      MAGIC                                   8 bytes
      per block: compressed size  u32
                 raw size         u32
                 group width      u8     (1: bytes as they are; 2, 4, 8: grouped by position in words)
                 zstd frame       compressed size bytes

  A grouped block of ``n`` bytes holds byte 0 of every ``width``-byte word, then byte 1 of every
  word, and so on, for the first ``n - n % width`` bytes; the rest follow as they are. The object
  ends with a block table as the standard format's, whose entries also hold each block's width
  (compressed size u32, raw size u32, width u8) and whose tag is GROUPED_TABLE_TAG.

Readers also accept any other zstd stream (from the ``zstd`` tool, say) and uncompressed bytes.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import google_crc32c
import numpy as np
import zstandard

from ..config import Zstd
from ..errors import IntegrityError
from .publishing import PublishingWriter

__all__ = [
    "BLOCK_HEADER",
    "GROUPED_TABLE_TAG",
    "INDEX_FRAME",
    "INDEX_MAGIC",
    "MAGIC",
    "TABLE_MAGIC",
    "TABLE_TAG",
    "Block",
    "CompressingWriter",
    "block_table",
    "blocks",
    "decompress",
    "is_compressed",
    "place",
    "read_block_table",
]

MAGIC = b"\x89TDGCSZ\n"
"""Starts every byte-grouped checkpoint; not a valid start of a zip archive, a pickle or a zstd frame."""
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BLOCK_HEADER = struct.Struct("<IIB")
INDEX_MAGIC = (0x184D2A5E).to_bytes(4, "little")
"""The magic number of the skippable frames that index standard-format blocks (one of zstd's 16)."""
INDEX_FRAME = struct.Struct("<4sIII")
TABLE_MAGIC = (0x184D2A5F).to_bytes(4, "little")
"""The magic number of the skippable frame that ends a standard-format checkpoint with its block table."""
TABLE_TAG = b"TDGT"
GROUPED_TABLE_TAG = b"TDGG"
TABLE_END = struct.Struct("<II4s")
_ENTRIES = {TABLE_TAG: struct.Struct("<II"), GROUPED_TABLE_TAG: struct.Struct("<IIB")}


class Block(NamedTuple):
    """Where one compressed block lies: its header's offset, its zstd frame's offset and size, its raw
    size, where its raw bytes go in the output, and its byte-grouping width (1: none)."""

    start: int
    frame: int
    compressed: int
    raw: int
    raw_offset: int
    width: int


_WIDTHS = (2, 4, 8)
_SAMPLE = 128 * 1024  # bytes of a block compressed in each layout to choose one


class _Sink(Protocol):
    url: str
    generation: int | None

    def write(self, data: Any, /) -> int: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


def is_compressed(head: bytes | bytearray | memoryview) -> bool:
    """Whether an object starting with ``head`` is compressed (by this module or by plain zstd)."""
    return bytes(head[: len(MAGIC)]) == MAGIC or bytes(head[:4]) in (_ZSTD_MAGIC, INDEX_MAGIC)


def _grouped(block: memoryview, width: int) -> bytes:
    whole = len(block) - len(block) % width
    words = np.frombuffer(block, dtype=np.uint8, count=whole).reshape(-1, width)
    return words.T.tobytes() + bytes(block[whole:])


def _best_width(block: memoryview) -> int:
    """The layout in which a sample from the middle of ``block`` compresses smallest at level 1."""
    start = max(0, (len(block) // 2 - _SAMPLE // 2)) & ~7
    sample = block[start : start + _SAMPLE]
    compressor = zstandard.ZstdCompressor(level=1)
    sizes = {1: len(compressor.compress(sample))}
    for width in _WIDTHS:
        sizes[width] = len(compressor.compress(_grouped(sample, width)))
    return min(sizes, key=lambda width: (sizes[width], width))


def _compress_block(block: bytes, settings: Zstd) -> bytes:
    if not settings.byte_grouping:
        frame = zstandard.ZstdCompressor(level=settings.level, write_checksum=True).compress(block)
        return INDEX_FRAME.pack(INDEX_MAGIC, INDEX_FRAME.size - 8, len(frame), len(block)) + frame
    view = memoryview(block)
    width = _best_width(view) if settings.byte_grouping and len(block) >= 4 * 1024 else 1
    data = _grouped(view, width) if width > 1 else block
    frame = zstandard.ZstdCompressor(level=settings.level, write_checksum=True).compress(data)
    return BLOCK_HEADER.pack(len(frame), len(block), width) + frame


def _threads(settings: Zstd) -> int:
    return settings.threads or min(4, os.cpu_count() or 1)


class CompressingWriter(PublishingWriter):
    """Compresses what is written to it, block by block on a thread pool, into ``sink`` (a streaming
    writer), in order. ``close()`` publishes through the sink; ``abort()`` or an exception inside
    ``with`` discards everything. Holds at most ``2 x threads`` blocks in memory."""

    def __init__(self, sink: _Sink, settings: Zstd) -> None:
        super().__init__()
        self.sink = sink
        self._settings = settings
        self._pool = ThreadPoolExecutor(_threads(settings), thread_name_prefix="torchdata-gcs-zstd")
        self._pending: deque[Future[bytes]] = deque()
        self._buffer = bytearray()
        self._raw = 0
        self._open = True
        self._table: list[tuple[int, ...]] = []  # (compressed, raw[, width]) of each block written
        if settings.byte_grouping:
            sink.write(MAGIC)

    def writable(self) -> bool:
        return True

    @property
    def bytes_written(self) -> int:
        """Uncompressed bytes written so far."""
        return self._raw

    def write(self, data: Any) -> int:  # type: ignore[override]
        if not self._open:
            raise ValueError("write to a closed writer")
        size = len(memoryview(data).cast("B"))
        self._buffer += data
        self._raw += size
        block_size = self._settings.block_size
        try:
            while len(self._buffer) >= block_size:
                self._submit(bytes(self._buffer[:block_size]))
                del self._buffer[:block_size]
        except BaseException:
            self.abort()
            raise
        return size

    def _submit(self, block: bytes) -> None:
        while len(self._pending) >= 2 * _threads(self._settings):
            self._write_block(self._pending.popleft().result())
        self._pending.append(self._pool.submit(_compress_block, block, self._settings))

    def _write_block(self, block: bytes) -> None:
        if self._settings.byte_grouping:
            self._table.append(BLOCK_HEADER.unpack_from(block))
        else:
            self._table.append(INDEX_FRAME.unpack_from(block)[2:])
        self.sink.write(block)

    def close(self) -> None:
        """Compress what is left, then publish through the sink; on failure discard and raise."""
        if not self._open:
            return
        try:
            if self._buffer:
                self._submit(bytes(self._buffer))
            while self._pending:
                self._write_block(self._pending.popleft().result())
            self.sink.write(block_table(self._table, GROUPED_TABLE_TAG if self._settings.byte_grouping else TABLE_TAG))
            self.sink.close()
        except BaseException:
            self.abort()
            raise
        self._finish()

    def abort(self) -> None:
        """Publish nothing."""
        if not self._open:
            return
        for future in self._pending:
            future.cancel()
        self.sink.abort()
        self._finish()

    def _finish(self) -> None:
        self._open = False
        self._buffer = bytearray()
        self._pending.clear()
        self._pool.shutdown(wait=False)
        super().close()

    def _unpublished(self) -> bool:
        return getattr(self, "_open", False)

    @property
    def url(self) -> str:
        return str(self.sink.url)

    @property
    def generation(self) -> int | None:
        """The published object's generation, once closed cleanly."""
        return self.sink.generation


def block_table(entries: list[tuple[int, ...]], tag: bytes = TABLE_TAG) -> bytes:
    """The skippable frame that ends an object with each block's ``(compressed, raw)`` sizes (and
    width, for the grouped format's ``tag``)."""
    packed = b"".join(_ENTRIES[tag].pack(*entry) for entry in entries)
    end = TABLE_END.pack(len(entries), google_crc32c.value(packed), tag)
    return TABLE_MAGIC + struct.pack("<I", len(packed) + TABLE_END.size) + packed + end


def read_block_table(tail: bytes | memoryview, size: int, url: str) -> list[Block] | int | None:
    """The blocks of an object of ``size`` bytes (either format) whose last bytes are ``tail``; the
    number of last bytes needed if ``tail`` holds too few; ``None`` if the object ends in no block
    table. A table whose checksum or sizes do not hold raises :class:`IntegrityError`."""
    tag = bytes(tail[-4:])
    if len(tail) < TABLE_END.size or tag not in _ENTRIES:
        return None
    entry = _ENTRIES[tag]
    count, crc, _ = TABLE_END.unpack_from(tail, len(tail) - TABLE_END.size)
    frame = 8 + entry.size * count + TABLE_END.size
    if frame > size:
        return None
    if frame > len(tail):
        return frame
    start = len(tail) - frame
    magic, payload = struct.unpack_from("<4sI", tail, start)
    entries = bytes(tail[start + 8 : start + 8 + entry.size * count])
    if magic != TABLE_MAGIC or payload != frame - 8 or google_crc32c.value(entries) != crc:
        raise IntegrityError(f"{url}: its block table is damaged", url=url)
    grouped = tag == GROUPED_TABLE_TAG
    header = BLOCK_HEADER.size if grouped else INDEX_FRAME.size
    found, offset, raw_offset = [], len(MAGIC) if grouped else 0, 0
    for compressed, raw, *width in entry.iter_unpack(entries):
        found.append(Block(offset, offset + header, compressed, raw, raw_offset, width[0] if width else 1))
        offset += header + compressed
        raw_offset += raw
    if offset != size - frame:
        raise IntegrityError(
            f"{url}: the block table describes {offset} bytes of blocks, the object holds {size - frame}", url=url
        )
    return found


def place(plain: bytes, target: memoryview, width: int) -> None:
    """Put a block's decompressed bytes into ``target``, regrouped if it was grouped by ``width``."""
    if width == 1:
        target[:] = plain
        return
    whole = len(plain) - len(plain) % width
    words = np.frombuffer(target, dtype=np.uint8, count=whole).reshape(-1, width)
    words[:] = np.frombuffer(plain, dtype=np.uint8, count=whole).reshape(width, -1).T
    target[whole:] = plain[whole:]


def blocks(data: memoryview, url: str) -> Iterator[tuple[int, int, int, int]]:
    """``(frame offset, compressed size, raw size, width)`` of each block of either format, checked for
    consistency."""
    grouped = bytes(data[: len(MAGIC)]) == MAGIC
    header = BLOCK_HEADER if grouped else INDEX_FRAME
    offset = len(MAGIC) if grouped else 0
    while offset < len(data):
        if offset + header.size > len(data):
            raise IntegrityError(f"{url}: compressed data ends inside a block header", url=url)
        magic, payload = struct.unpack_from("<4sI", data, offset)
        if magic == TABLE_MAGIC and offset + 8 + payload == len(data):
            return  # the block table that ends the object
        if grouped:
            compressed, raw, width = BLOCK_HEADER.unpack_from(data, offset)
            sound = width in (1, *_WIDTHS)
        else:
            magic, payload, compressed, raw = INDEX_FRAME.unpack_from(data, offset)
            width, sound = 1, magic == INDEX_MAGIC and payload == INDEX_FRAME.size - 8
        offset += header.size
        if not sound or offset + compressed > len(data):
            raise IntegrityError(f"{url}: compressed data has a damaged block header", url=url)
        yield offset, compressed, raw, width
        offset += compressed


def decompress(data: bytes | bytearray | memoryview, url: str = "", threads: int = 0) -> bytes | bytearray:
    """The original bytes of a compressed object (this module's format or plain zstd), or ``data``
    itself if it is not compressed. A damaged stream raises :class:`IntegrityError`."""
    view = memoryview(data).cast("B")
    if bytes(view[:4]) == _ZSTD_MAGIC:
        try:
            return zstandard.ZstdDecompressor().stream_reader(view, read_across_frames=True).read()
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{url}: damaged zstd stream ({exc})", url=url) from exc
    if bytes(view[: len(MAGIC)]) != MAGIC and bytes(view[:4]) != INDEX_MAGIC:
        return data if isinstance(data, (bytes, bytearray)) else bytes(data)
    found = list(blocks(view, url))
    output = bytearray(sum(raw for _, _, raw, _ in found))
    starts = np.cumsum([0] + [raw for _, _, raw, _ in found[:-1]]).tolist()

    def restore(block: tuple[int, int, int, int], start: int) -> None:
        offset, compressed, raw, width = block
        try:
            plain = zstandard.ZstdDecompressor().decompress(view[offset : offset + compressed], max_output_size=raw)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{url}: damaged zstd block at byte {offset} ({exc})", url=url) from exc
        if len(plain) != raw:
            raise IntegrityError(f"{url}: a block holds {len(plain)} bytes, its header says {raw}", url=url)
        place(plain, memoryview(output)[start : start + raw], width)

    with ThreadPoolExecutor(threads or min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(restore, found, starts))
    return output
