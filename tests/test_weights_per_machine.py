"""Weights fetched once per machine: 4 ranks (processes forked from this one, gloo over a file store) load
one safetensors file, or a sharded model, with ``process_group``: the bytes read at the front stay within
1.05x the files, every rank's tensors are exact and view one shared segment, and nothing is left in
``/dev/shm``. A subgroup loads while the other ranks never call; a file that is missing, a shard that is
missing and a rank killed mid-load fail every rank that loads, within the group's timeout."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.ranks import run_ranks
from torchdata_gcs import ClientConfig, TransferConfig
from torchdata_gcs import safetensors as ours
from torchdata_gcs._engines.process_groups import SHARED_MEMORY
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET = "node-weights"
PARTS = TransferConfig(part_size=256 * 1024)  # many ranges, so each rank has a share


def model(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(1024, 768, generator=generator),  # 3 MiB
        "head.bf16": torch.randn(513, 257, generator=generator).to(torch.bfloat16),
        "norm.f16": torch.randn(7, generator=generator).to(torch.float16),
        "steps.i64": torch.arange(5),
        "mask": torch.rand(33, generator=generator) > 0.5,
    }


def digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    return {
        name: f"{tensor.dtype}{list(tensor.shape)}:{hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()}"  # noqa: E501
        for name, tensor in tensors.items()
    }


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        ours.save_file(model(0), f"gs://{BUCKET}/one.safetensors", client=running.client_config)
        sharded = {f"layer{i}.{name}": tensor for i in range(3) for name, tensor in model(i).items()}
        ours.save_sharded(sharded, f"gs://{BUCKET}/llm/", 4 * 2**20, client=running.client_config)
        yield running


def read_bytes(front: GCSFront, since: int, sizes: dict[str, int]) -> int:
    """Bytes of media the front answered to requests after its first ``since``, from their ranges."""
    total = 0
    for request in front.recorded[since:]:
        name = re.search(r"/b/[^/]+/o/([^?]+)\?.*alt=media", request.target)
        if request.method != "GET" or name is None:
            continue
        size = sizes[name[1].replace("%2F", "/")]
        ranges = request.header("Range")
        if not ranges:
            total += size
            continue
        first, _, last = ranges[0].removeprefix("bytes=").partition("-")
        total += min(int(last) + 1 if last else size, size) - int(first)
    return total


def object_sizes(emulator: Emulator) -> dict[str, int]:
    return {name: len(emulator.read(BUCKET, name)) for name in emulator.names(BUCKET)}


def segments() -> set[str]:
    return {path.name for path in SHARED_MEMORY.glob("torchdata-gcs-*")}


def _load_one(rank: int, client: ClientConfig) -> dict[str, Any]:
    tensors = ours.load_file(
        f"gs://{BUCKET}/one.safetensors", process_group=dist.group.WORLD, client=client, transfer=PARTS
    )
    storages = {tensor.untyped_storage().data_ptr() for tensor in tensors.values()}
    return {"digests": digests(tensors), "storages": len(storages)}


def test_four_ranks_fetch_one_file_once_and_each_holds_it_exactly(
    front: GCSFront, gcs_emulator: Emulator, tmp_path: Path
) -> None:
    before, since = segments(), len(front.recorded)
    outcomes = run_ranks(4, tmp_path, front.endpoint, _load_one)
    expected = digests(model(0))
    for outcome in outcomes:
        assert "error" not in outcome, outcome
        assert outcome["result"]["digests"] == expected
        assert outcome["result"]["storages"] == 1  # every tensor views the one segment: no copies
    size = object_sizes(gcs_emulator)["one.safetensors"]
    assert size <= read_bytes(front, since, object_sizes(gcs_emulator)) <= 1.05 * size
    assert segments() == before


def _load_model(rank: int, client: ClientConfig) -> dict[str, Any]:
    tensors = ours.load_files(f"gs://{BUCKET}/llm/", process_group=dist.group.WORLD, client=client, transfer=PARTS)
    return {"digests": digests(tensors)}


def test_four_ranks_fetch_a_sharded_model_once(front: GCSFront, gcs_emulator: Emulator, tmp_path: Path) -> None:
    before, since = segments(), len(front.recorded)
    outcomes = run_ranks(4, tmp_path, front.endpoint, _load_model)
    expected = digests({f"layer{i}.{name}": tensor for i in range(3) for name, tensor in model(i).items()})
    assert [outcome.get("result") for outcome in outcomes] == [{"digests": expected}] * 4
    sizes = object_sizes(gcs_emulator)
    shards = sum(size for name, size in sizes.items() if name.startswith("llm/") and name.endswith(".safetensors"))
    index = sizes[f"llm/{ours.INDEX_NAME}"]
    assert shards <= read_bytes(front, since, sizes) - 4 * index <= 1.05 * shards  # each rank reads the index
    assert segments() == before


def _pair_of_four(rank: int, client: ClientConfig) -> dict[str, Any]:
    if rank >= 2:  # never calls anything: the pair must not wait for it
        return {"called": False}
    pair = dist.new_group([0, 1], use_local_synchronization=True)
    tensors = ours.load_file(f"gs://{BUCKET}/one.safetensors", process_group=pair, client=client, transfer=PARTS)
    return {"digests": digests(tensors)}


def test_a_subgroup_loads_while_the_other_ranks_never_call(
    front: GCSFront, gcs_emulator: Emulator, tmp_path: Path
) -> None:
    since = len(front.recorded)
    outcomes = run_ranks(4, tmp_path, front.endpoint, _pair_of_four)
    expected = digests(model(0))
    assert [outcome.get("result") for outcome in outcomes] == [{"digests": expected}] * 2 + [{"called": False}] * 2
    size = object_sizes(gcs_emulator)["one.safetensors"]
    assert read_bytes(front, since, object_sizes(gcs_emulator)) <= 1.05 * size


def _load_missing(rank: int, client: ClientConfig) -> Any:
    return ours.load_files(f"gs://{BUCKET}/no-such-model/", process_group=dist.group.WORLD, client=client)


def test_a_missing_model_fails_every_rank_with_the_same_typed_error(front: GCSFront, tmp_path: Path) -> None:
    outcomes = run_ranks(3, tmp_path, front.endpoint, _load_missing)
    for outcome in outcomes:
        kind, message, _ = outcome["error"]
        assert kind == "NotFoundError" and "no-such-model/" in message, outcome


def _load_with_a_missing_shard(rank: int, client: ClientConfig) -> Any:
    url = f"gs://{BUCKET}/llm-gap/{ours.INDEX_NAME}"
    return ours.load_files(url, process_group=dist.group.WORLD, client=client, transfer=PARTS)


def test_a_missing_shard_fails_every_rank_naming_it(front: GCSFront, gcs_emulator: Emulator, tmp_path: Path) -> None:
    before = segments()
    for name in gcs_emulator.names(BUCKET):
        if name.startswith("llm/") and not name.endswith("00002-of-00003.safetensors"):
            gcs_emulator.upload(BUCKET, name.replace("llm/", "llm-gap/"), gcs_emulator.read(BUCKET, name))
    outcomes = run_ranks(4, tmp_path, front.endpoint, _load_with_a_missing_shard)
    for outcome in outcomes:
        kind, message, _ = outcome["error"]
        assert kind == "NotFoundError" and "llm-gap/model-00002-of-00003.safetensors" in message, outcome
    assert segments() == before


def _killed_mid_load(rank: int, client: ClientConfig) -> Any:
    if rank == 2:  # dies while the ranks read their shares, as a process the OOM killer picks
        threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return ours.load_file(
        f"gs://{BUCKET}/one.safetensors", process_group=dist.group.WORLD, client=client, transfer=PARTS
    )


def test_a_rank_killed_mid_load_fails_the_others_naming_it_and_leaves_no_segment(
    gcs_emulator: Emulator, tmp_path: Path
) -> None:
    before = segments()
    with GCSFront(gcs_emulator.endpoint, latency=1.0) as slow:  # the first reads, then the shares: 2 s or more
        outcomes = run_ranks(4, tmp_path, slow.endpoint, _killed_mid_load, timeout=20.0, killed=2)
    for rank in (0, 1, 3):
        kind, message, _ = outcomes[rank]["error"]
        assert kind == "RankFailedError" and "rank 2 of this machine stopped" in message, outcomes[rank]
    assert segments() == before


def _load_empty(rank: int, client: ClientConfig) -> Any:
    return ours.load_file(f"gs://{BUCKET}/empty.safetensors", process_group=dist.group.WORLD, client=client)


def test_an_empty_object_is_refused_on_every_rank(front: GCSFront, gcs_emulator: Emulator, tmp_path: Path) -> None:
    gcs_emulator.upload(BUCKET, "empty.safetensors", b"")
    for outcome in run_ranks(2, tmp_path, front.endpoint, _load_empty):
        kind, message, _ = outcome["error"]
        assert kind == "IntegrityError" and "not a safetensors file: 0 bytes" in message, outcome
