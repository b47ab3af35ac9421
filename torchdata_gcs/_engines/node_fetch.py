"""Files fetched once per machine by the ranks of a process group, into shared memory every rank there maps.

The ranks tell each other their machine (host, boot and shared-memory mount) and process; the lowest rank
of each machine reads the start of every file (whose answer names its version) into one new segment of
``/dev/shm``, then every rank of the machine reads its share of the remaining ranges into it, and all
compare crc32c. The segment's name is removed once every rank has mapped it, or by every rank on a
failure, so nothing of it outlives the load but the memory that tensors viewing it hold. A rank that fails
sends its error to the others; one that dies is named by its process where it ran on the same machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import mmap
import os
import pickle
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .._ops.checksums import ObjectInfo, crc32c_base64, crc32c_of_concatenation
from .._ops.client import Client
from .._ops.reads import read_ranges_into, read_version_start
from .._transport.context import RequestContext
from .._transport.deadline import call_deadline
from .._transport.loop import run
from ..errors import GCSError, IntegrityError, RankFailedError
from .process_groups import SHARED_MEMORY, alive, machine, timeout_of

__all__ = ["fetch_once_per_machine"]

_FIRST_READ = 1 << 20
"""Bytes of each file the first read asks for (a safetensors header in nearly every file)."""
_ALIGN = 4096
"""Each file starts on a page of the segment, so a tensor aligned in its file is aligned in memory."""

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class _Rank:
    """What a rank tells the others first: its machine, its process, and a name for a segment it would make."""

    machine: tuple[str, str, int]
    pid: int
    token: str


@dataclasses.dataclass(frozen=True)
class _Layout:
    """What the first rank of a machine sends: each file's version, where it starts in the segment, and
    the first bytes it put there (their count and crc32c)."""

    infos: list[ObjectInfo]
    starts: list[int]
    first: list[tuple[int, int]]
    size: int


def fetch_once_per_machine(urls: list[str], client: Client, group: Any) -> list[torch.Tensor]:
    """The bytes of each file, as ``uint8`` tensors viewing one shared segment per machine, fetched once per
    machine by the ranks of ``group`` there (every rank of ``group`` must call this with the same ``urls``).

    Raises the load's own error (``NotFoundError``, ``IntegrityError``, ...) on every rank, or
    ``RankFailedError`` naming a rank that failed or stopped, within the group's timeout."""
    meeting = _Meeting(group)
    me = meeting.rank
    ranks: list[_Rank] = meeting.gather(_Rank(machine(), os.getpid(), secrets.token_hex(8)), "meet")
    local = [rank for rank, told in enumerate(ranks) if told.machine == ranks[me].machine]
    meeting.deaths = _Deaths({meeting.ranks[rank]: ranks[rank].pid for rank in local if rank != me})
    first = local[0]
    path = SHARED_MEMORY / f"torchdata-gcs-{ranks[first].pid}-{ranks[first].token}"
    try:
        with call_deadline(client.retry):
            started = _attempt(lambda: _start(client, urls, path)) if me == first else None
            layout: _Layout = meeting.gather(started, "learn the files' versions")[first]
            segment = _map(path, layout.size)
            parts = _parts(layout, client.transfer.part_size)
            known = {(index, 0, have): crc for index, (crc, have) in enumerate(layout.first)}
            for _ in range(client.retry.max_attempts):
                mine = [part for part in parts if part not in known][local.index(me) :: len(local)]
                read = _attempt(functools.partial(_read, client, urls, layout, segment, mine))
                told = meeting.gather(read, "read their shares of the files")
                known.update(crc for rank in local for crc in told[rank].items())
                damaged = [index for index in range(len(urls)) if not _matches(layout, parts, known, index)]
                verdicts = meeting.gather(damaged, "compare checksums")
                if not any(verdicts):
                    break
                client.stats.retries += 1
                known = {part: crc for part, crc in known.items() if part[0] not in damaged}
            else:
                url = urls[next(filter(None, verdicts))[0]]
                raise IntegrityError(f"{url}: the bytes read kept differing from GCS's crc32c", url=url)
    finally:
        meeting.deaths.done.set()
        path.unlink(missing_ok=True)
    whole = torch.frombuffer(segment, dtype=torch.uint8)
    return [whole[start : start + info.size] for start, info in zip(layout.starts, layout.infos, strict=True)]


class _Meeting:
    """The ranks of one process group exchanging objects; a collective that fails names the rank that
    stopped first, where it was a process of this machine."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.ranks: list[int] = dist.get_process_group_ranks(group)
        self.timeout = timeout_of(group)
        self.deaths = _Deaths({})  # the other ranks of this machine, once known

    def gather(self, value: Any, what: str) -> list[Any]:
        """Every rank's ``value``, by rank in the group; a value that is an error is raised, naming its rank."""
        told: list[Any] = [None] * len(self.ranks)
        try:
            dist.all_gather_object(told, value, group=self.group)
        except RuntimeError as exc:  # torch's DistBackendError and DistStoreError are RuntimeErrors
            stopped = self.deaths.seen()
            who = f"rank {stopped[0]} of this machine stopped" if stopped else "a rank stopped"
            after = f" (then {', '.join(map(str, stopped[1:]))})" if stopped[1:] else ""
            limit = "" if self.timeout is None else f" within the group's timeout ({self.timeout.total_seconds():g} s)"
            raise RankFailedError(
                f"rank {self.ranks[self.rank]} could not {what} with the other ranks of its process group{limit}:"
                f" {who}{after} ({str(exc)[:300]})",
                rank=stopped[0] if stopped else None,
            ) from None
        for rank, value in enumerate(told):
            if isinstance(value, BaseException):
                if rank != self.rank and isinstance(value, GCSError):
                    value.args = (f"{value} (on rank {self.ranks[rank]}, which read it for its machine)",)
                raise value
        return told


def _attempt(work: Callable[[], T]) -> T | BaseException:
    """``work()``'s result, or the error it raised, in a form that can travel to the other ranks."""
    try:
        return work()
    except Exception as exc:  # noqa: BLE001 - sent to every rank, which raises it
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - any failure to pickle means it cannot travel
            return GCSError(f"{type(exc).__name__}: {exc}")
        return exc


class _Deaths:
    """The processes of ``ranks`` (global rank: process id) that end during a load, in the order they were
    seen to end (watched from a thread until ``done`` is set): the first is the one that made the others fail."""

    POLL = 0.05

    def __init__(self, ranks: dict[int, int]) -> None:
        self.ranks = ranks
        self.ended: list[int] = []
        self.done = threading.Event()
        self.watch = threading.Thread(target=self._watch, name="torchdata-gcs-rank-watch", daemon=True)
        if ranks:
            self.watch.start()

    def _watch(self) -> None:
        while not self.done.wait(self.POLL):
            self._look()

    def _look(self) -> None:
        self.ended.extend(rank for rank, pid in self.ranks.items() if rank not in self.ended and not alive(pid))

    def seen(self) -> list[int]:
        """The ranks seen ended, first seen first (after one last look)."""
        self.done.set()
        if self.watch.is_alive():
            self.watch.join()
        self._look()
        return self.ended


def _start(client: Client, urls: list[str], path: Path) -> _Layout:
    """Each file's first bytes, read at once, put into a new segment at ``path`` sized for all the files."""
    firsts = [bytearray(_FIRST_READ) for _ in urls]

    async def read_starts() -> list[tuple[ObjectInfo, int]]:
        context = client.context()
        return await asyncio.gather(
            *(_read_start(context, url, memoryview(buf)) for url, buf in zip(urls, firsts, strict=True))
        )

    answers = run(read_starts())
    starts, size = [], 0
    for info, _ in answers:
        starts.append(size)
        size += -(-info.size // _ALIGN) * _ALIGN
    size = max(size, _ALIGN)  # an empty file still gets a page: nothing maps zero bytes
    segment = _map(path, size, create=True)
    first = []
    for start, (info, crc), buf in zip(starts, answers, firsts, strict=True):
        have = min(info.size, len(buf))
        segment[start : start + have] = buf[:have]
        first.append((crc, have))
    return _Layout([info for info, _ in answers], starts, first, size)


async def _read_start(context: RequestContext, url: str, buffer: memoryview) -> tuple[ObjectInfo, int]:
    try:
        return await read_version_start(context, url, buffer)
    except GCSError as exc:
        if exc.status != 416:  # no byte 0: GCS's answer for an empty object
            raise
        return ObjectInfo(0, 0), 0


def _map(path: Path, size: int, *, create: bool = False) -> mmap.mmap:
    """The segment at ``path`` mapped for reading and writing; made (its pages reserved, so a full
    ``/dev/shm`` is an error here rather than a crash later) when ``create``."""
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create and size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                free = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize
                raise OSError(
                    exc.errno,
                    f"{path.parent} cannot hold the {size}-byte files loaded once per machine ({free} bytes free):"
                    " give it more room (docker: --shm-size) or load without process_group",
                ) from None
        return mmap.mmap(fd, max(size, 1))
    finally:
        os.close(fd)


Part = tuple[int, int, int]
"""One range a rank reads: the file's index, the offset in the file, the length."""


def _parts(layout: _Layout, part_size: int) -> list[Part]:
    """The ranges of every file: its first bytes, then ``part_size`` pieces, file by file."""
    parts = []
    for index, (info, (_, have)) in enumerate(zip(layout.infos, layout.first, strict=True)):
        parts.append((index, 0, have))
        parts.extend(
            (index, offset, min(part_size, info.size - offset)) for offset in range(have, info.size, part_size)
        )
    return parts


def _read(client: Client, urls: list[str], layout: _Layout, segment: mmap.mmap, parts: list[Part]) -> dict[Part, int]:
    """Read ``parts`` into their places in the segment, at once; the crc32c of each."""
    view = memoryview(segment)

    async def one(context: RequestContext, part: Part) -> int:
        index, offset, length = part
        start = layout.starts[index] + offset
        target = view[start : start + length]
        return await read_ranges_into(context, urls[index], layout.infos[index].generation, offset, target, length)

    async def all_parts() -> list[int]:
        context = client.context()
        return await asyncio.gather(*(one(context, part) for part in parts))

    try:
        return dict(zip(parts, run(all_parts()), strict=True))
    finally:
        view.release()


def _matches(layout: _Layout, parts: list[Part], crcs: dict[Part, int], index: int) -> bool:
    """Whether the bytes read of file ``index`` match the crc32c GCS reported for it (if it reported one)."""
    expected = layout.infos[index].crc32c
    pieces = [(crcs[part], part[2]) for part in parts if part[0] == index]
    return expected is None or crc32c_base64(crc32c_of_concatenation(pieces)) == expected
