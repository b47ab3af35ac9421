"""Samples of tar shards read from GCS: each shard's index (``shard.tar.idx`` beside it, or made by reading
the shard once, then written there), runs of consecutive samples fetched as ranged GETs of whole samples a
few chunks ahead of their reader, and one sample by its own ranged GET; every member with a crc32c in the
index is checked against it, every read pinned to the generation listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from .._ops.checksums import ObjectInfo, crc32c_extend
from .._ops.client import Client
from .._ops.objects import read_object
from .._ops.urls import parse_url
from .._transport.context import RequestContext
from .._transport.loop import run, wait
from ..errors import GCSError, IntegrityError, PreconditionFailedError, ShardWarning
from .ranges import VersionRanges, read_into_buffer
from .tar_format import INDEX_SUFFIX, Member, Sample, decode_index, encode_index, read_members, samples_of, split_key

__all__ = ["CHUNK", "Shard", "fetch_sample", "index_shards", "read_run"]

CHUNK = 8 << 20
"""Bytes of whole samples one ranged GET of a run asks for (a larger sample is a GET alone)."""
_AHEAD = 2
"""Chunks of a run fetched ahead of its reader."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """A shard as listed, and the samples its index lists."""

    url: str
    info: ObjectInfo
    samples: list[Sample]


def index_shards(entries: Sequence[tuple[str, ObjectInfo]], client: Client, *, skip_bad: bool = False) -> list[Shard]:
    """Each shard with its samples, from the indexes beside them (read at once). A shard without one (or
    with one of another version) is read whole once to make it, and the index written beside it where the
    bucket allows (else a warning: it is made again next time). A shard that cannot be read as tar raises
    its ``IntegrityError``, or with ``skip_bad`` is left out with a ``ShardWarning``."""
    indexes = run(_read_indexes(client.context(), [url for url, _ in entries]))
    shards = []
    for (url, info), index in zip(entries, indexes, strict=True):
        samples = None
        if index is not None:
            with contextlib.suppress(IntegrityError):
                samples = decode_index(url + INDEX_SUFFIX, index, info.size, info.crc32c)
        if samples is None:
            try:
                samples = _index_by_reading(url, info, client, replacing=index is not None)
            except IntegrityError as exc:
                if not skip_bad:
                    raise
                warnings.warn(f"{exc}: the shard is left out", ShardWarning, stacklevel=2)
                continue
        shards.append(Shard(url, info, samples))
    return shards


async def _read_indexes(context: RequestContext, urls: list[str]) -> list[bytes | None]:
    async def one(url: str) -> bytes | None:
        bucket, name = parse_url(url + INDEX_SUFFIX)
        return await read_object(context, bucket, name)

    return list(await asyncio.gather(*(one(url) for url in urls)))


def _index_by_reading(url: str, info: ObjectInfo, client: Client, *, replacing: bool) -> list[Sample]:
    """The shard's samples, read whole; its index written beside it, or ``replacing`` one of another version
    (only while the shard is still the version read, and the old index is still the one there)."""
    data = read_into_buffer(url, info, client)  # checked against the shard's crc32c
    members = (
        (dataclasses.replace(member, crc32c=crc32c_extend(0, content)), content)
        for member, content in read_members(io.BytesIO(data).read, url)
    )
    samples = [sample for sample, _ in samples_of(members, url)]
    bucket, name = parse_url(url + INDEX_SUFFIX)
    try:
        if replacing and client.live_generation(*parse_url(url)) != info.generation:
            return samples  # the shard changed since it was listed: its index there may be the new one's
        old = client.live_generation(bucket, name) if replacing else 0
        client.create(bucket, name, encode_index(info.size, samples, info.crc32c), if_generation_match=old)
    except PreconditionFailedError:
        pass  # another reader wrote it first
    except GCSError as exc:
        warnings.warn(f"{url}: its index could not be written beside it ({exc})", ShardWarning, stacklevel=2)
    return samples


def _ranges(shard: Shard, client: Client) -> VersionRanges:
    """Ranges of one shard's listed version, each fetched on the I/O loop."""
    return VersionRanges(client.context(), shard.url, {"alt": "media", "generation": shard.info.generation})


def _fetch_samples(ranges: VersionRanges, samples: Sequence[Sample]) -> Future[list[bytes]]:
    """The bytes from the first sample's first member to the last one's end."""
    start, end = samples[0].span[0], samples[-1].span[1]
    return ranges.fetch(start, end - start)


def _chunks(samples: Sequence[Sample], first: int, end: int) -> list[tuple[int, int]]:
    """Samples ``[first, end)`` grouped into consecutive ``[start, stop)`` of about :data:`CHUNK` bytes."""
    groups, start = [], first
    for index in range(first + 1, end + 1):
        if index == end or samples[index].span[1] - samples[start].span[0] > CHUNK:
            groups.append((start, index))
            start = index
    return groups


def read_run(shard: Shard, first: int, end: int, client: Client) -> Iterator[dict[str, Any]]:
    """Samples ``[first, end)`` of ``shard`` in order, fetched :data:`_AHEAD` chunks ahead."""
    ranges, groups = _ranges(shard, client), deque(_chunks(shard.samples, first, end))
    pending: deque[tuple[list[Sample], Future[list[bytes]]]] = deque()

    def launch() -> None:
        while groups and len(pending) < _AHEAD:
            start, stop = groups.popleft()
            pending.append((shard.samples[start:stop], _fetch_samples(ranges, shard.samples[start:stop])))

    try:
        launch()
        while pending:
            samples, future = pending.popleft()
            launch()
            yield from _checked(shard, samples, future, ranges, client)
    finally:
        for _, future in pending:
            future.cancel()


def fetch_sample(shard: Shard, index: int, client: Client) -> dict[str, Any]:
    """Sample ``index`` of ``shard``, by one ranged GET."""
    ranges, samples = _ranges(shard, client), shard.samples[index : index + 1]
    (carved,) = _checked(shard, samples, _fetch_samples(ranges, samples), ranges, client)
    return carved


def _checked(
    shard: Shard, samples: list[Sample], future: Future[list[bytes]], ranges: VersionRanges, client: Client
) -> list[dict[str, Any]]:
    """The samples ``future`` brings, each member checked; bytes damaged on the way are read again, as often
    as the retry policy allows."""
    for _ in range(client.retry.max_attempts - 1):
        try:
            return _carve(shard, samples, _joined(future))
        except IntegrityError as exc:
            client.stats.count_retry(exc)
            future = _fetch_samples(ranges, samples)
    return _carve(shard, samples, _joined(future))


def _joined(future: Future[list[bytes]]) -> bytes:
    chunks: list[bytes] = wait(future)
    return b"".join(chunks)


def _carve(shard: Shard, samples: Sequence[Sample], data: bytes) -> list[dict[str, Any]]:
    """The samples held by ``data`` (the bytes from the first one's first member), each member checked."""
    base, view, carved = samples[0].span[0], memoryview(data), []
    for sample in samples:
        found: dict[str, Any] = {"__key__": sample.key, "__url__": shard.url}
        for member in sample.members:
            content = view[member.offset - base : member.offset - base + member.size]
            _check(shard, member, content)
            found[split_key(member.name)[1]] = bytes(content)
        carved.append(found)
    return carved


def _check(shard: Shard, member: Member, content: memoryview) -> None:
    if len(content) != member.size or (member.crc32c is not None and crc32c_extend(0, content) != member.crc32c):
        raise IntegrityError(
            f"{shard.url}: member {member.name!r} at byte {member.offset} does not hold what its index says"
            f" ({len(content)} of {member.size} bytes, or another crc32c)",
            url=shard.url,
        )
