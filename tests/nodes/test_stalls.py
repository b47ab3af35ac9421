"""The nodes' data-stall figures: the wait for each object, requests and 429s since the last reset, and the
loader's batch waits through ``StallWatch``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import Batcher, Loader

from tests.delivery import assert_exactly_once, read
from torchdata_gcs import RetryConfig
from torchdata_gcs.nodes import ComposeShards, ListFiles, LoadFiles
from torchdata_gcs.stalls import StallWatch
from torchdata_gcs.testing import Emulator, Fault, GCSFront

N_OBJECTS = 12
LATENCY = 0.05


@pytest.mark.parametrize("kind", [LoadFiles, ComposeShards])
def test_a_node_reports_its_waits_requests_and_429s(gcs_emulator: Emulator, kind) -> None:
    bucket = "nodes-stalls"
    objects = {f"{i:02d}.bin": f"item {i};".encode() * (i + 1) for i in range(N_OBJECTS)}
    gcs_emulator.seed(bucket, objects)
    expected = {f"gs://{bucket}/{name}": data for name, data in objects.items()}
    with GCSFront(gcs_emulator.endpoint, latency=LATENCY) as front:
        retry = RetryConfig(initial_delay=0.01, max_delay=0.02)
        node = kind(
            ListFiles(f"gs://{bucket}/", with_metadata=True, client=front.client_config),
            transform=read,
            client=front.client_config,
            retry=retry,
        )
        front.set_faults([Fault("http_429", match="alt=media", times=2)])
        loader = StallWatch(Loader(Batcher(node, batch_size=4, drop_last=False)), source=node)
        assert_exactly_once([item for batch in loader for item in batch], expected)
    report = loader.report()
    assert report == json.loads(json.dumps(report))
    assert list(report["workers"]) == ["main"]
    assert report["objects"] == N_OBJECTS and report["throttled"] == report["retries"] == 2
    assert report["object_wait_s"]["count"] == N_OBJECTS and report["object_wait_s"]["max"] >= LATENCY
    assert report["batch_wait_s"]["count"] == N_OBJECTS // 4 and report["batch_wait_s"]["max"] >= LATENCY
    assert loader.scalars()["data/workers/main/throttled"] == 2
    node.reset()
    assert node.stall_stats()["object_wait_s"]["count"] == 0, "a reset starts the figures afresh"
