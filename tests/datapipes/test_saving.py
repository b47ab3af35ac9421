"""save_by_gcs: the sink DataPipe, standalone and inside a DataLoader2 graph."""

from __future__ import annotations

import io
import os
import warnings

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import GCSSaverIterDataPipe, InvalidURIError, WriteConfig, checkpoint
from torchdata_gcs._engines.upload import MIN_PART_SIZE
from torchdata_gcs.testing import Emulator, GCSFront

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService


def shard(index: int) -> tuple[str, dict[str, torch.Tensor]]:
    return f"gs://sink-graph/shard-{index:03d}.pt", {"index": torch.tensor(index), "x": torch.full((3,), float(index))}


def test_payload_kinds_standalone(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket("sink-kinds")
    big = os.urandom(11 * 1024 * 1024)
    stream = io.BytesIO(b"skip:" + big)
    stream.seek(5)  # copied from its current position
    state = {"w": torch.randn(64, 64), "step": torch.tensor(3)}
    items = [("gs://sink-kinds/a.bin", b"bytes"), ("gs://sink-kinds/b.bin", stream), ("gs://sink-kinds/c.pt", state)]
    with GCSFront(gcs_emulator.endpoint) as front:
        pipe = IterableWrapper(items).save_by_gcs(
            client=front.client_config, write=WriteConfig(part_size=MIN_PART_SIZE)
        )
        assert list(pipe) == [url for url, _ in items]
        assert front.open_uploads == []
    assert gcs_emulator.read("sink-kinds", "a.bin") == b"bytes"
    assert gcs_emulator.read("sink-kinds", "b.bin") == big
    loaded = checkpoint.load("gs://sink-kinds/c.pt", client=gcs_emulator.client_config)
    assert all(torch.equal(loaded[key], value) for key, value in state.items())


def test_a_failed_payload_publishes_nothing(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket("sink-failed")
    items = [("gs://sink-failed/ok.pt", {"a": torch.ones(1)}), ("gs://sink-failed/bad.pt", {"f": lambda: 1})]
    saved = []
    with pytest.raises(Exception, match="pickle|lambda"):
        saved.extend(GCSSaverIterDataPipe(items, client=gcs_emulator.client_config))  # keeps what came first
    assert saved == ["gs://sink-failed/ok.pt"]
    assert gcs_emulator.names("sink-failed") == ["ok.pt"]


def test_inside_a_dataloader2_graph(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket("sink-graph")
    client = gcs_emulator.client_config
    pipe = IterableWrapper(range(40)).sharding_filter().map(shard).save_by_gcs(client=client)
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        saved = list(loader)
    finally:
        loader.shutdown()
    assert sorted(saved) == sorted(shard(i)[0] for i in range(40))
    assert len(gcs_emulator.names("sink-graph")) == 40
    assert checkpoint.load(shard(7)[0], client=client)["index"].item() == 7


def test_bad_items_and_settings(gcs_emulator: Emulator) -> None:
    with pytest.raises(InvalidURIError):
        list(GCSSaverIterDataPipe([b"no url"], client=gcs_emulator.client_config))
    with pytest.raises(InvalidURIError):
        list(GCSSaverIterDataPipe([("gs://sink-kinds/", b"x")], client=gcs_emulator.client_config))
    with pytest.raises(ValueError, match="part_size"):
        GCSSaverIterDataPipe([], write=WriteConfig(part_size=1024))
