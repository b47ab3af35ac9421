"""Node locality's dealing, as properties over any listing, nodes, ranks, workers and resumed start: every rank
reads as many items as ``DistributedSampler`` would give it, every item left is read once (at least once
when padded, at most once when cut), each node reads its own items first (only its own in a fresh epoch), and
what is consumed after any steps is what every rank's workers delivered. Where the nodes come from is tested
through the environment torchrun sets."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchdata_gcs._engines.epoch_order import (
    Consumed,
    Split,
    epoch_order,
    epoch_share,
    node_count,
    node_partition,
    order_nodes,
    rank_slice,
)

counts, seeds = st.integers(0, 120), st.integers(0, 5)


@given(
    count=counts,
    nodes=st.integers(1, 4),
    per_node=st.integers(1, 3),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=seeds,
    epoch=seeds,
    consumed=st.sets(st.integers(0, 119)),
)
def test_every_rank_reads_as_many_and_every_item_left_once_its_own_nodes_first(
    count: int, nodes: int, per_node: int, drop_last: bool, shuffle: bool, seed: int, epoch: int, consumed: set[int]
) -> None:
    world = nodes * per_node
    start = Consumed.of(position for position in consumed if position < count)
    order = epoch_order(count, seed, epoch, shuffle)
    left = [order[position] for position in start.remaining(count)]
    shares = [
        epoch_share(count, seed, epoch, shuffle, start, Split(rank, world, drop_last=drop_last, nodes=nodes))
        for rank in range(world)
    ]
    size = len(rank_slice(len(left), 0, world, drop_last))
    assert [len(share) for share in shares] == [size] * world
    read = Counter(item for share in shares for item in share)
    assert set(read) == set(left) if not drop_last else set(read) <= set(left)
    assert max(read.values(), default=1) == 1 or (not drop_last and world * size > len(left))
    partition = node_partition(count, seed, nodes, shuffle)
    own = Counter(partition[item] for item in left)
    for node in range(nodes):
        items = {item for share in shares[node * per_node : (node + 1) * per_node] for item in share}
        assert len({item for item in items if partition[item] == node}) == min(own[node], per_node * size)
        if start == Consumed() and count >= nodes:
            assert all(partition[item] == node for item in items), "a fresh epoch: its own items only"


@given(
    count=counts,
    nodes=st.integers(1, 3),
    per_node=st.integers(1, 3),
    workers=st.integers(1, 3),
    block=st.integers(1, 3),
    drop_last=st.booleans(),
    seed=seeds,
    consumed=st.sets(st.integers(0, 119)),
    data=st.data(),
)
def test_what_is_consumed_after_steps_is_what_every_ranks_workers_delivered(
    count: int,
    nodes: int,
    per_node: int,
    workers: int,
    block: int,
    drop_last: bool,
    seed: int,
    consumed: set[int],
    data: st.DataObject,
) -> None:
    start = Consumed.of(position for position in consumed if position < count)
    split = Split(world=nodes * per_node, workers=workers, block=block, drop_last=drop_last, nodes=nodes)
    homes = order_nodes(epoch_order(count, seed, 1, True), seed, nodes, True)
    done = [
        data.draw(st.integers(0, start.share_size(count, dataclasses.replace(split, worker=worker))))
        for worker in range(workers)
    ]
    delivered = [
        position
        for rank in range(split.world)
        for worker in range(workers)
        for position in start.share(count, dataclasses.replace(split, rank=rank, worker=worker), homes)[: done[worker]]
    ]
    assert start.after(count, split, done, homes) == Consumed.of([*range(start.prefix), *start.beyond, *delivered])


def test_the_partition_is_even_the_same_every_epoch_and_halves_for_twice_the_nodes() -> None:
    two, four = node_partition(1000, 7, 2, True), node_partition(1000, 7, 4, True)
    assert sorted(Counter(two).values()) == [500, 500] and sorted(Counter(four).values()) == [250] * 4
    assert all(node // 2 == half for node, half in zip(four, two, strict=True))
    assert node_partition(1000, 8, 2, True) != two
    assert epoch_order(1000, 7, 0, True) != epoch_order(1000, 7, 1, True), "the epochs' orders differ, not the parts"


@pytest.mark.parametrize(
    ("environment", "rank", "world", "nodes"),
    [
        ({}, 5, 8, 1),
        ({"LOCAL_WORLD_SIZE": "8"}, 5, 8, 1),
        ({"LOCAL_WORLD_SIZE": "2"}, 5, 8, 4),
        ({"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2"}, 5, 8, 4),
    ],
)
def test_the_nodes_are_torchruns(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], rank: int, world: int, nodes: int
) -> None:
    for name in ("LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert node_count("node", rank, world) == nodes
    assert node_count(None, rank, world) == 1
