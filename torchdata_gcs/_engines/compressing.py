"""Compression on write: what is written is compressed block by block on a thread pool, in the format
:mod:`.compression` describes, and streamed into a writer that publishes it."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import zstandard

from ..config import Zstd
from .compression import (
    BLOCK_HEADER,
    GROUP_WIDTHS,
    GROUPED_TABLE_TAG,
    INDEX_FRAME,
    INDEX_MAGIC,
    MAGIC,
    TABLE_TAG,
    block_table,
)
from .publishing import PublishingWriter

__all__ = ["CompressingWriter"]

_SAMPLE = 128 * 1024  # bytes of a block compressed in each layout to choose one


class _Sink(Protocol):
    url: str
    generation: int | None

    def write(self, data: Any, /) -> int: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


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
    for width in GROUP_WIDTHS:
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

    def write(self, data: Any) -> int:
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
