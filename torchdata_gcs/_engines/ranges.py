"""Ranged reads of one object version: each range resumed from the byte it reached and checked for its
length, handed over as it arrives, collected as chunks, or read concurrently into a caller's buffer with
the crc32c of the whole. Into a buffer, the transport puts each piece of a body in place
(``Response.readinto``) and it is hashed there, while in cache: no copy of ours, no ``bytes`` per piece."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._ops.checksums import (
    ObjectInfo,
    check_crc32c,
    crc32c_base64,
    crc32c_extend,
    crc32c_of_concatenation,
    reported_crc32c,
)
from .._ops.client import Client
from .._ops.objects import object_resource
from .._ops.urls import parse_url
from .._transport.context import RequestContext, with_retry
from .._transport.http import is_missing_bucket
from .._transport.loop import run
from .._transport.retry import Attempts
from .._transport.transport import Response
from ..errors import GCSError, IntegrityError, NotFoundError

__all__ = [
    "read_into",
    "read_into_buffer",
    "read_range",
    "read_ranges_into",
    "read_version_start",
    "size_in_content_range",
    "stream_range",
    "take_piece",
    "version_gone",
]


def version_gone(url: str, params: dict[str, Any], exc: NotFoundError) -> NotFoundError:
    """A 404 on a read pinned to a generation: say that the object changed under us."""
    return NotFoundError(
        f"{url} generation {params['generation']} no longer exists: the object was deleted or "
        "overwritten after it was listed or while it was read",
        url=url,
        status=exc.status,
    )


async def _pinned(
    context: RequestContext, url: str, params: dict[str, Any], attempt: Callable[[], Awaitable[None]]
) -> None:
    """Run ``attempt`` as retries allow; a 404 of a read pinned to a generation says the version is gone."""
    try:
        await with_retry(context, url, attempt)
    except NotFoundError as exc:
        if is_missing_bucket(exc) or "generation" not in params:
            raise
        raise version_gone(url, params, exc) from exc


_CONTENT_RANGE = re.compile(r"bytes 0-(\d+)/(\d+)")


def size_in_content_range(url: str, response: Any, part_size: int) -> int:
    """The object's size, as a 206 answer to ``Range: bytes=0-{part_size - 1}`` names it in its
    ``Content-Range`` (``bytes 0-LAST/SIZE``); ``GCSError`` if it names no size or another range.

    >>> from types import SimpleNamespace
    >>> size_in_content_range("gs://b/o", SimpleNamespace(headers={"Content-Range": "bytes 0-99/1000"}), 100)
    1000
    >>> size_in_content_range("gs://b/o", SimpleNamespace(headers={"Content-Range": "bytes 0-9/10"}), 100)
    10
    >>> size_in_content_range("gs://b/o", SimpleNamespace(headers={"Content-Range": "bytes 0-9/*"}), 100)
    Traceback (most recent call last):
    torchdata_gcs.errors.GCSError: gs://b/o: asked for bytes 0-99, got status 206 with Content-Range bytes 0-9/*
    """
    answered = response.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(answered.strip())
    if match is None or int(match.group(1)) != min(int(match.group(2)), part_size) - 1:
        raise GCSError(
            f"{url}: asked for bytes 0-{part_size - 1}, got status 206 with Content-Range {answered or 'missing'}",
            url=url,
            status=206,
        )
    return int(match.group(2))


def _check_range_answer(url: str, response: Response, start: int, end: int) -> None:
    """Raise ``GCSError`` unless ``response`` is a 206 starting at ``start``: a 200 carries the whole
    object (something on the way dropped the Range or ``Accept-Encoding: gzip`` header, and GCS ignores
    Range when it decompresses a gzip-encoded object), which a new attempt would get again."""
    answered = response.headers.get("Content-Range", "")
    if response.status != 206 or (answered and not answered.startswith(f"bytes {start}-")):
        raise GCSError(
            f"{url}: asked for bytes {start}-{end - 1}, got status {response.status} "
            f"(Content-Range {answered or 'missing'}); a proxy between here and GCS may have dropped the "
            "Range or Accept-Encoding header",
            url=url,
            status=response.status,
        )


async def stream_range(
    context: RequestContext,
    url: str,
    path: str,
    params: dict[str, Any],
    start: int,
    length: int,
    take: Callable[[int, bytes], None],
) -> None:
    """Hand bytes ``[start, start + length)`` of the object to ``take(offset, chunk)`` as they arrive,
    by ranged GETs that resume from the byte they reached (each byte is taken once)."""
    end = start + length
    position = start

    async def attempt() -> None:
        nonlocal position
        async with context.session.read_media(url, path, params, {"Range": f"bytes={position}-{end - 1}"}) as response:
            _check_range_answer(url, response, position, end)
            async for chunk in response.chunks():
                if position + len(chunk) > end:
                    raise IntegrityError(f"{url}: the range answer ran past byte {end}", url=url)
                take(position, chunk)
                position += len(chunk)
                context.stats.bytes += len(chunk)
        if position < end:
            raise IntegrityError(f"{url}: the range answer stopped at byte {position} of {end}", url=url)

    await _pinned(context, url, params, attempt)


async def read_range(
    context: RequestContext, url: str, path: str, params: dict[str, Any], start: int, length: int
) -> list[bytes]:
    """Bytes ``[start, start + length)`` of the object as received (chunks, never joined: a join
    would hold them twice)."""
    chunks: list[bytes] = []
    await stream_range(context, url, path, params, start, length, lambda _, chunk: chunks.append(chunk))
    return chunks


async def take_piece(response: Response, target: memoryview, crc: int) -> tuple[int, int]:
    """The next piece of ``response``'s body put into ``target`` by the transport, and ``crc`` extended by
    it while it is in cache: how many bytes (``0`` at the end of the body) and the new crc32c."""
    count = await response.readinto(target)
    return count, crc32c_extend(crc, target[:count])


async def _read_range_into(
    context: RequestContext,
    url: str,
    path: str,
    params: dict[str, Any],
    buffer: memoryview,
    start: int,
    learn: Callable[[Response], int] | None = None,
) -> int:
    """Fill ``buffer`` with the object's bytes from ``start`` by ranged GETs that resume from the byte they
    reached; returns their crc32c (each piece hashed as it lands, once: a resumed GET adds to it). With
    ``learn``, each answer tells how many of ``buffer``'s bytes the object holds (``learn(response)``)."""
    end = start + len(buffer)
    filled = crc = 0

    async def attempt() -> None:
        nonlocal buffer, end, filled, crc
        position = start + filled
        async with context.session.read_media(url, path, params, {"Range": f"bytes={position}-{end - 1}"}) as response:
            _check_range_answer(url, response, position, end)
            if learn is not None:
                buffer = buffer[: learn(response)]
                end = start + len(buffer)
            while filled < len(buffer):
                count, crc = await take_piece(response, buffer[filled:], crc)
                if not count:
                    break
                filled += count
                context.stats.bytes += count
            if filled == len(buffer) and await response.readinto(memoryview(bytearray(1))):
                raise IntegrityError(f"{url}: the range answer ran past byte {end}", url=url)
        if filled < len(buffer):
            raise IntegrityError(f"{url}: the range answer stopped at byte {start + filled} of {end}", url=url)

    await _pinned(context, url, params, attempt)
    return crc


async def read_version_start(context: RequestContext, url: str, buffer: memoryview) -> tuple[ObjectInfo, int]:
    """The object's first bytes (``buffer``'s size, or all of a smaller object) put into ``buffer``, by a
    ranged GET of the live version, resumed if cut from the byte it reached, pinned to the generation the
    first answer names; that version as the answer describes it (size from ``Content-Range``, generation
    from ``x-goog-generation``, crc32c from ``x-goog-hash``, the whole object's even for a range) and the
    crc32c of the bytes read. Where the answer lacks the generation or crc32c (GCS promises neither
    header), one metadata request asks them. An empty object has no byte 0: ``GCSError`` of status 416.
    """
    bucket, name = parse_url(url, allow_prefix=False)
    params: dict[str, Any] = {"alt": "media"}
    described: dict[str, Any] = {}

    def learn(response: Response) -> int:
        if not described:  # the first answer, asked from byte 0: a resumed one names another range
            described["size"] = size_in_content_range(url, response, len(buffer))
            described["crc32c"] = reported_crc32c(response.headers)
            if "x-goog-generation" in response.headers:
                params["generation"] = int(response.headers["x-goog-generation"])
        return min(len(buffer), described["size"])

    crc = await _read_range_into(context, url, context.session.media_path(bucket, name), params, buffer, 0, learn)
    if "generation" not in params or described["crc32c"] is None:
        fields = "generation,crc32c"
        pinned = params.get("generation")
        resource = await object_resource(
            context, bucket, name, fields, generation=pinned, required=("generation",), missing_ok=False
        )
        assert resource is not None
        params["generation"] = int(resource["generation"])
        described["crc32c"] = described["crc32c"] or resource.get("crc32c")
    return ObjectInfo(described["size"], params["generation"], described["crc32c"]), crc


async def read_ranges_into(
    context: RequestContext, url: str, generation: int, start: int, buffer: memoryview, part_size: int
) -> int:
    """Fill ``buffer`` with the object's bytes from ``start`` as concurrent ranged GETs of ``part_size``, all
    pinned to ``generation``, each checked for its length and resumed if cut; their combined crc32c."""
    bucket, name = parse_url(url, allow_prefix=False)
    path = context.session.media_path(bucket, name)
    params: dict[str, Any] = {"alt": "media", "generation": generation}
    offsets = range(0, len(buffer), part_size)
    crcs = await asyncio.gather(
        *(_read_range_into(context, url, path, params, buffer[o : o + part_size], start + o) for o in offsets)
    )
    return crc32c_of_concatenation(zip(crcs, (min(part_size, len(buffer) - o) for o in offsets), strict=True))


def read_into_buffer(url: str, info: ObjectInfo, client: Client) -> bytearray:
    """One object (the version ``info`` names) in a new buffer, read as :func:`read_into` reads."""
    buffer = bytearray(info.size)
    read_into(memoryview(buffer), url, info, client)
    return buffer


def read_into(target: memoryview, url: str, info: ObjectInfo, client: Client) -> None:
    """One object (the version ``info`` names) read as concurrent ranges of ``part_size`` straight into
    ``target`` (its size), and checked against ``info``'s crc32c without another pass over the bytes.

    Bytes damaged on the way are read again, all of them (GCS keeps no checksum per range to tell which
    range was hit), as retries allow."""
    context = client.context()
    rereads = Attempts(client.retry, url, on_retry=client.stats.count_retry)
    while True:
        reading = read_ranges_into(context, url, info.generation, 0, target, client.transfer.part_size)
        crc = run(reading)
        try:
            check_crc32c(url, crc32c_base64(crc), {"GCS": info.crc32c})
            return
        except IntegrityError as exc:
            time.sleep(rereads.delay_after(exc))
