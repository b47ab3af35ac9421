"""torchdata.nodes' ReadShards over real HTTP: an epoch of tar shards read once in order or shuffled, a Loader
resumed exactly mid-epoch (the shuffle buffer's samples included), and resumed on 3 ranks from 2."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import Batcher, Loader

from tests.ranks import as_rank
from tests.shards.test_shard_dataset import SIZES, key_of, shard
from torchdata_gcs.nodes import ReadShards
from torchdata_gcs.testing import Emulator

BUCKET = "node-shards"
TOTAL = sum(SIZES)


@pytest.fixture(scope="module")
def client(gcs_emulator: Emulator) -> Iterator[Any]:
    starts = [sum(SIZES[:i]) for i in range(len(SIZES))]
    shards = {f"s/{i:03d}.tar": shard(start, n) for i, (start, n) in enumerate(zip(starts, SIZES, strict=True))}
    gcs_emulator.seed(BUCKET, shards)
    yield gcs_emulator.client_config


def loader(client: Any) -> Loader[list[int]]:
    node = ReadShards(f"gs://{BUCKET}/s/", transform=key_of, shuffle_buffer=16, client=client)
    return Loader(Batcher(node, batch_size=4, drop_last=False))


def test_each_epoch_reads_every_sample_once_in_its_own_order(client: Any) -> None:
    reading = loader(client)
    first = [key for batch in reading for key in batch]
    second = [key for batch in reading for key in batch]
    assert sorted(first) == sorted(second) == list(range(TOTAL)) and first != second


def test_a_loader_resumes_exactly_mid_epoch(client: Any) -> None:
    whole = [key for batch in loader(client) for key in batch]
    reading = loader(client)
    batches = iter(reading)
    head = [key for _ in range(11) for key in next(batches)]
    resumed = loader(client)
    resumed.load_state_dict(reading.state_dict())
    assert head + [key for batch in resumed for key in batch] == whole


def test_a_state_of_two_ranks_resumes_on_three(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    read, states = [], []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        reading = loader(client)
        batches = iter(reading)
        read += [key for _ in range(7) for key in next(batches)]
        states.append(reading.state_dict())
    for rank in range(3):
        as_rank(monkeypatch, rank, 3)
        resumed = loader(client)
        resumed.load_state_dict(states[0])
        read += [key for batch in resumed for key in batch]
    counts = Counter(read)
    assert set(counts) == set(range(TOTAL)) and sum(counts.values()) - TOTAL <= 2
