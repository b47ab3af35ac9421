"""Reading a compressed checkpoint straight into its decompressed bytes, decompressing as it downloads.

A standard-format object ends with its block table (see :mod:`.compression`), so its last bytes say
where every block lies. The blocks are read as concurrent ranges of whole blocks, as many ranges as
the uncompressed object would be read in, and each range is decompressed on a thread the moment it
arrives, every block into its own place in the output. Nothing waits for the whole download, and
the compressed bytes are held only while their range is in flight or being decompressed.
"""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import zstandard

from .._ops.checksums import ObjectInfo, check_crc32c, crc32c_base64, crc32c_of_concatenation
from .._ops.client import Client
from .._ops.reads import read_ranges_into
from .._transport.context import RequestContext
from .._transport.loop import run
from .._transport.retry import reread_while_damaged
from ..errors import IntegrityError
from .compression import Block, place, read_block_table
from .ranges import range_size

__all__ = ["TAIL", "block_table_of", "read_decompressed_into"]

TAIL = 64 * 1024
"""Bytes read from an object's end to find its block table (more only if the table is longer)."""


async def _tail(context: RequestContext, url: str, info: ObjectInfo, length: int) -> bytes:
    buffer = bytearray(min(length, info.size))
    await read_ranges_into(
        context, url, info.generation, info.size - len(buffer), memoryview(buffer), max(1, len(buffer))
    )
    return bytes(buffer)


def block_table_of(url: str, info: ObjectInfo, client: Client) -> tuple[list[Block], bytes] | None:
    """The blocks of a standard-format compressed object and the table frame's bytes, from its last
    bytes (one ranged GET, rarely two); ``None`` for any other object (uncompressed, byte-grouped,
    written before block tables, or by another zstd writer)."""
    if info.size == 0:
        return None
    context = client.context()

    def run_tail(length: int) -> bytes:
        return run(_tail(context, url, info, length))

    def check(tail: bytes) -> tuple[bytes, list[Block] | int | None]:
        return tail, read_block_table(tail, info.size, url)  # damaged on the way (it has its own checksum)

    length = TAIL
    while True:
        reading = functools.partial(run_tail, length)
        tail, found = reread_while_damaged(reading, check, client.retry, url, client.stats.count_retry)
        if not isinstance(found, int):
            break
        length = found  # a table longer than the tail read
    if found is None:
        return None
    table_size = info.size - (found[-1].frame + found[-1].compressed if found else 0)
    return found, tail[len(tail) - table_size :]


def _ranges(blocks: list[Block], target: int) -> list[list[Block]]:
    """Consecutive blocks grouped into ranges of about ``target`` compressed bytes."""
    ranges: list[list[Block]] = [[]]
    for block in blocks:
        if ranges[-1] and ranges[-1][-1].frame + ranges[-1][-1].compressed - ranges[-1][0].start >= target:
            ranges.append([])
        ranges[-1].append(block)
    return [group for group in ranges if group]


def _restore(buffer: bytearray, start: int, group: list[Block], target: memoryview, url: str) -> None:
    """Decompress each block of a range (``buffer`` holds the object's bytes from ``start``) into its
    place in ``target``; zstd checks each frame's content checksum."""
    view = memoryview(buffer)
    decompressor = zstandard.ZstdDecompressor()
    for block in group:
        frame = view[block.frame - start : block.frame - start + block.compressed]
        try:
            plain = decompressor.decompress(frame, max_output_size=block.raw)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{url}: damaged zstd block at byte {block.frame} ({exc})", url=url) from exc
        if len(plain) != block.raw:
            raise IntegrityError(f"{url}: a block holds {len(plain)} bytes, the table says {block.raw}", url=url)
        place(plain, target[block.raw_offset : block.raw_offset + block.raw], block.width)


def read_decompressed_into(
    target: memoryview,
    url: str,
    info: ObjectInfo,
    table: tuple[list[Block], bytes],
    client: Client,
) -> None:
    """Fill ``target`` (the decompressed size) with the object's original bytes, read in ranges of
    whole blocks pinned to ``info``'s generation and decompressed as each range arrives, on up to 4
    threads. The compressed bytes are checked against the object's crc32c (from the ranges' checksums,
    no second pass), and every block against its zstd content checksum; damaged bytes are read again."""
    blocks, table_frame = table
    raw_size = sum(block.raw for block in blocks)
    raw_range = range_size(raw_size, client.transfer.part_size)
    target_bytes = max(1, raw_range * info.size // max(1, raw_size))  # as many ranges as the raw object
    groups = _ranges(blocks, target_bytes)
    context = client.context()

    Piece = tuple[int, int, IntegrityError | None]  # a range's crc32c and size, and the damage its frames showed

    async def one(group: list[Block], pool: ThreadPoolExecutor) -> Piece:
        start = 0 if group is groups[0] else group[0].start  # the first range also covers the format's magic
        buffer = bytearray(group[-1].frame + group[-1].compressed - start)
        crc = await read_ranges_into(context, url, info.generation, start, memoryview(buffer), len(buffer))
        try:
            await asyncio.get_running_loop().run_in_executor(pool, _restore, buffer, start, group, target, url)
        except IntegrityError as damage:
            return crc, len(buffer), damage
        return crc, len(buffer), None

    async def everything(pool: ThreadPoolExecutor) -> list[Piece]:
        return await asyncio.gather(*(one(group, pool) for group in groups))

    def read() -> list[Piece]:
        with ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="torchdata-gcs-unzstd") as pool:
            return run(everything(pool))

    def check(pieces: list[Piece]) -> None:  # a damaged frame or a wrong crc32c of the object: read it all again
        for _, _, damage in pieces:
            if damage is not None:
                raise damage
        tiles = [(crc, size) for crc, size, _ in pieces] + [(google_crc32c.value(table_frame), len(table_frame))]
        check_crc32c(url, crc32c_base64(crc32c_of_concatenation(tiles)), {"GCS": info.crc32c})

    reread_while_damaged(read, check, client.retry, url, client.stats.count_retry)
