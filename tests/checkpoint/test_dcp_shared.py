"""DCP loads whose ranks share a machine: a replicated checkpoint loaded by 4 ranks (processes forked from
this one, gloo over a file store) is read from GCS about once, not 4 times, every rank's tensors exact and
nothing left in ``/dev/shm``; a rank whose fetcher cannot publish a range reads it itself."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.ranks import run_ranks
from torchdata_gcs import ClientConfig, TransferConfig
from torchdata_gcs._engines.process_groups import SHARED_MEMORY
from torchdata_gcs._engines.shared_spans import Shared, take_or_read
from torchdata_gcs.dcp import GCSStorageReader, GCSStorageWriter
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET = "dcp-shared"
URL = f"gs://{BUCKET}/replicated"


def state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(256, 1024, generator=generator) for i in range(6)}  # 6 x 1 MiB


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.save(state(0), storage_writer=GCSStorageWriter(URL, client=running.client_config))
        yield running


def media_bytes(front: GCSFront, since: int, name: str, size: int) -> int:
    total = 0
    for request in front.recorded[since:]:
        if request.method == "GET" and "alt=media" in request.target and name.replace("/", "%2F") in request.target:
            first, _, last = (request.header("Range") or ["bytes=0-"])[0].removeprefix("bytes=").partition("-")
            total += min(int(last) + 1 if last else size, size) - int(first)
    return total


def _load_replicated(rank: int, client: ClientConfig) -> dict[str, Any]:
    loaded = {key: torch.zeros_like(value) for key, value in state(0).items()}
    reader = GCSStorageReader(URL, client=client, transfer=TransferConfig(part_size=256 * 1024))
    dcp.load(loaded, storage_reader=reader)
    return {"same": all(torch.equal(loaded[key], value) for key, value in state(0).items())}


def test_a_replicated_checkpoint_is_read_about_once_by_the_ranks_of_a_machine(
    front: GCSFront, gcs_emulator: Emulator, tmp_path: Path
) -> None:
    (data,) = [name for name in gcs_emulator.names(BUCKET) if name.endswith(".distcp")]
    size = len(gcs_emulator.read(BUCKET, data))
    left_before, since = set(SHARED_MEMORY.glob("torchdata-gcs-*")), len(front.recorded)
    outcomes = run_ranks(4, tmp_path, front.endpoint, _load_replicated)
    assert [outcome.get("result") for outcome in outcomes] == [{"same": True}] * 4, outcomes
    read = media_bytes(front, since, data, size)
    assert size <= read <= 1.1 * size, (read, size)  # each rank alone: 4x
    assert set(SHARED_MEMORY.glob("torchdata-gcs-*")) == left_before


def test_a_range_whose_fetcher_has_ended_is_read_by_the_rank_that_wanted_it() -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    shared = Shared(f"torchdata-gcs-span-{int(ended.stdout)}-test-0", 0, int(ended.stdout), 1)
    into = memoryview(bytearray(4))

    async def read() -> int:
        into[:] = b"mine"
        return 7

    assert asyncio.run(asyncio.wait_for(take_or_read(shared, into, read, patience=30.0), 10)) == 7
    assert bytes(into) == b"mine"
    assert not os.path.exists(f"{SHARED_MEMORY}/{shared.name}.alone")  # the only taker: its mark is gone


def test_items_sharing_a_range_are_checked_once_not_at_every_read(
    front: GCSFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP reads each item in many pieces; hashing every item of a shared range again at each piece made a
    load of 64 tensors of 4 MiB 9x slower. The bytes hashed must stay about the checkpoint's size."""
    import torchdata_gcs._engines.read_ahead as read_ahead

    saved = {f"t{i}": torch.randn(64 * 1024) for i in range(64)}  # 64 items of 256 KiB: a few ranges hold them
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.save(saved, storage_writer=GCSStorageWriter(f"gs://{BUCKET}/small-items", client=front.client_config))
        hashed = []
        real = read_ahead.crc32c_extend
        monkeypatch.setattr(read_ahead, "crc32c_extend", lambda crc, data: hashed.append(len(data)) or real(crc, data))
        loaded = {key: torch.zeros_like(value) for key, value in saved.items()}
        dcp.load(loaded, storage_reader=GCSStorageReader(f"gs://{BUCKET}/small-items", client=front.client_config))
    assert all(torch.equal(loaded[key], value) for key, value in saved.items())
    assert sum(hashed) <= 1.1 * 64 * 256 * 1024, sum(hashed)
