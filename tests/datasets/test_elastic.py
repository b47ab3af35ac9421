"""GCSIterableDataset's epoch has one order whatever the world size, and resumes on any number of ranks and
workers: after every step what all ranks read is a prefix of the order; a run stopped on 2 ranks x 2
workers resumes on 3 ranks x 1 worker (and again on 1 rank x 2 workers), every object exactly once. With
node locality each node keeps its objects from epoch to epoch, and a run resumes on another number of nodes.

Ranks (and nodes) are told by torchrun's ``RANK`` and ``WORLD_SIZE`` (``LOCAL_WORLD_SIZE``, ``GROUP_RANK``),
as the dataset reads them without a process group (``test_shares.py`` runs real ranks); their loaders step
in lockstep here, as DDP's do."""

from __future__ import annotations

import functools
import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.delivery import assert_exactly_once, read
from tests.ranks import as_rank, run_ranks
from torchdata_gcs import ClientConfig, GCSIterableDataset, GCSMapDataset, ResumeError
from torchdata_gcs._engines.epoch_order import epoch_order
from torchdata_gcs.datasets import elastic_state
from torchdata_gcs.testing import Emulator

N = 60
BATCH = 2


@pytest.fixture(scope="module")
def objects(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    bucket = f"elastic-{uuid.uuid4().hex[:12]}"
    contents = {f"ds/{i:03d}.bin": f"item {i}".encode() for i in range(N)}
    gcs_emulator.seed(bucket, contents)
    return f"gs://{bucket}/ds/", {f"gs://{bucket}/{name}": data for name, data in contents.items()}


def dataset(prefix: str, client: ClientConfig, **settings: Any) -> GCSIterableDataset:
    return GCSIterableDataset(
        prefix, transform=read, client=client, **{"shuffle": True, "seed": 3, "batch_size": BATCH, **settings}
    )


Rank = tuple[StatefulDataLoader, Iterator[list[tuple[str, bytes]]]]


def loaders(
    monkeypatch: pytest.MonkeyPatch, datasets: list[GCSIterableDataset], workers: int, per_node: int | None = None
) -> list[Rank]:
    """One loader per rank (rank ``r`` reads ``datasets[r]``), each seeing its own RANK and WORLD_SIZE (and,
    on nodes of ``per_node`` ranks, its node) whenever it runs (its workers start, or it reads, at its first step)."""

    def batches(loader: StatefulDataLoader, rank: int) -> Iterator[list[tuple[str, bytes]]]:
        iterator = None
        while True:
            as_rank(monkeypatch, rank, len(datasets), per_node)
            if iterator is None:
                iterator = iter(loader)
            batch = next(iterator, None)
            if batch is None:
                return
            yield batch

    context = "fork" if workers else None
    started = []
    for rank, ds in enumerate(datasets):
        loader = StatefulDataLoader(
            ds, batch_size=BATCH, num_workers=workers, collate_fn=list, multiprocessing_context=context
        )
        started.append((loader, batches(loader, rank)))
    return started


def steps(ranks: list[Rank], count: int | None = None) -> list[list[list[tuple[str, bytes]]]]:
    """``count`` steps (or all) of every rank in lockstep: the batches of each step, rank by rank."""
    taken = []
    for _ in itertools.count() if count is None else range(count):
        batches = [next(iterator, None) for _, iterator in ranks]
        if all(batch is None for batch in batches):
            break
        assert None not in batches, "ranks ran unequal numbers of steps"
        taken.append(batches)
    return taken


def finish(ranks: list[Rank]) -> None:
    """Run a stopped job's loaders to their end, so that no worker of theirs is left when later tests fork."""
    steps(ranks)


def items(taken: list[list[list[tuple[str, bytes]]]]) -> list[tuple[str, bytes]]:
    """The items of ``steps``' batches, step by step, rank by rank."""
    return [item for batches in taken for batch in batches for item in batch]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_world_size_reads_one_order_whose_prefix_is_read_after_every_step(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    prefix, contents = objects
    urls = sorted(contents)
    order = [urls[i] for i in epoch_order(N, seed=3, epoch=1, shuffle=True)]
    for world in (1, 2, 3):
        datasets = [dataset(prefix, client) for _ in range(world)]
        for ds in datasets:
            ds.set_epoch(1)
        read_so_far: list[str] = []
        for batches in steps(loaders(monkeypatch, datasets, workers)):
            read_so_far += [url for batch in batches for url, _ in batch]
            assert sorted(read_so_far) == sorted(order[: len(read_so_far)]), f"not a prefix on {world} ranks"
        assert len(read_so_far) == N, f"{world} ranks read the whole order once"


def test_stopped_on_two_ranks_of_two_workers_resumes_on_three_ranks_then_one_reading_each_object_once(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, contents = objects
    delivered: list[tuple[str, bytes]] = []

    two = loaders(monkeypatch, [dataset(prefix, client) for _ in range(2)], workers=2)
    delivered += items(steps(two, 3))
    saved = [loader.state_dict() for loader, _ in two]
    finish(two)
    position = elastic_state(saved[0])
    assert position == elastic_state(saved[1]), "any rank's state says the same"
    assert position["consumed"] == [12, []], "3 steps of 2 ranks x 2 items: the first 12 of the order"

    three = [dataset(prefix, client) for _ in range(3)]
    for ds in three:
        ds.load_state_dict(position)
    three_loaders = loaders(monkeypatch, three, workers=1)
    delivered += items(steps(three_loaders, 4))
    again = elastic_state(three_loaders[2][0].state_dict())
    finish(three_loaders)
    assert again["consumed"] == [12 + 4 * 3 * BATCH, []]

    one = [dataset(prefix, client)]
    one[0].load_state_dict(again)
    delivered += items(steps(loaders(monkeypatch, one, workers=2)))
    assert_exactly_once(delivered, contents)


def test_batches_unlike_the_datasets_turns_still_resume_exactly(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset told batch_size 1 under a DataLoader of batches of 2: what the ranks read is not a prefix
    after an odd step, and the position says which positions past the prefix were read."""
    prefix, contents = objects
    two = loaders(monkeypatch, [dataset(prefix, client, batch_size=1) for _ in range(2)], workers=2)
    delivered = items(steps(two, 3))
    position = elastic_state(two[1][0].state_dict())
    finish(two)
    assert position["consumed"][1], "positions past the prefix were read"
    resumed = [dataset(prefix, client, batch_size=1) for _ in range(3)]
    for ds in resumed:
        ds.load_state_dict(position)
    delivered += items(steps(loaders(monkeypatch, resumed, 0)))
    assert_exactly_once(delivered, contents)


def test_a_position_is_checked_against_the_listing_and_the_order(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, _ = objects
    two = loaders(monkeypatch, [dataset(prefix, client)], workers=2)
    steps(two, 2)
    position = elastic_state(two[0][0].state_dict())
    finish(two)
    with pytest.raises(ResumeError, match="shuffle True then, False now"):
        dataset(prefix, client, shuffle=False).load_state_dict(position)
    with pytest.raises(ResumeError, match=f"a listing of {N} objects; this dataset lists {N - 1}"):
        GCSIterableDataset(
            [f"{prefix}{i:03d}.bin" for i in range(N - 1)], shuffle=True, seed=3, client=client
        ).load_state_dict(position)
    for consumed, words in [
        ([N + 1, []], f"0..{N}"),
        ([3, [2]], "sorted, distinct"),
        ([3, [5, 5]], "sorted, distinct"),
        ("12", "must be [prefix, [positions]]"),
    ]:
        ds = dataset(prefix, client)
        with pytest.raises(ResumeError, match=words.replace("[", r"\[").replace("]", r"\]")):
            ds.load_state_dict({**position, "consumed": consumed})
        assert ds.share() == dataset(prefix, client).share(), "a refused state changes nothing"


def test_a_state_saved_between_snapshots_is_refused(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, _ = objects
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    loader = StatefulDataLoader(
        dataset(prefix, client), batch_size=BATCH, num_workers=2, collate_fn=list, snapshot_every_n_steps=4
    )
    batches = iter(loader)
    next(batches), next(batches), next(batches)
    with pytest.raises(ResumeError, match="snapshot_every_n_steps"):
        elastic_state(loader.state_dict())
    list(batches)
    with pytest.raises(ResumeError, match="expected a dict"):
        elastic_state([1])  # type: ignore[arg-type]


def test_a_loaders_state_given_to_the_dataset_or_an_empty_one_is_refused_saying_what_to_do(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mistake of loading the StatefulDataLoader's own state into the dataset names what it is and the
    way out, and changes nothing; a dict that holds no state at all says what was expected."""
    prefix, _ = objects
    for workers in (0, 2):
        ranks = loaders(monkeypatch, [dataset(prefix, client)], workers=workers)
        steps(ranks, 2)
        state = ranks[0][0].state_dict()
        finish(ranks)
        ds = dataset(prefix, client)
        with pytest.raises(ResumeError, match=r"a StatefulDataLoader's state_dict\(\).*elastic_state\(state\)"):
            ds.load_state_dict(state)
        assert ds.share() == dataset(prefix, client).share(), "a refused state changes nothing"
        assert elastic_state(state)["consumed"] == [2 * BATCH, []]
    with pytest.raises(ResumeError, match=r"expected a dataset's state_dict\(\) or a position .* got a dict of \[\]"):
        elastic_state({})


@pytest.mark.parametrize("workers", [0, 2])
def test_the_state_of_a_loader_over_a_map_style_dataset_is_refused_saying_it_holds_no_dataset_state(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, workers: int
) -> None:
    prefix, _ = objects
    loader = StatefulDataLoader(GCSMapDataset(prefix, client=client), batch_size=BATCH, num_workers=workers)
    batches = iter(loader)
    next(batches)
    with pytest.raises(ResumeError, match="dataset saved no state; elastic_state reads a GCSIterableDataset's"):
        elastic_state(loader.state_dict())
    list(batches)


@pytest.mark.parametrize(
    "workers, context, persistent", [(0, None, False), (2, "fork", False), (2, "fork", True), (1, "spawn", False)]
)
def test_only_the_first_pass_after_a_resume_starts_from_the_position(
    objects: tuple[str, dict[str, bytes]],
    client: ClientConfig,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    context: str | None,
    persistent: bool,
) -> None:
    """Passes over the epoch resumed into without set_epoch between them (as with shuffle=False): the first
    reads what was left, every later one the whole epoch, whether the DataLoader's workers are forked or
    spawned anew from the process that loaded the position, or kept from pass to pass."""
    prefix, contents = objects
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    first = StatefulDataLoader(dataset(prefix, client), batch_size=BATCH, num_workers=0, collate_fn=list)
    batches = iter(first)
    consumed = [item for _ in range(5) for item in next(batches)]
    resumed = dataset(prefix, client)
    resumed.load_state_dict(elastic_state(first.state_dict()))
    loader = StatefulDataLoader(
        resumed,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=list,
        persistent_workers=persistent,
        multiprocessing_context=context,
    )
    resumed_pass, next_pass = ([item for batch in loader for item in batch] for _ in range(2))
    assert_exactly_once(consumed + resumed_pass, contents)
    assert_exactly_once(next_pass, contents)


def node_shares(monkeypatch: pytest.MonkeyPatch, ds: GCSIterableDataset, world: int, per_node: int) -> list[list[str]]:
    """The URLs each rank reads of the dataset's epoch (rank by rank), on nodes of ``per_node`` ranks."""
    shares = []
    for rank in range(world):
        as_rank(monkeypatch, rank, world, per_node)
        shares.append([url for url, _ in ds.share()])
    return shares


def test_node_locality_keeps_each_nodes_objects_from_epoch_to_epoch_every_object_read_once(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 nodes of 2 ranks, epochs 0, 1 and 2: every object read once, 15 by each rank; each node reads the
    same 30 objects every epoch, the other node's never, in another order each epoch."""
    prefix, contents = objects
    ds = dataset(prefix, client, locality="node")
    by_node: list[list[list[str]]] = [[], []]  # each node's order (its ranks' shares interleaved), epoch by epoch
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        shares = node_shares(monkeypatch, ds, world=4, per_node=2)
        assert [len(share) for share in shares] == [N // 4] * 4
        assert sorted(url for share in shares for url in share) == sorted(contents), f"epoch {epoch} reads all once"
        for node in (0, 1):
            by_node[node].append([url for pair in zip(*shares[2 * node : 2 * node + 2], strict=True) for url in pair])
    for orders in by_node:
        assert all(set(order) == set(orders[0]) for order in orders), "a node reads the same objects every epoch"
        assert orders[0] != orders[1] != orders[2] != orders[0], "in another order each epoch"
    assert not set(by_node[0][0]) & set(by_node[1][0]), "the nodes read different objects"
    as_rank(monkeypatch, 1, 4)  # no node named: one node, dealt as without locality
    ds.set_epoch(0)
    assert ds.share() == dataset(prefix, client).share()


def _epochs_on_a_process_group(prefix: str, rank: int, client: ClientConfig) -> list[list[str]]:
    for name in ("RANK", "WORLD_SIZE", "GROUP_RANK"):
        os.environ.pop(name, None)
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # as torchrun sets it; the rank and world size are the process group's
    ds = dataset(prefix, client, locality="node")
    shares = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        shares.append([url for url, _ in ds.share()])
    return shares


def test_node_locality_on_a_process_group_puts_rank_r_on_node_r_over_the_ranks_per_node(
    objects: tuple[str, dict[str, bytes]],
    client: ClientConfig,
    monkeypatch: pytest.MonkeyPatch,
    gcs_emulator: Emulator,
    tmp_path: Path,
) -> None:
    """4 ranks of a gloo process group with LOCAL_WORLD_SIZE 2 deal as the environment of 2 nodes of 2 ranks."""
    prefix, _ = objects
    work = functools.partial(_epochs_on_a_process_group, prefix)
    outcomes = run_ranks(4, tmp_path, gcs_emulator.endpoint, work)
    assert [outcome.get("error") for outcome in outcomes] == [None] * 4
    ds = dataset(prefix, client, locality="node")
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert [outcome["result"][epoch] for outcome in outcomes] == node_shares(monkeypatch, ds, 4, per_node=2)


def test_node_locality_stopped_on_two_nodes_resumes_on_one_node_or_three_reading_each_object_once(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after 3 steps on 2 nodes of 2 ranks of 2 workers; resumed on 1 node of 3 ranks, and (from the
    same position) on 3 nodes of 1 rank: the rest of the epoch read once."""
    prefix, contents = objects
    stopped = loaders(monkeypatch, [dataset(prefix, client, locality="node") for _ in range(4)], 2, per_node=2)
    delivered = items(steps(stopped, 3))
    saved = [loader.state_dict() for loader, _ in stopped]
    finish(stopped)
    position = elastic_state(saved[0])
    assert all(elastic_state(state) == position for state in saved[1:]), "any rank's state says the same"
    prefix_length, beyond = position["consumed"]
    assert prefix_length + len(beyond) == 3 * 4 * BATCH

    for per_node in (3, 1):
        resumed = [dataset(prefix, client, locality="node") for _ in range(3)]
        for ds in resumed:
            ds.load_state_dict(position)
        rest = items(steps(loaders(monkeypatch, resumed, workers=1, per_node=per_node)))
        assert len(rest) == N - 3 * 4 * BATCH
        assert_exactly_once(delivered + rest, contents)


def test_node_locality_refuses_what_describes_no_nodes_and_a_state_dealt_to_other_nodes(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, _ = objects
    for value, shown in [("rack", "'rack'"), ("Node", "'Node'"), (True, "True")]:
        with pytest.raises(ValueError, match=f"locality must be None or 'node', got {shown}"):
            dataset(prefix, client, locality=value)
    ds = dataset(prefix, client, locality="node")
    for environment, words in [
        (
            {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "3"},
            "WORLD_SIZE 4 is not a multiple of LOCAL_WORLD_SIZE 3",
        ),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE must be >= 1, got 0"),
        (
            {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "two"},
            "LOCAL_WORLD_SIZE and GROUP_RANK must be integers",
        ),
        (
            {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"},
            "GROUP_RANK 0 is not the node of rank 3",
        ),
        ({"RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "0"}, "GROUP_RANK is set .* but LOCAL_WORLD_SIZE is not"),
    ]:
        as_rank(monkeypatch, 0, 1)
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=words):
            ds.share()

    as_rank(monkeypatch, 0, 2, per_node=1)
    states = {}
    for locality in (None, "node"):
        reading = dataset(prefix, client, locality=locality)
        iterator = iter(reading)
        next(iterator), next(iterator)
        iterator.close()
        states[locality] = reading.state_dict()
    for locality, other, words in [(None, "node", "nodes 1 then, 2 now"), ("node", None, "nodes 2 then, 1 now")]:
        with pytest.raises(ResumeError, match=words):
            dataset(prefix, client, locality=other).load_state_dict(states[locality])
