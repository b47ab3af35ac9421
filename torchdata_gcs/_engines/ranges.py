"""One object version read for a blocking caller: whole, as concurrent ranges straight into the caller's
buffer, checked against the object's crc32c without another pass, and read again while damaged; or a span
of it, as concurrent ranges into the bytes returned, checked by length (and by crc32c if it is all of it).
A whole object goes out as at least :data:`RANGES_AT_ONCE` GETs where its size allows (:func:`range_size`).
And :class:`VersionRanges`, one version's ranges each read on the I/O loop when asked (a stream's or a shard's)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from .._ops.checksums import ObjectInfo, check_crc32c, crc32c_base64
from .._ops.client import Client
from .._ops.reads import read_range, read_ranges_into
from .._ops.urls import parse_url
from .._transport.context import RequestContext
from .._transport.loop import run, submit
from .._transport.retry import reread_while_damaged
from .._transport.transport import FilledBytes

__all__ = [
    "MIN_RANGE",
    "RANGES_AT_ONCE",
    "VersionRanges",
    "range_size",
    "read_into",
    "read_into_buffer",
    "read_span",
    "read_span_async",
]

RANGES_AT_ONCE = 16
"""Concurrent GETs a whole object is read as, at least, where its size allows: one connection's throughput
(GCS's is per connection) would otherwise bound the read of an object only a few ``part_size`` long."""

MIN_RANGE = 256 * 1024
"""The smallest range worth its own GET."""


def range_size(length: int, part_size: int) -> int:
    """How much one GET of a whole ``length``-byte object takes: at most ``part_size``, and small enough that
    the read goes out as :data:`RANGES_AT_ONCE` concurrent GETs, but never under :data:`MIN_RANGE`.

    >>> MiB = 1024 * 1024
    >>> range_size(128 * MiB, 32 * MiB) // MiB, range_size(2048 * MiB, 32 * MiB) // MiB, range_size(MiB, 32 * MiB)
    (8, 32, 262144)
    """
    return max(MIN_RANGE, min(part_size, -(-length // RANGES_AT_ONCE)))


def read_into_buffer(url: str, info: ObjectInfo, client: Client) -> bytearray:
    """One object (the version ``info`` names) in a new buffer, read as :func:`read_into` reads."""
    buffer = bytearray(info.size)
    read_into(memoryview(buffer), url, info, client)
    return buffer


def read_into(target: memoryview, url: str, info: ObjectInfo, client: Client) -> None:
    """One object (the version ``info`` names) read as concurrent ranges (:func:`range_size`) straight into
    ``target`` (its size), and checked against ``info``'s crc32c without another pass over the bytes;
    read again, all of it, while damaged, as retries allow."""
    context = client.context()
    size = range_size(len(target), client.transfer.part_size)

    def read() -> int:
        return run(read_ranges_into(context, url, info.generation, 0, target, size))

    def check(crc: int) -> None:
        check_crc32c(url, crc32c_base64(crc), {"GCS": info.crc32c})

    reread_while_damaged(read, check, client.retry, url, client.stats.count_retry)


async def read_span_async(url: str, info: ObjectInfo, start: int, end: int, client: Client) -> bytes:
    """Bytes ``[start, end)`` of the version ``info`` names, as concurrent ranged GETs of ``part_size``;
    checked by length, and by crc32c when they are the whole object."""
    if end <= start:
        return b""
    buffer = FilledBytes(end - start)  # the bytes returned, held once
    crc = await read_ranges_into(client.context(), url, info.generation, start, buffer.view, client.transfer.part_size)
    if start == 0 and end == info.size:
        check_crc32c(url, crc32c_base64(crc), {"GCS": info.crc32c})
    return buffer.take()


def read_span(url: str, info: ObjectInfo, start: int, end: int, client: Client) -> bytes:
    """:func:`read_span_async`, for a thread that waits for the bytes."""
    return run(read_span_async(url, info, start, end, client))


class VersionRanges:
    """Ranges of one object version, read on this process's I/O loop: a large object's stream reads its parts
    through one, a shard's reader its runs of samples.

    Pickles as the settings that read them (a handle reading as its context does, URL, generation), so a
    stream unpickled in another process reads the rest from there.
    """

    def __init__(self, context: RequestContext, url: str, params: dict[str, Any]) -> None:
        bucket, name = parse_url(url, allow_prefix=False)
        self._context, self._url, self._params = context, url, params
        self._path = context.session.media_path(bucket, name)

    def fetch(self, start: int, length: int) -> Future[list[bytes]]:
        reading = read_range(self._context, self._url, self._path, self._params, start, length)
        return submit(reading)

    def __reduce__(self) -> tuple[Any, ...]:
        return _ranges_in_this_process, (Client.reading_as(self._context), self._url, dict(self._params))


def _ranges_in_this_process(client: Client, url: str, params: dict[str, Any]) -> VersionRanges:
    return VersionRanges(client.context(), url, params)
