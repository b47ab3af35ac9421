"""``LocalCache`` under the nodes: ``LoadFiles`` and ``ComposeShards`` read a second epoch from the cache,
without a media request, the same items in the same order; composites' members are kept, not composites."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import Loader

from torchdata_gcs import LocalCache
from torchdata_gcs.nodes import ComposeShards, EpochObjects, ListFiles, LoadFiles
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET = "nodes-cache"
OBJECTS = {f"d/{i:02d}.bin": bytes([i]) * (100 + i) for i in range(24)}


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator):
    gcs_emulator.seed(BUCKET, OBJECTS)
    with GCSFront(gcs_emulator.endpoint) as running:
        yield running


def media_gets(front: GCSFront) -> int:
    return front.counts["get"] + front.counts["range_get"]


@pytest.mark.parametrize("kind", [LoadFiles, ComposeShards])
def test_a_second_epoch_reads_from_the_cache_the_same_items(kind, front: GCSFront, tmp_path: Path) -> None:
    client = front.client_config
    cache = LocalCache(tmp_path, limit="1MB")
    listed = EpochObjects(ListFiles(f"gs://{BUCKET}/d/", with_metadata=True, client=client), shuffle=True, seed=3)
    loader = Loader(kind(listed, transform=lambda url, stream: (url, stream.read()), client=client, cache=cache))
    epochs, gets = [], []
    for _ in range(2):
        before = media_gets(front)
        epochs.append(list(loader))
        gets.append(media_gets(front) - before)
    assert [dict(epoch) for epoch in epochs] == [{f"gs://{BUCKET}/{n}": d for n, d in OBJECTS.items()}] * 2
    assert epochs[0] != epochs[1]  # reshuffled, read in its own order
    assert gets[1] == 0 and (gets[0] == len(OBJECTS) if kind is LoadFiles else 0 < gets[0] < len(OBJECTS))
    kept = sorted(path.stat().st_size for path in tmp_path.rglob("entries/*/*"))
    assert kept == sorted(len(data) for data in OBJECTS.values())  # the objects, not the composites
