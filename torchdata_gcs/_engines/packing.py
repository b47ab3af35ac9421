"""Objects packed into WebDataset tar shards: the plan (samples by key, shards filled in name order, so the
listing alone fixes each shard's bytes), which planned shards a destination already holds, and the writing:
objects read in order while earlier shards publish, each shard whole on a clean close, then its index.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import posixpath
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import google_crc32c

from .._ops.checksums import ObjectInfo, crc32c_base64, crc32c_of_concatenation, crc32c_value
from .._ops.client import Client
from .._ops.paging import MAX_PAGE_SIZE
from .._ops.urls import format_url, parse_url
from ..config import WriteConfig
from ..errors import IntegrityError
from .download import load_in_order
from .listing import list_objects
from .publishing import StreamingWriter
from .streams import PartStream
from .tar_format import END, INDEX_SUFFIX, Member, Sample, encode_index, header, padding, split_key
from .upload import new_writer

logger = logging.getLogger(__name__)

__all__ = [
    "SHARDS_PUBLISHING",
    "PackCounts",
    "ShardPlan",
    "existing_shards",
    "pack_shards",
    "plan_shards",
    "shard_name",
]

SHARDS_PUBLISHING = 2
"""Finished shards closing (their last parts, the assembly, the index) while the next one fills."""
_SHARD_NAME = re.compile(r"shard-(\d{6,})\.tar(\.idx)?")


def shard_name(number: int) -> str:
    """``shard-000042.tar``: the name of shard ``number`` in its destination folder."""
    return f"shard-{number:06d}.tar"


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """One shard as the listing fixes it: its samples (members at their offsets), the objects in member
    order (each with the version listed), and its size in bytes (end blocks included)."""

    number: int
    samples: tuple[Sample, ...]
    objects: tuple[tuple[str, ObjectInfo], ...]
    size: int

    @property
    def name(self) -> str:
        return shard_name(self.number)

    def index(self) -> bytes:
        """The shard's index (``shard.tar.idx``)."""
        return encode_index(self.size, list(self.samples), self.crc32c())

    def crc32c(self) -> str | None:
        """The crc32c the shard's bytes have, from the listed crc32c of its objects (``None`` if one lacks it):
        what a shard already written must match to be kept."""
        pieces = []
        members = (member for sample in self.samples for member in sample.members)
        for member, (_, info) in zip(members, self.objects, strict=True):
            if info.crc32c is None:
                return None
            head = header(member.name, member.size)
            pieces += [(google_crc32c.value(head), len(head)), (crc32c_value(info.crc32c), info.size)]
            pieces.append(_zeros_crc32c(len(padding(member.size))))
        pieces.append(_zeros_crc32c(len(END)))
        return crc32c_base64(crc32c_of_concatenation(pieces))


@functools.cache
def _zeros_crc32c(length: int) -> tuple[int, int]:
    return google_crc32c.value(bytes(length)), length


def _samples(
    objects: Iterable[tuple[str, ObjectInfo]], prefix_url: str, by_stem: bool
) -> Iterator[list[tuple[str, str, ObjectInfo]]]:
    """The listed objects as samples, each a list of ``(member name, url, info)``: the names relative to
    ``prefix_url`` that share a key (``by_stem``), or each object alone. ``ValueError`` for a name with no
    key, or a key whose members another key's names separate in name order."""
    group: list[tuple[str, str, ObjectInfo]] = []
    key: str | None = None
    returnable: list[str] = []  # keys whose members may follow again: the current name starts with key + "."
    for url, info in objects:
        name = url[len(prefix_url) :]
        member_key, _ = split_key(name)
        if not posixpath.basename(member_key):
            raise ValueError(f"{url}: {name!r} has no sample key (a name starting with a dot): it cannot be packed")
        if by_stem and group and member_key == key:
            group.append((name, url, info))
            continue
        if group:
            yield group
        if by_stem:
            returnable = [k for k in [*returnable, *([key] if key else [])] if name.startswith(k + ".")]
            if member_key in returnable:
                raise ValueError(
                    f"{url}: the members of sample {member_key!r} are not adjacent in name order (names under "
                    f"{member_key}.*/ come between them): rename them, or pack with group_by=None"
                )
        key, group = member_key, [(name, url, info)]
    if group:
        yield group


def plan_shards(
    objects: Iterable[tuple[str, ObjectInfo]], prefix_url: str, shard_size: int, *, by_stem: bool
) -> Iterator[ShardPlan]:
    """The shards of ``objects`` (listed in name order under ``prefix_url``): samples taken in order, each
    shard filled until the next sample would take it past ``shard_size`` bytes; a sample is never split,
    and one larger than ``shard_size`` is a shard alone."""
    number, filled = 0, 0
    samples: list[Sample] = []
    chosen: list[tuple[str, ObjectInfo]] = []
    for group in _samples(objects, prefix_url, by_stem):
        heads = [len(header(name, info.size)) for name, _, info in group]
        length = sum(head + _padded(info.size) for head, (_, _, info) in zip(heads, group, strict=True))
        if samples and filled + length + len(END) > shard_size:
            yield ShardPlan(number, tuple(samples), tuple(chosen), filled + len(END))
            number, filled, samples, chosen = number + 1, 0, [], []
        members = []
        for head, (name, url, info) in zip(heads, group, strict=True):
            crc = None if info.crc32c is None else crc32c_value(info.crc32c)  # what a reader checks each member against
            members.append(Member(name, filled + head, info.size, crc))
            filled += head + _padded(info.size)
            chosen.append((url, info))
        samples.append(Sample(split_key(group[0][0])[0], tuple(members)))
    if samples:
        yield ShardPlan(number, tuple(samples), tuple(chosen), filled + len(END))


def _padded(size: int) -> int:
    return size + len(padding(size))


def existing_shards(client: Client, folder_url: str) -> dict[str, ObjectInfo]:
    """The shards and indexes (``shard-NNNNNN.tar[.idx]``) already in the destination folder, by name."""
    bucket, folder = parse_url(folder_url)
    found = {}
    for batch in list_objects(client, bucket, folder + "shard-", MAX_PAGE_SIZE, as_prefix=True):
        for resource in batch:
            name = resource["name"][len(folder) :]
            if _SHARD_NAME.fullmatch(name):
                found[name] = ObjectInfo.from_json(resource)
    return found


@dataclasses.dataclass
class PackCounts:
    """What a pack has done so far: objects (and their bytes) read into shards, the samples of the shards
    filled, the shards published with their index, and the planned shards found already there (kept)."""

    samples: int = 0
    objects: int = 0
    bytes: int = 0
    shards_written: int = 0
    shards_kept: int = 0


def pack_shards(
    client: Client,
    plans: Iterable[ShardPlan],
    folder_url: str,
    write: WriteConfig,
    existing: dict[str, ObjectInfo],
    progress: Callable[[PackCounts], None] = lambda counts: None,
) -> PackCounts:
    """Write each planned shard under ``folder_url`` that ``existing`` does not already hold, then its index.

    A shard is kept when the destination holds it with the planned size and crc32c (computed from the
    listing) and an index of the planned bytes; a kept shard whose index is missing or different gets the
    planned index. Any other shard is written again, a different index deleted first, so an index is only
    ever beside a complete shard it describes (the planned index describes the old shard and the new
    alike). Objects are read in order, pinned to their listed versions, as many at once as
    ``client.transfer`` allows; a shard is written as they arrive and handed to one of
    :data:`SHARDS_PUBLISHING` threads that close it (publish) and write its index, while the next fills.
    On an error the shard being filled is aborted (nothing of it published), those publishing finish, and
    the error is raised. ``progress`` is called with the counts after each object and shard.
    """
    bucket, folder = parse_url(folder_url)
    counts = PackCounts()
    lock = threading.Lock()  # counts and progress, from this thread and the publishing ones
    filling: deque[ShardPlan] = deque()  # planned shards whose objects are on their way, in order
    publishing: deque[Future[None]] = deque()
    indexed: set[int] = set()  # shards to write again whose index is already the planned one
    threads = ThreadPoolExecutor(SHARDS_PUBLISHING, thread_name_prefix="torchdata-gcs-pack")

    def count(**more: int) -> None:
        with lock:
            for name, value in more.items():
                setattr(counts, name, getattr(counts, name) + value)
            progress(counts)

    def wait_until(at_most: int) -> None:
        while len(publishing) > at_most:
            publishing.popleft().result()

    def write_index(plan: ShardPlan) -> None:
        client.create(bucket, folder + plan.name + INDEX_SUFFIX, plan.index(), if_generation_match=0)

    def publish(writer: StreamingWriter, plan: ShardPlan) -> None:
        writer.close()
        if plan.number not in indexed:
            write_index(plan)
        count(shards_written=1)

    def keep_index(plan: ShardPlan) -> None:
        write_index(plan)
        count(shards_kept=1)

    def objects() -> Iterator[tuple[str, ObjectInfo]]:
        for plan in plans:
            shard, index = existing.get(plan.name), existing.get(plan.name + INDEX_SUFFIX)
            index_matches = index is not None and _same(index, plan.index())
            if index is not None and not index_matches:
                logger.info("%s: its index is not that of the planned shard: deleted", plan.name)
                client.delete(bucket, folder + plan.name + INDEX_SUFFIX, if_generation_match=index.generation)
            if shard is not None and shard.size == plan.size and shard.crc32c == plan.crc32c():
                if index_matches:
                    count(shards_kept=1)
                else:
                    publishing.append(threads.submit(keep_index, plan))
                continue
            if index_matches:  # the same members, other bytes: the index describes the new shard too
                indexed.add(plan.number)
            filling.append(plan)
            yield from plan.objects

    writer: StreamingWriter | None = None
    loaded = load_in_order(objects(), client, skip_missing=False)
    try:
        plan, members, position = ShardPlan(-1, (), (), 0), list[Member](), 0
        for url, data in loaded:
            if writer is None:
                plan, position = filling.popleft(), 0
                members = [member for sample in plan.samples for member in sample.members]
                writer = new_writer(format_url(bucket, folder + plan.name), client, write)
            member = members[position]
            writer.write(header(member.name, member.size))
            written = _write_data(writer, data)
            if written != member.size:
                raise IntegrityError(f"{url}: {written} bytes read, {member.size} listed", url=url)
            writer.write(padding(member.size))
            position += 1
            if position == len(members):
                writer.write(END)
                publishing.append(threads.submit(publish, writer, plan))
                writer = None
                wait_until(SHARDS_PUBLISHING)
                count(samples=len(plan.samples))
            count(objects=1, bytes=member.size)
        wait_until(0)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        getattr(loaded, "close", lambda: None)()  # the reads still on their way cancelled
        threads.shutdown(wait=True)  # a shard being published finishes: it and its index are whole
    return counts


def _write_data(writer: StreamingWriter, data: object) -> int:
    """Write an object's bytes as the download engine delivers them; how many there were."""
    if isinstance(data, PartStream):
        written = 0
        with data:
            while chunk := data.read(1024 * 1024):
                written += writer.write(chunk)
        return written
    pieces = [data] if isinstance(data, bytes) else data
    assert isinstance(pieces, list)
    return sum(writer.write(piece) for piece in pieces)


def _same(stored: ObjectInfo, data: bytes) -> bool:
    """Whether the stored object holds ``data`` (its size and crc32c say so)."""
    return stored.size == len(data) and stored.crc32c == crc32c_base64(data)
