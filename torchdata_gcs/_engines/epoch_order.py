"""One order per epoch, dealt to ranks and workers, and what was consumed of it, the same on any world size.

An epoch's order depends on the seed and the epoch alone. What is left of it (all of it, unless a run is
resumed) is dealt as ``DistributedSampler`` deals: rank ``r`` of ``W`` takes every ``W``-th item, the
rest padded from its start (or cut) to a multiple of ``W``. A rank's workers take its share in turns of
one batch each, as the DataLoader asks them, so that after every step what all ranks have consumed is a
prefix of what was left. A run that stops is described by the positions of the order consumed so far,
which do not depend on how many ranks or workers consumed them: a run on another world size deals
what remains. A process's rank and the world size come from the default process group, else torchrun's
``RANK`` and ``WORLD_SIZE``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch.distributed as dist

from .._ops.urls import brief
from ..errors import ResumeError

__all__ = ["Consumed", "Split", "epoch_order", "epoch_share", "rank_and_world_size", "rank_slice", "worker_slice"]


def epoch_order(count: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The order in which an epoch reads ``count`` items: shuffled with ``seed`` and ``epoch`` alone, or as listed.

    >>> epoch_order(5, seed=1, epoch=0, shuffle=False)
    [0, 1, 2, 3, 4]
    >>> epoch_order(5, seed=1, epoch=0, shuffle=True) == epoch_order(5, seed=1, epoch=0, shuffle=True)
    True
    """
    order = list(range(count))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the world size: the default process group's if it is initialized, else
    torchrun's ``RANK`` and ``WORLD_SIZE`` (``(0, 1)`` without them); ``ValueError`` if they are not a rank
    of a world."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(
            f"RANK and WORLD_SIZE must be integers, got {os.environ.get('RANK')!r}, {os.environ.get('WORLD_SIZE')!r}"
        ) from None
    if not 0 <= rank < world:
        raise ValueError(f"RANK must be in 0..WORLD_SIZE-1, got RANK={rank}, WORLD_SIZE={world}")
    return rank, world


def rank_slice(count: int, rank: int, world: int, drop_last: bool) -> list[int]:
    """The positions in a list of ``count`` items that ``rank`` of ``world`` reads, as ``DistributedSampler``
    deals them: every ``world``-th, after padding the list by repeating it from its start to a multiple of
    ``world`` (or, with ``drop_last``, cutting it down to one).

    >>> [rank_slice(7, rank, 3, False) for rank in range(3)]
    [[0, 3, 6], [1, 4, 0], [2, 5, 1]]
    >>> [rank_slice(7, rank, 3, True) for rank in range(3)]
    [[0, 3], [1, 4], [2, 5]]
    """
    if drop_last:
        total = count - count % world
    else:
        total = math.ceil(count / world) * world if count else 0
    return [position % count for position in range(rank, total, world)]


def worker_slice(count: int, worker: int, workers: int, block: int) -> range | list[int]:
    """The positions in a rank's share of ``count`` items that ``worker`` of ``workers`` reads: blocks of
    ``block`` (one batch) in turn, as the DataLoader asks its workers for batches.

    >>> [list(worker_slice(7, worker, 2, 2)) for worker in range(2)]
    [[0, 1, 4, 5], [2, 3, 6]]
    """
    if workers == 1:
        return range(count)
    turn = block * workers
    return [j for start in range(worker * block, count, turn) for j in range(start, min(start + block, count))]


@dataclasses.dataclass(frozen=True)
class Split:
    """How an epoch is dealt: ``world`` ranks (this is ``rank``), ``workers`` per rank (this is ``worker``),
    each taking ``block`` items a turn; ``drop_last`` cuts instead of padding."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1
    block: int = 1
    drop_last: bool = False


@dataclasses.dataclass(frozen=True)
class Consumed:
    """Positions of an epoch's order already consumed: all below ``prefix``, and those in ``beyond``
    (above it, sorted). Nothing consumed is ``Consumed()``."""

    prefix: int = 0
    beyond: tuple[int, ...] = ()

    @classmethod
    def of(cls, positions: Iterable[int]) -> Consumed:
        """The consumed positions ``positions`` (any order, repeats allowed) in brief."""
        taken = sorted(set(positions))
        prefix = 0
        while prefix < len(taken) and taken[prefix] == prefix:
            prefix += 1
        return cls(prefix, tuple(taken[prefix:]))

    def count(self) -> int:
        """How many positions were consumed."""
        return self.prefix + len(self.beyond)

    def remaining(self, count: int) -> list[int]:
        """The positions of an order of ``count`` items not yet consumed, in order."""
        skip = set(self.beyond)
        return [position for position in range(self.prefix, count) if position not in skip]

    def share(self, count: int, split: Split) -> list[int]:
        """The positions of an order of ``count`` items that ``split``'s rank and worker read, in order."""
        left = self.remaining(count)
        mine = [left[j] for j in rank_slice(len(left), split.rank, split.world, split.drop_last)]
        return [mine[j] for j in worker_slice(len(mine), split.worker, split.workers, split.block)]

    def after(self, count: int, split: Split, done: Sequence[int]) -> Consumed:
        """What is consumed once each worker of every rank has delivered ``done[worker]`` items of its
        share (as every rank has, stepping in lockstep as DDP does); ``split``'s rank and worker are not
        used: every rank's share is counted."""
        left = self.remaining(count)
        size = len(rank_slice(len(left), 0, split.world, split.drop_last))  # every rank's share is this long
        local = [j for w, n in enumerate(done) for j in list(worker_slice(size, w, split.workers, split.block))[:n]]
        consumed = [*range(self.prefix), *self.beyond]
        for rank in range(split.world):
            dealt = rank_slice(len(left), rank, split.world, split.drop_last)
            consumed += (left[dealt[j]] for j in local)
        return Consumed.of(consumed)

    def to_state(self) -> list[Any]:
        """As saved in a state dict: ``[prefix, [beyond...]]``."""
        return [self.prefix, list(self.beyond)]

    @classmethod
    def from_state(cls, value: object, count: int) -> Consumed:
        """A saved ``[prefix, [beyond...]]`` over an order of ``count`` items; ``ResumeError`` if malformed."""
        if isinstance(value, (Mapping, str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
            raise ResumeError(f"not a resumable state: 'consumed' must be [prefix, [positions]], got {brief(value)}")
        prefix, beyond = value
        if not _natural(prefix) or prefix > count:
            raise ResumeError(
                f"not a resumable state: the consumed prefix must be an integer in 0..{count}, got {brief(prefix)}"
            )
        if not isinstance(beyond, Sequence) or isinstance(beyond, str) or not all(_natural(p) for p in beyond):
            raise ResumeError(f"not a resumable state: consumed positions must be integers, got {brief(beyond)}")
        if list(beyond) != sorted(set(beyond)) or any(not prefix < p < count for p in beyond):
            raise ResumeError(
                f"not a resumable state: consumed positions must be sorted, distinct and in {prefix + 1}..{count - 1},"
                f" got {brief(beyond)}"
            )
        return cls(prefix, tuple(beyond))


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def epoch_share(count: int, seed: int, epoch: int, shuffle: bool, start: Consumed, split: Split) -> list[int]:
    """The items (indices of ``count``) that ``split``'s rank and worker read of the epoch's one order, in order,
    what ``start`` says was consumed left out: what every front end that deals epochs deals."""
    order = epoch_order(count, seed, epoch, shuffle)
    return [order[position] for position in start.share(count, split)]
