"""Byte ranges that several ranks of one machine read (a checkpoint's replicated items), fetched once there.

The plan names, for each range wanted by several ranks of a machine, the one that fetches it (in turn, so
each fetches its share); that rank publishes it in ``/dev/shm`` under a name with a count of the ranks
still to take it, and the last to take it removes it. A rank whose fetcher cannot publish (an error, a
full ``/dev/shm``, a process that ended, no answer within the retry deadline) reads the range itself:
sharing saves requests and never fails a load. Names hold the fetcher's process id, so a later load
removes what a process that ended left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import struct
import time
from collections.abc import Awaitable, Callable

from .._ops.checksums import crc32c_extend
from .process_groups import SHARED_MEMORY, alive, machine

__all__ = ["Place", "Shared", "Sharing", "place", "plan_sharing", "publish_after", "sweep", "take_or_read"]

PREFIX = "torchdata-gcs-span-"
_COUNT = struct.Struct("<q")
"""The number of ranks still to take a published range, before its bytes."""
_NOT_PUBLISHED = ".alone"
"""The suffix of the mark a fetcher leaves when it could not publish a range: its takers read it themselves."""

Key = tuple[str, int, int]
"""A range: the file's URL, its start and end."""


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a rank runs: its machine and process (what each rank tells the planner)."""

    machine: tuple[str, str, int]
    pid: int


@dataclasses.dataclass(frozen=True)
class Shared:
    """One range several ranks of a machine read: the name it is published under, the rank that fetches it
    (and that rank's process), and how many other ranks take it."""

    name: str
    fetcher: int
    pid: int
    takers: int

    @property
    def path(self) -> os.PathLike[str]:
        return SHARED_MEMORY / self.name


@dataclasses.dataclass(frozen=True)
class Sharing:
    """The shared ranges of one rank's plan, by key; the rank fetches those whose fetcher it is."""

    rank: int
    ranges: dict[Key, Shared]


def place() -> Place | None:
    """Where this rank runs, or ``None`` where there is no ``/dev/shm`` to share ranges through."""
    return Place(machine(), os.getpid()) if SHARED_MEMORY.is_dir() else None


def plan_sharing(places: list[Place | None], wanted: list[list[Key]], token: str) -> list[Sharing]:
    """Each rank's sharing (by its index in ``places``): a range that several ranks of one machine want is
    fetched by one of them, the ranks taking turns range by range. A rank whose place is unknown shares nothing."""
    by_machine: dict[tuple[str, str, int], dict[Key, list[int]]] = {}
    for rank, (place, keys) in enumerate(zip(places, wanted, strict=True)):
        if place is not None:
            for key in dict.fromkeys(keys):
                by_machine.setdefault(place.machine, {}).setdefault(key, []).append(rank)
    sharings = [Sharing(rank, {}) for rank in range(len(places))]
    shared_ranges = [(key, ranks) for found in by_machine.values() for key, ranks in found.items() if len(ranks) > 1]
    for number, (key, ranks) in enumerate(shared_ranges):
        fetcher = ranks[number % len(ranks)]
        pid = places[fetcher].pid  # type: ignore[union-attr]  # every rank listed has a place
        shared = Shared(f"{PREFIX}{pid}-{token}-{number}", fetcher, pid, len(ranks) - 1)
        for rank in ranks:
            sharings[rank].ranges[key] = shared
    return sharings


async def publish_after(read: Awaitable[int], shared: Shared, data: bytearray) -> int:
    """``read``'s crc32c once it filled ``data``, which is then published for the other ranks; if it cannot
    be, they are told to read it themselves."""
    try:
        crc = await read
        await asyncio.to_thread(_publish, shared, data)
        return crc
    except BaseException:
        with contextlib.suppress(OSError):
            _publish_mark(shared)
        raise


def _publish(shared: Shared, data: bytearray) -> None:
    temporary = f"{shared.path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as file:
            file.write(_COUNT.pack(shared.takers))
            file.write(data)
        os.rename(temporary, shared.path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        _publish_mark(shared)


def _publish_mark(shared: Shared) -> None:
    os.close(os.open(f"{shared.path}{_NOT_PUBLISHED}", os.O_WRONLY | os.O_CREAT, 0o600))


async def take_or_read(shared: Shared, into: memoryview, read: Callable[[], Awaitable[int]], patience: float) -> int:
    """Fill ``into`` with the range ``shared`` names, taken from where its fetcher published it, or by
    ``read`` if the fetcher cannot publish it (or has not within ``patience`` seconds); its crc32c."""
    end, pause = time.monotonic() + patience, 0.002
    while True:
        try:
            fd = os.open(shared.path, os.O_RDWR)
            break
        except FileNotFoundError:
            pass
        if os.path.exists(f"{shared.path}{_NOT_PUBLISHED}") or not alive(shared.pid) or time.monotonic() > end:
            _take_mark(shared)
            return await read()
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)
    return await asyncio.to_thread(_take, shared, fd, into)


def _take(shared: Shared, fd: int, into: memoryview) -> int:
    try:
        if os.preadv(fd, [into], _COUNT.size) != len(into):
            raise OSError(f"{shared.path}: shorter than the range it holds")
        _count_taken(fd, shared.path)
    finally:
        os.close(fd)
    return crc32c_extend(0, into)


def _take_mark(shared: Shared) -> None:
    """Count a range read alone as taken: the last taker removes the mark (nothing was published)."""
    mark = f"{shared.path}{_NOT_PUBLISHED}"
    try:
        fd = os.open(mark, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken = len(os.pread(fd, 4096, 0)) + 1
        os.pwrite(fd, b"x", taken - 1)
        if taken >= shared.takers:
            os.unlink(mark)
    finally:
        os.close(fd)


def _count_taken(fd: int, path: os.PathLike[str]) -> None:
    """One taker fewer; the last one removes the published range."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    (left,) = _COUNT.unpack(os.pread(fd, _COUNT.size, 0))
    os.pwrite(fd, _COUNT.pack(left - 1), 0)
    if left <= 1:
        os.unlink(path)


def sweep() -> None:
    """Remove the ranges (and marks) that processes which have ended left in ``/dev/shm``."""
    for path in SHARED_MEMORY.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX).partition("-")[0]
        if pid.isdigit() and not alive(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()
