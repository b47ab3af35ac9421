"""EpochObjects under torchdata.nodes.Loader: one order per epoch whatever the world size, equal shares
per rank, and a state any rank saves that resumes on any number of ranks, every object read once; with
node locality, each machine's objects the same every epoch, and a resume on another number of machines.

Ranks (and machines) are told by torchrun's ``RANK`` and ``WORLD_SIZE`` (``LOCAL_WORLD_SIZE``,
``GROUP_RANK``), read when a rank's loader resets its nodes; their loaders step in lockstep here, as DDP's do."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import BaseNode, Batcher, IterableWrapper, Loader, ParallelMapper

from tests.delivery import assert_exactly_once, read
from tests.doc_blocks import doc_block
from tests.ranks import as_rank
from torchdata_gcs import ClientConfig, GCSIterableDataset, InvalidURIError, ResumeError
from torchdata_gcs._engines.epoch_order import epoch_order
from torchdata_gcs.datasets import elastic_state
from torchdata_gcs.nodes import ComposeShards, EpochObjects, ListFiles, LoadFiles
from torchdata_gcs.testing import Emulator, GCSFront

N = 60
BATCH = 3


@pytest.fixture(scope="module")
def objects(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    bucket = f"epochs-{uuid.uuid4().hex[:12]}"
    contents = {f"e/{i:03d}.bin": f"item {i}".encode() for i in range(N)}
    gcs_emulator.seed(bucket, contents)
    return f"gs://{bucket}/e/", {f"gs://{bucket}/{name}": data for name, data in contents.items()}


def pipeline(prefix: str, client: ClientConfig, kind: type = LoadFiles, workers: int = 2, **settings: Any) -> BaseNode:
    """List -> this rank's share of the epoch -> read -> map in ``workers`` threads (in order) -> batches."""
    epochs = EpochObjects(
        ListFiles(prefix, with_metadata=True, client=client), **{"shuffle": True, "seed": 5, **settings}
    )
    mapped = ParallelMapper(kind(epochs, transform=read, client=client), map_fn=lambda item: item, num_workers=workers)
    return Batcher(mapped, batch_size=BATCH, drop_last=False)


Batches = Iterator[list[tuple[str, bytes]]]


def loaders(roots: list[BaseNode], state: dict[str, Any] | None = None) -> list[Loader]:
    """A Loader per rank (rank ``r`` runs ``roots[r]``), from ``state`` if given."""
    made = [Loader(root) for root in roots]
    for loader in made:
        if state is not None:
            loader.load_state_dict(state)
    return made


def passes(monkeypatch: pytest.MonkeyPatch, ranks: list[Loader], per_node: int | None = None) -> list[Batches]:
    """A pass over every rank's loader (which resets its nodes), each begun while the environment names its rank
    (and, on machines of ``per_node`` ranks, its machine)."""
    started = []
    for rank, loader in enumerate(ranks):
        as_rank(monkeypatch, rank, len(ranks), per_node)
        started.append(iter(loader))
    return started


def steps(started: list[Batches], count: int | None = None) -> list[list[list[tuple[str, bytes]]]]:
    """``count`` steps (or all) of every rank in lockstep: the batches of each step, rank by rank."""
    taken = []
    for _ in itertools.count() if count is None else range(count):
        batches = [next(iterator, None) for iterator in started]
        if all(batch is None for batch in batches):
            break
        assert None not in batches, "ranks ran unequal numbers of steps"
        taken.append(batches)
    return taken


def items(taken: list[list[list[tuple[str, bytes]]]]) -> list[tuple[str, bytes]]:
    return [item for batches in taken for batch in batches for item in batch]


def test_every_world_size_reads_one_order_per_epoch_whose_prefix_is_read_after_every_step(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, contents = objects
    urls = sorted(contents)
    orders = [[urls[i] for i in epoch_order(N, seed=5, epoch=epoch, shuffle=True)] for epoch in (0, 1)]
    assert orders[0] != orders[1] != urls
    for world in (1, 2, 3):
        ranks = loaders([pipeline(prefix, client) for _ in range(world)])
        for epoch, order in enumerate(orders):  # each pass resets the nodes: the next epoch
            read_so_far: list[str] = []
            for batches in steps(passes(monkeypatch, ranks)):
                read_so_far += [url for batch in batches for url, _ in batch]
                assert sorted(read_so_far) == sorted(order[: len(read_so_far)]), f"not a prefix on {world} ranks"
            assert len(read_so_far) == N, f"{world} ranks read epoch {epoch} whole, once"


@pytest.mark.parametrize("kind", [LoadFiles, ComposeShards])
def test_stopped_on_two_ranks_of_two_workers_resumes_on_three_ranks_of_one_then_one_reading_each_object_once(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch, kind: type
) -> None:
    prefix, contents = objects
    two = loaders([pipeline(prefix, client, kind, workers=2) for _ in range(2)])
    running = passes(monkeypatch, two)
    delivered = items(steps(running, 3))
    saved = [loader.state_dict() for loader in two]
    assert saved[0] == saved[1], "every rank saves the same state"
    steps(running)  # the stopped run ends its epoch, and its threads, unread (no threads left behind for a fork)

    three = loaders([pipeline(prefix, client, kind, workers=1) for _ in range(3)], saved[0])
    running = passes(monkeypatch, three)
    delivered += items(steps(running, 2))
    state = three[2].state_dict()
    steps(running)

    one = loaders([pipeline(prefix, client, kind)], state)
    rest = items(steps(passes(monkeypatch, one)))
    assert len(rest) == N - 2 * 3 * BATCH - 3 * 2 * BATCH
    assert_exactly_once(delivered + rest, contents)


@pytest.mark.parametrize(("drop_last", "each"), [(False, 9), (True, 8)])
def test_ranks_get_equal_shares_padded_from_the_start_or_cut(
    objects: tuple[str, dict[str, bytes]],
    client: ClientConfig,
    monkeypatch: pytest.MonkeyPatch,
    drop_last: bool,
    each: int,
) -> None:
    """60 objects on 7 ranks, as DistributedSampler deals them: 9 each, the last 3 repeating the order's
    first 3; or 8 each, the last 4 unread."""
    prefix, contents = objects
    order = [sorted(contents)[i] for i in epoch_order(N, seed=5, epoch=0, shuffle=True)]
    listed = ListFiles(prefix, client=client)
    shares = []
    for rank in range(7):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "7")
        shares.append(list(Loader(EpochObjects(listed, shuffle=True, seed=5, drop_last=drop_last))))
    assert [len(share) for share in shares] == [each] * 7
    dealt = [share[j] for j in range(each) for share in shares]
    assert dealt == (order + order[:3] if not drop_last else order[:56])


def test_a_state_is_checked_against_the_listing_and_the_order_and_a_refused_one_changes_nothing(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, contents = objects
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    node = EpochObjects(ListFiles(prefix, client=client), shuffle=True, seed=5)
    first = [next(node) for _ in range(4)]
    state = node.state_dict()
    assert state["done"] == 4 and state["epoch"] == 0

    unshuffled = EpochObjects(ListFiles(prefix, client=client), shuffle=False, seed=5)
    with pytest.raises(ResumeError, match="shuffle True then, False now"):
        unshuffled.reset(state)
    fewer = EpochObjects(ListFiles([f"{prefix}{i:03d}.bin" for i in range(N - 1)], client=client), shuffle=True)
    with pytest.raises(ResumeError, match=f"a listing of {N} objects; this dataset lists {N - 1}"):
        fewer.reset(state)
    for bad, words in [
        ({**state, "done": 31}, "delivered 31 items of a share of 30"),
        ({**state, "epoch": -1}, "'epoch' must be an integer >= 0"),
        ({**state, "order": {**state["order"], "start": [3, [2]]}}, "sorted, distinct"),
        ([4], "expected a dict"),
    ]:
        with pytest.raises(ResumeError, match=words):
            node.reset(bad)  # type: ignore[arg-type]
        assert node.state_dict() == state, "a refused state changes nothing"
    resumed = EpochObjects(ListFiles(prefix, client=client), shuffle=True, seed=5)
    resumed.reset(state)
    rest = [next(node) for _ in range(26)]
    assert rest == [next(resumed) for _ in range(26)], "the node reads on where it was"
    assert len(set(first + rest)) == 30 and set(first + rest) < set(contents)


def test_a_loaders_state_given_to_elastic_state_or_a_dataset_is_refused_saying_to_give_it_to_the_loader(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nodes Loader's state resumes on any world size as it is: handed to ``elastic_state`` or to a
    dataset instead, it is refused saying so, and the dataset is unchanged."""
    prefix, _ = objects
    ranks = loaders([pipeline(prefix, client)])
    (started,) = passes(monkeypatch, ranks)
    next(started)
    state = ranks[0].state_dict()
    words = r"a torchdata.nodes Loader's state_dict\(\); give it to the Loader's load_state_dict"
    with pytest.raises(ResumeError, match=words):
        elastic_state(state)
    ds = GCSIterableDataset(prefix, client=client)
    with pytest.raises(ResumeError, match=words):
        ds.load_state_dict(state)
    assert ds.share() == GCSIterableDataset(prefix, client=client).share(), "a refused state changes nothing"


def test_the_guides_ddp_snippet_reads_each_epoch_once_across_two_ranks(
    gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = f"epochs-readme-{uuid.uuid4().hex[:8]}"
    objects = {f"train/{i:03d}.jpg": f"image {i}".encode() for i in range(130)}
    gcs_emulator.seed(bucket, objects)
    expected = {f"gs://{bucket}/{name}": data for name, data in objects.items()}
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)  # the snippet's default client
    snippet = doc_block("this_rank = EpochObjects(listing").replace("gs://my-bucket/train/", f"gs://{bucket}/train/")
    read_by_rank = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        decoded: list[tuple[str, bytes]] = []
        namespace = {
            "decode": lambda url, stream, into=decoded: into.append(read(url, stream)),
            "train_step": lambda batch: None,
            "epochs": 2,
        }
        exec(snippet, namespace)  # noqa: S102 - our own docs (guides/nodes.md)
        read_by_rank.append(decoded)
    assert [len(decoded) for decoded in read_by_rank] == [130, 130], "65 objects per rank, each of 2 epochs"
    for epoch in range(2):
        assert_exactly_once(
            [item for decoded in read_by_rank for item in decoded[65 * epoch : 65 * (epoch + 1)]], expected
        )
    assert read_by_rank[0][:65] != read_by_rank[0][65:], "the second epoch has another order"


def test_the_source_is_listed_once_for_every_epoch_and_anything_but_urls_is_refused(
    objects: tuple[str, dict[str, bytes]], gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, contents = objects
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with GCSFront(gcs_emulator.endpoint) as front:
        loader = Loader(EpochObjects(ListFiles(prefix, client=front.client_config), shuffle=True))
        epochs = [list(loader) for _ in range(3)]
        assert front.counts["list"] == 1, "one page of 60 names, listed at the first pass only"
    assert all(sorted(epoch) == sorted(contents) for epoch in epochs) and epochs[0] != epochs[1] != epochs[2]
    for items in ([3], [(b"gs://a-bucket/a", None)]):
        with pytest.raises(InvalidURIError, match="expected a 'gs://bucket/name' string"):
            next(EpochObjects(IterableWrapper(items)))
    with pytest.raises(InvalidURIError, match="not a GCS URL"):
        next(LoadFiles(EpochObjects(IterableWrapper(["/data/a.bin"])), client=gcs_emulator.client_config))
    with pytest.raises(TypeError, match="seed must be an integer, got str"):
        EpochObjects(IterableWrapper([]), seed="5")  # type: ignore[arg-type]
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK must be in 0..WORLD_SIZE-1, got RANK=2, WORLD_SIZE=2"):
        next(EpochObjects(IterableWrapper([f"{prefix}000.bin"])))


def test_node_locality_keeps_each_machines_objects_from_epoch_to_epoch_and_resumes_on_another_number_of_them(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 machines of 2 ranks, epochs 0, 1 and 2: every object read once, each machine the same 30 every epoch
    (the other's never), in another order each epoch. Stopped after 2 steps of epoch 3, the rest of that
    epoch is read once on 1 machine of 3 ranks, and (from the same state) on 3 machines of 1 rank."""
    prefix, contents = objects
    ranks = loaders([pipeline(prefix, client, locality="node") for _ in range(4)])
    by_machine: list[list[list[str]]] = [[], []]  # each machine's objects in the order read, epoch by epoch
    for _ in range(3):  # each pass, the next epoch
        taken = steps(passes(monkeypatch, ranks, per_node=2))
        assert len(taken) == N // 4 // BATCH, "15 objects per rank"
        assert_exactly_once(items(taken), contents)
        for machine in (0, 1):
            by_machine[machine].append(
                [url for batches in taken for b in batches[2 * machine : 2 * machine + 2] for url, _ in b]
            )
    for orders in by_machine:
        assert all(set(order) == set(orders[0]) for order in orders), "a machine reads the same objects every epoch"
        assert orders[0] != orders[1] != orders[2] != orders[0], "in another order each epoch"
    assert not set(by_machine[0][0]) & set(by_machine[1][0]), "the machines read different objects"

    running = passes(monkeypatch, ranks, per_node=2)
    delivered = items(steps(running, 2))
    state = ranks[3].state_dict()
    steps(running)
    for per_node in (3, 1):
        resumed = loaders([pipeline(prefix, client, locality="node", workers=1) for _ in range(3)], state)
        rest = items(steps(passes(monkeypatch, resumed, per_node=per_node)))
        assert len(rest) == N - 2 * 4 * BATCH
        assert_exactly_once(delivered + rest, contents)


def test_node_locality_refuses_another_value_and_machines_of_unequal_ranks(
    objects: tuple[str, dict[str, bytes]], client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, _ = objects
    with pytest.raises(ValueError, match="locality must be None or 'node', got 'rack'"):
        EpochObjects(IterableWrapper([]), locality="rack")  # type: ignore[arg-type]
    as_rank(monkeypatch, 0, 3, per_node=2)
    with pytest.raises(ValueError, match="WORLD_SIZE 3 is not a multiple of LOCAL_WORLD_SIZE 2"):
        next(EpochObjects(ListFiles(prefix, client=client), locality="node"))
