"""One order per epoch, dealt to ranks and workers, and what was consumed of it, the same on any world size.

An epoch's order depends on the seed and the epoch alone. What is left of it (all of it, unless a run is
resumed) is dealt as ``DistributedSampler`` deals: rank ``r`` of ``W`` takes every ``W``-th item, the rest
padded from its start (or cut) to a multiple of ``W``; with node locality, each node first takes the items
of its part of a partition fixed by the seed and the number of nodes, then deals them to its ranks so. A
rank's workers take its share in turns of one batch each, as the DataLoader asks them. A run that stops is
described by the positions of the order consumed so far, which do not depend on how many nodes, ranks or
workers consumed them: a run on another world size deals what remains. A process's rank and the world size
come from the default process group, else torchrun's ``RANK`` and ``WORLD_SIZE``; its node from torchrun's
``LOCAL_WORLD_SIZE`` (and ``GROUP_RANK``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch.distributed as dist

from .._ops.urls import brief
from ..errors import ResumeError

__all__ = [
    "Consumed",
    "Split",
    "check_locality",
    "epoch_order",
    "epoch_share",
    "node_count",
    "node_partition",
    "node_slices",
    "order_nodes",
    "rank_and_world_size",
    "rank_slice",
    "worker_slice",
]


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


def check_locality(locality: object) -> None:
    """``ValueError`` unless ``locality`` is one the epochs can be dealt with: ``None`` (one order dealt to
    every rank) or ``"node"`` (each node keeps its objects from epoch to epoch)."""
    if locality is not None and not (isinstance(locality, str) and locality == "node"):
        raise ValueError(f"locality must be None or 'node', got {brief(locality)}")


def node_count(locality: str | None, rank: int, world: int) -> int:
    """How many nodes the epochs of rank ``rank`` of ``world`` are dealt to: one without ``locality``; with
    ``"node"``, ``world`` over torchrun's ``LOCAL_WORLD_SIZE`` (the ranks of each node), rank ``r`` on node
    ``r // LOCAL_WORLD_SIZE`` as torchrun numbers them (``GROUP_RANK``, if set, must say so), and one node
    without ``LOCAL_WORLD_SIZE``. ``ValueError`` if these do not describe nodes of as many ranks each."""
    if locality is None:
        return 1
    local_text, group_text = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("GROUP_RANK")
    if local_text is None:
        if group_text is not None:
            raise ValueError(
                f"GROUP_RANK is set ({group_text!r}) but LOCAL_WORLD_SIZE is not: node locality needs the number of"
                " ranks on each node, as torchrun sets it"
            )
        return 1
    try:
        local = int(local_text)
        group = None if group_text is None else int(group_text)
    except ValueError:
        raise ValueError(
            f"LOCAL_WORLD_SIZE and GROUP_RANK must be integers, got {local_text!r}, {group_text!r}"
        ) from None
    if local < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE must be >= 1, got {local}")
    if world % local:
        raise ValueError(
            f"node locality needs as many ranks on every node: WORLD_SIZE {world} is not a multiple of"
            f" LOCAL_WORLD_SIZE {local}"
        )
    if group is not None and group != rank // local:
        raise ValueError(
            f"GROUP_RANK {group} is not the node of rank {rank} with {local} ranks per node ({rank // local}):"
            " node locality needs node n to run ranks n*LOCAL_WORLD_SIZE to (n+1)*LOCAL_WORLD_SIZE-1, as torchrun"
            " numbers them"
        )
    return world // local


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


def node_partition(count: int, seed: int, nodes: int, shuffle: bool) -> list[int]:
    """The node of each of ``count`` items under node locality over ``nodes`` nodes: ``nodes`` runs, as even as
    can be, of an order shuffled with ``seed`` alone (or of the listing, without ``shuffle``), the same every
    epoch. The runs for ``2 * nodes`` nodes halve those for ``nodes``: doubling the nodes splits each node's
    objects between two, halving them joins two nodes' objects on one.

    >>> node_partition(5, seed=1, nodes=2, shuffle=False)
    [0, 0, 0, 1, 1]
    """
    base = list(range(count))
    if shuffle:
        random.Random(f"{seed}:nodes").shuffle(base)  # not an epoch's seed, which is "{seed}:{epoch}"
    homes = [0] * count
    for place, item in enumerate(base):
        homes[item] = place * nodes // count
    return homes


def order_nodes(order: Sequence[int], seed: int, nodes: int, shuffle: bool) -> list[int]:
    """The node of each position of ``order`` (an epoch's, of every item) under node locality over ``nodes`` nodes."""
    partition = node_partition(len(order), seed, nodes, shuffle)
    return [partition[item] for item in order]


def node_slices(homes: Sequence[int], nodes: int, each: int) -> list[list[int]]:
    """The positions in a list of items, of the nodes ``homes``, that each of ``nodes`` nodes reads, ``each``
    apiece, in the list's order: its own items; a node with more leaves its last ones to the nodes with fewer
    (the first short node takes the first left), one still short repeats its items from their start (the
    list's, if it has none), as ``DistributedSampler`` pads, and what no node takes is cut.

    >>> node_slices([0, 1, 0, 0, 1], nodes=2, each=2), node_slices([0, 0, 0, 1], nodes=2, each=2)
    ([[0, 2], [1, 4]], [[0, 1], [2, 3]])
    >>> node_slices([0, 1, 0], nodes=2, each=2), node_slices([0, 0], nodes=2, each=1)
    ([[0, 2], [1, 1]], [[0], [1]])
    """
    own: list[list[int]] = [[] for _ in range(nodes)]
    for position, node in enumerate(homes):
        own[node].append(position)
    spare = iter(sorted(position for mine in own for position in mine[each:]))
    slices = []
    for mine in own:
        kept = mine[:each]
        if len(kept) < each:
            kept = sorted(kept + list(itertools.islice(spare, each - len(kept))))
        padding = kept or range(len(homes))
        slices.append([padding[j % len(padding)] for j in range(each)])
    return slices


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
    each taking ``block`` items a turn; ``drop_last`` cuts instead of padding; ``nodes`` nodes of as many
    ranks each (rank ``r`` on node ``r // (world // nodes)``), each keeping its objects (node locality; one
    node deals as without it)."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1
    block: int = 1
    drop_last: bool = False
    nodes: int = 1


def _dealer(left: Sequence[int], split: Split, homes: Sequence[int]) -> Callable[[int], list[int]]:
    """Each rank's indices into ``left`` (positions of an order whose nodes are ``homes``), as a function of the
    rank: ``rank_slice``'s, or under node locality every ``L``-th of its node's ``node_slices`` (``L`` ranks a node)."""
    if split.nodes == 1:
        return lambda rank: rank_slice(len(left), rank, split.world, split.drop_last)
    local = split.world // split.nodes
    each = local * len(rank_slice(len(left), 0, split.world, split.drop_last))
    slices = node_slices([homes[position] for position in left], split.nodes, each)
    return lambda rank: slices[rank // local][rank % local :: local]


@dataclasses.dataclass(frozen=True)
class Consumed:
    """Positions of an epoch's order already consumed: all below ``prefix``, and those in ``beyond``
    (above it, sorted). Nothing consumed is ``Consumed()``. The order is the epoch's one order with or
    without node locality, so positions name the same objects on any number of nodes, ranks and workers."""

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

    def share(self, count: int, split: Split, homes: Sequence[int] = ()) -> list[int]:
        """The positions of an order of ``count`` items that ``split``'s rank and worker read, in order;
        ``homes`` is the node of each position (:func:`order_nodes`), needed with more than one node."""
        left = self.remaining(count)
        mine = [left[j] for j in _dealer(left, split, homes)(split.rank)]
        return [mine[j] for j in worker_slice(len(mine), split.worker, split.workers, split.block)]

    def share_size(self, count: int, split: Split) -> int:
        """How many positions :meth:`share` gives ``split``'s rank and worker (the same with or without nodes)."""
        size = len(rank_slice(len(self.remaining(count)), 0, split.world, split.drop_last))
        return len(worker_slice(size, split.worker, split.workers, split.block))

    def after(self, count: int, split: Split, done: Sequence[int], homes: Sequence[int] = ()) -> Consumed:
        """What is consumed once each worker of every rank has delivered ``done[worker]`` items of its
        share (as every rank has, stepping in lockstep as DDP does); ``split``'s rank and worker are not
        used: every rank's share is counted. ``homes`` as for :meth:`share`."""
        left = self.remaining(count)
        size = len(rank_slice(len(left), 0, split.world, split.drop_last))  # every rank's share is this long
        local = [j for w, n in enumerate(done) for j in list(worker_slice(size, w, split.workers, split.block))[:n]]
        consumed = [*range(self.prefix), *self.beyond]
        deal = _dealer(left, split, homes)
        for rank in range(split.world):
            dealt = deal(rank)
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
    what ``start`` says was consumed left out: what every front end that deals epochs deals.

    With node locality the order is still the epoch's one order, so its positions name the same objects on any
    number of nodes: a node reads the items of its part of :func:`node_partition` in that order, a uniform
    shuffle of them for each epoch.

    >>> [epoch_share(8, seed=0, epoch=0, shuffle=False, start=Consumed(), split=Split(r, 4, nodes=2)) for r in range(4)]
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    """
    order = epoch_order(count, seed, epoch, shuffle)
    homes = order_nodes(order, seed, split.nodes, shuffle) if split.nodes > 1 else []
    return [order[position] for position in start.share(count, split, homes)]
