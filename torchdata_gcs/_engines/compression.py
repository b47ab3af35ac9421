"""Block-wise zstd for checkpoints: the format, and decompression on several threads
(:mod:`.compressing` writes it).

Blocks are independent, so they compress and decompress in parallel, each into its own slice of the
output. Two formats (their layouts are beside the constants below): standard zstd, the default, which
``zstd -d`` and any zstd library read, its blocks indexed by skippable frames so that our reader
decompresses them in parallel; and byte grouping (``Zstd(byte_grouping=True)``), smaller on float data
but readable only here. Readers also accept any other zstd stream (from the ``zstd`` tool, say) and
uncompressed bytes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import google_crc32c
import numpy as np
import zstandard

from ..errors import IntegrityError

__all__ = [
    "BLOCK_HEADER",
    "GROUPED_TABLE_TAG",
    "GROUP_WIDTHS",
    "INDEX_FRAME",
    "INDEX_MAGIC",
    "MAGIC",
    "TABLE_MAGIC",
    "TABLE_TAG",
    "Block",
    "block_table",
    "blocks",
    "decompress",
    "is_compressed",
    "place",
    "read_block_table",
]

# The two formats, all integers little-endian.
#
# Standard zstd: per block, a skippable frame that indexes it, then the block's zstd frame (with its
# content size and checksum); readers other than ours skip the skippable frames:
#
#     skippable frame: INDEX_MAGIC u32, payload size u32 (8), compressed size u32, raw size u32
#     zstd frame:      compressed size bytes
#
# then one more skippable frame, the table of every block, so that a reader can plan ranges of whole
# blocks from the object's last bytes and decompress each range as it arrives:
#
#     TABLE_MAGIC u32, payload size u32 (entries + 12),
#     per block: compressed size u32, raw size u32,
#     blocks u32, crc32c of the per-block entries u32, TABLE_TAG (4 bytes)
#
# Byte grouping:
#
#     MAGIC                                   8 bytes
#     per block: compressed size  u32
#                raw size         u32
#                group width      u8     (1: bytes as they are; 2, 4, 8: grouped by position in words)
#                zstd frame       compressed size bytes
#
# A grouped block of ``n`` bytes holds byte 0 of every ``width``-byte word, then byte 1 of every word,
# and so on, for the first ``n - n % width`` bytes; the rest follow as they are. The object ends with a
# block table as the standard format's, whose entries also hold each block's width (compressed size
# u32, raw size u32, width u8) and whose tag is GROUPED_TABLE_TAG.
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


GROUP_WIDTHS = (2, 4, 8)
"""The word widths a block may be grouped by (1, bytes as they are, is always possible)."""


def is_compressed(head: bytes | bytearray | memoryview) -> bool:
    """Whether an object starting with ``head`` is compressed (by this module or by plain zstd)."""
    return bytes(head[: len(MAGIC)]) == MAGIC or bytes(head[:4]) in (_ZSTD_MAGIC, INDEX_MAGIC)


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
            sound = width in (1, *GROUP_WIDTHS)
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
