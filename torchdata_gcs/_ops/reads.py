"""What one media request does: send a GET of an object's bytes and read its answer, as GCS documents it.

A first answer says the object's size, generation and crc32c (:class:`MediaAnswer`); ranged reads of one
version resume from the byte they reached, are checked for their length and are collected as chunks or
read straight into a caller's buffer, where the transport puts each piece (``Response.readinto``) and it
is hashed while in cache. Engines hold a request context and read through these; they never see a response.
The URL such a GET goes to is given out too, for others to read an object from."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any

from .._transport.context import RequestContext, with_retry
from .._transport.http import is_missing_bucket
from .._transport.session import media_url
from .._transport.transport import Response
from ..errors import GCSError, IntegrityError, NotFoundError
from .checksums import ObjectInfo, crc32c_extend, crc32c_of_concatenation, reported_crc32c
from .objects import object_resource
from .urls import parse_url

__all__ = [
    "MediaAnswer",
    "learn_version",
    "media_answer",
    "media_read_url",
    "read_range",
    "read_ranges_into",
    "read_version_start",
    "size_in_content_range",
    "stream_range",
    "version_gone",
]


def media_read_url(endpoint: str, bucket: str, name: str, generation: int | None = None) -> str:
    """The URL a GET of the object's bytes (of ``generation`` if given) goes to on ``endpoint``: what anyone
    with credentials (or none, for a public object) reads it from."""
    url = f"{media_url(endpoint, bucket, name)}?alt=media"
    return url if generation is None else f"{url}&generation={generation}"


def version_gone(url: str, params: dict[str, Any], exc: NotFoundError) -> NotFoundError:
    """A 404 on a read pinned to a generation: say that the object changed under us."""
    return NotFoundError(
        f"{url} generation {params['generation']} no longer exists: the object was deleted or "
        "overwritten after it was listed or while it was read",
        url=url,
        status=exc.status,
    )


async def _pinned(
    context: RequestContext, url: str, params: dict[str, Any], attempt: Callable[[], Coroutine[Any, Any, None]]
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


async def _take_piece(response: Response, target: memoryview, crc: int) -> tuple[int, int]:
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
                count, crc = await _take_piece(response, buffer[filled:], crc)
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


async def learn_version(
    context: RequestContext, url: str, params: dict[str, Any], checksums: dict[str, str | None]
) -> None:
    """Pin ``params`` to the object's generation and learn its crc32c from its metadata, for an object
    whose first answer did not report them (read in several ranges, or with no checksum known)."""
    bucket, name = parse_url(url, allow_prefix=False)
    resource = await object_resource(
        context,
        bucket,
        name,
        "generation,crc32c",
        generation=params.get("generation"),
        required=("generation",),
        missing_ok=False,
    )
    assert resource is not None
    params["generation"] = resource["generation"]
    checksums["GCS"] = checksums["GCS"] or resource.get("crc32c")


class MediaAnswer:
    """An answer to a GET of an object's bytes, as the async context manager of its request (one object per read):
    what its headers say of the object, and its body, read on demand. GCS does not promise ``x-goog-hash``,
    ``x-goog-generation`` or ``Content-Length``: each may be missing (``None``). The hash of a ranged answer is
    the whole object's ("Hashes and ETags: best practices")."""

    __slots__ = ("_response", "_sent", "crc32c", "generation", "status", "url")

    def __init__(self, context: RequestContext, url: str, path: str, params: dict[str, Any], headers: Any) -> None:
        self.url, self._sent = url, context.session.read_media(url, path, params, headers)
        self._response: Response
        self.status = 0
        self.crc32c: str | None = None
        self.generation: str | None = None

    async def __aenter__(self) -> MediaAnswer:
        response = self._response = await self._sent.__aenter__()
        self.status = response.status
        self.crc32c = reported_crc32c(response.headers)
        self.generation = response.headers.get("x-goog-generation")
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool | None:
        return await self._sent.__aexit__(kind, exc, traceback)

    def object_size(self, first_part: int) -> int | None:
        """The object's size: named by a 206 answer to a request for its first ``first_part`` bytes, or
        by the ``Content-Length`` of a whole one; ``None`` where the answer does not say."""
        if self.status == 206:
            return size_in_content_range(self.url, self._response, first_part)
        length = self._response.headers.get("Content-Length")
        return None if length is None else int(length)

    async def read_at_most(self, limit: int) -> list[bytes]:
        """Up to ``limit`` bytes of the body, in the chunks they came in."""
        chunks: list[bytes] = []
        received = 0
        if limit > 0:
            async for chunk in self._response.chunks():
                chunks.append(chunk[: limit - received])
                received += len(chunks[-1])
                if received >= limit:
                    break
        return chunks

    async def read_into(self, target: memoryview, *, to_the_end: bool) -> tuple[int, int]:
        """Fill ``target`` from the body as it arrives (each piece put in place by the transport), until
        ``target`` is full and, ``to_the_end``, the body ends; the bytes received (one more than ``target``
        holds if the body was longer) and the crc32c of those put in place."""
        received = crc = 0
        while received < len(target):
            count, crc = await _take_piece(self._response, target[received:], crc)
            if not count:
                return received, crc
            received += count
        if to_the_end:
            received += await self._response.readinto(memoryview(bytearray(1)))
        return received, crc


def media_answer(
    context: RequestContext, url: str, path: str, params: dict[str, Any], headers: dict[str, str] | None = None
) -> AbstractAsyncContextManager[MediaAnswer]:
    """GET the object's bytes at media ``path`` (its ``params`` and any ``headers``, such as ``Range``), as
    ``async with media_answer(...) as answer``; a non-2xx answer raises its typed error naming ``url``."""
    return MediaAnswer(context, url, path, params, headers)
