"""An epoch of tar shards as positions of one sample sequence, dealt to ranks and workers, interleaved and
shuffled: the same plan on any world size, so a position consumed names the same sample everywhere.

The epoch's sequence is every sample of every shard, the shards in the epoch's order (the seed and epoch
alone decide it), each shard's samples as its index lists them. What a run left unread is dealt in
contiguous blocks, rank ``r`` of ``W`` the ``r``-th of ``W`` equal blocks (padded, as ``DistributedSampler``
pads, by repeating the sequence's start), each rank's block cut into balanced contiguous pieces for its
workers. A worker reads its piece as runs of consecutive samples of one shard, ``shards_open`` runs at a
time, one sample from each in turn, through a shuffle buffer. Every step is a function of the plan and a
seeded generator, so the samples a worker yields first can be told without reading them.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

__all__ = [
    "Piece",
    "Run",
    "ShuffleBuffer",
    "Shuffled",
    "deal",
    "generator_for",
    "positions_in",
    "ranges_of",
    "read_order",
    "remaining",
    "runs_of",
    "simulate",
]

T = TypeVar("T")
Piece = tuple[int, int]
"""Sample positions ``[start, end)`` of the epoch's sequence."""


@dataclasses.dataclass(frozen=True)
class Run:
    """Consecutive samples ``[first, end)`` of one shard (its index in the listing), read with one request."""

    shard: int
    first: int
    end: int


def remaining(total: int, consumed: Sequence[Piece]) -> list[Piece]:
    """The positions of a sequence of ``total`` not in the sorted, disjoint ``consumed`` pieces."""
    left, position = [], 0
    for start, end in consumed:
        if start > position:
            left.append((position, start))
        position = max(position, end)
    if position < total:
        left.append((position, total))
    return left


def deal(pieces: Sequence[Piece], world: int, rank: int, workers: int, worker: int) -> list[Piece]:
    """The positions of ``pieces`` (in order) that ``worker`` of ``rank`` reads: the ``rank``-th of ``world``
    equal contiguous blocks (the pieces repeated from their start to fill the last), then the ``worker``-th of
    ``workers`` balanced contiguous parts of it."""
    count = sum(end - start for start, end in pieces)
    if not count:
        return []
    share = -(-count // world)
    per_worker, extra = divmod(share, workers)
    begin = rank * share + worker * per_worker + min(worker, extra)
    return _slice(pieces, count, begin, begin + per_worker + (worker < extra))


def _slice(pieces: Sequence[Piece], count: int, begin: int, end: int) -> list[Piece]:
    """Positions ``[begin, end)`` of the pieces laid end to end, repeated as often as needed."""
    out: list[Piece] = []
    offsets = list(itertools.accumulate(e - s for s, e in pieces))
    while begin < end:
        lap, at = divmod(begin, count)
        index = bisect.bisect_right(offsets, at)
        start, stop = pieces[index]
        skip = at - (offsets[index] - (stop - start))
        take = min(stop - start - skip, end - begin, count - at)
        out.append((start + skip, start + skip + take))
        begin += take
    return out


def runs_of(pieces: Sequence[Piece], counts: Sequence[int], order: Sequence[int]) -> list[Run]:
    """The runs that read ``pieces`` of an epoch whose shards come in ``order``, each holding ``counts[shard]``
    samples."""
    ends = list(itertools.accumulate(counts[shard] for shard in order))
    runs = []
    for start, end in pieces:
        while start < end:
            index = bisect.bisect_right(ends, start)
            begin = ends[index - 1] if index else 0
            stop = min(end, ends[index])
            runs.append(Run(order[index], start - begin, stop - begin))
            start = stop
    return runs


def read_order(runs: Sequence[Run], shards_open: int) -> Iterator[tuple[int, int, int]]:
    """``(shard, sample, run)`` in the order a worker reads them: ``shards_open`` of its runs open, one sample
    of each in turn (``run`` is the run's index in ``runs``)."""
    waiting, open_runs = deque(range(len(runs))), deque[Iterator[tuple[int, int, int]]]()
    while waiting or open_runs:
        while waiting and len(open_runs) < shards_open:
            open_runs.append(_samples(runs, waiting.popleft()))
        current = open_runs.popleft()
        item = next(current, None)
        if item is not None:
            yield item
            open_runs.append(current)


def _samples(runs: Sequence[Run], index: int) -> Iterator[tuple[int, int, int]]:
    run = runs[index]
    return ((run.shard, sample, index) for sample in range(run.first, run.end))


class ShuffleBuffer(Generic[T]):
    """Items in, items out in a random order: each item pushed once ``size`` are held replaces one of them,
    chosen by ``generator``, which is pushed out; at the end, what is held comes out shuffled."""

    def __init__(self, size: int, generator: random.Random) -> None:
        self.size, self.generator = size, generator
        self.held: list[T] = []

    def push(self, item: T) -> T | None:
        if len(self.held) < self.size:
            self.held.append(item)
            return None
        index = self.generator.randrange(self.size)
        out, self.held[index] = self.held[index], item
        return out

    def drain(self) -> list[T]:
        held, self.held = self.held, []
        self.generator.shuffle(held)
        return held


@dataclasses.dataclass
class Shuffled:
    """Where a worker stands after yielding ``yielded`` items: how many of its read order went in, what the
    buffer holds (in draining order once ``draining``), and the generator's state."""

    yielded: int
    pushed: int
    held: list[Any]
    draining: bool
    generator: Any
    out: list[Any]  # what was yielded, where asked for


def generator_for(seed: int, epoch: int, rank: int, worker: int) -> random.Random:
    """The shuffle buffer's generator of one worker of one rank in one epoch."""
    return random.Random(f"shards:{seed}:{epoch}:{rank}:{worker}")


def simulate(order: Iterable[T], size: int, generator: random.Random, yielded: int, keep: bool = False) -> Shuffled:
    """The state of a shuffle buffer of ``size`` fed ``order`` once it has yielded ``yielded`` items (and,
    with ``keep``, those items)."""
    buffer: ShuffleBuffer[T] = ShuffleBuffer(max(size, 1), generator)
    out: list[T] = []
    count = pushed = 0
    for item in order:
        if count == yielded:
            return Shuffled(count, pushed, list(buffer.held), False, generator.getstate(), out)
        pushed += 1
        pushed_out = buffer.push(item)
        if pushed_out is not None:
            count += 1
            if keep:
                out.append(pushed_out)
    if count == yielded:
        return Shuffled(count, pushed, list(buffer.held), False, generator.getstate(), out)
    held = buffer.drain()
    if keep:
        out.extend(held[: yielded - count])
    return Shuffled(yielded, pushed, held[yielded - count :], True, generator.getstate(), out)


def ranges_of(positions: Iterable[int]) -> list[Piece]:
    """Sorted positions as the fewest ``[start, end)`` pieces."""
    pieces: list[Piece] = []
    for position in sorted(set(positions)):
        if pieces and pieces[-1][1] == position:
            pieces[-1] = (pieces[-1][0], position + 1)
        else:
            pieces.append((position, position + 1))
    return pieces


def positions_in(order: Sequence[int], counts: Sequence[int]) -> dict[int, int]:
    """Where each shard's first sample stands in an epoch whose shards come in ``order``."""
    return dict(zip(order, itertools.accumulate((counts[shard] for shard in order), initial=0), strict=False))
