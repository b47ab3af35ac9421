"""torch.distributed.checkpoint on GCS: GCSStorageWriter / GCSStorageReader over real HTTP to the emulator."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import warnings
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh

from tests.http_proxy import RecordingProxy
from torchdata_gcs import (
    AccessDeniedError,
    ClientConfig,
    IntegrityError,
    NotFoundError,
    RetryConfig,
    TransferConfig,
    WriteConfig,
)
from torchdata_gcs.checkpoint import open_writer
from torchdata_gcs.dcp import GCSStorageReader, GCSStorageWriter
from torchdata_gcs.testing import Emulator, Fault, GCSFront
from torchdata_gcs.testing._process import free_port

SINGLE_PROCESS = "ignore:torch.distributed is disabled"
pytestmark = pytest.mark.filterwarnings(SINGLE_PROCESS)

MiB = 1024 * 1024
PART = 5 * MiB  # GCS's smallest multipart part: files above it go out in several parts
FAST_RETRY = RetryConfig(max_attempts=2, initial_delay=0.01, max_delay=0.02)


def model_state(seed: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "encoder.weight": torch.randn(1024, 1536, generator=generator),  # 6 MiB: more than one part
        "encoder.bias": torch.randn(1536, generator=generator),
        "head.weight": torch.randn(512, 256, generator=generator).to(torch.bfloat16),
        "embedding": torch.randint(0, 1000, (300, 7), generator=generator),
        "mask": torch.rand(64, generator=generator) > 0.5,
        "scale": torch.tensor(0.5, dtype=torch.float64),
        "transposed": torch.randn(33, 17, generator=generator).t(),  # not contiguous
        "step": 1234,
        "config": {"lr": 3e-4, "betas": (0.9, 0.95), "name": "run-1"},
        "history": [1.5, 1.25, None],
    }


def blank_like(state: dict[str, Any]) -> dict[str, Any]:
    """What a training script loads into: tensors of the right shape and dtype, placeholder values."""

    def blank(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.zeros_like(value)
        if isinstance(value, dict):
            return {key: blank(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(blank(item) for item in value)
        return None if value is None else type(value)()

    return blank(state)


def assert_same(loaded: dict[str, Any], expected: dict[str, Any]) -> None:
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape, key
            assert torch.equal(loaded[key], value), key
        else:
            assert loaded[key] == value, key


def data_files(emulator: Emulator, bucket: str, prefix: str) -> dict[str, int]:
    """Name and size of every data file of the checkpoint at ``prefix``."""
    names = [name for name in emulator.names(bucket) if name.startswith(prefix) and name.endswith(".distcp")]
    return {name: len(emulator.read(bucket, name)) for name in names}


def media_ranges(proxy: RecordingProxy, name: str) -> list[tuple[int, int] | None]:
    """The byte ranges (first, last) of every media GET of ``name`` the proxy saw; ``None``: a whole-object GET."""
    ranges: list[tuple[int, int] | None] = []
    encoded = name.replace("/", "%2F")
    for method, path, headers in proxy.requests:
        if method == "GET" and "alt=media" in path and f"/o/{encoded}?" in path:
            match = re.fullmatch(r"bytes=(\d+)-(\d+)", headers.get("range", ""))
            ranges.append((int(match.group(1)), int(match.group(2))) if match else None)
    return ranges


@pytest.fixture
def front(gcs_front: GCSFront) -> GCSFront:
    return gcs_front


# -- single process ------------------------------------------------------------------------------------------


def test_round_trip_is_bit_exact_with_multipart_writes_and_ranged_reads(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    state = model_state()
    url = f"gs://{gcs_bucket}/run/step-100"
    writer = GCSStorageWriter(url, client=front.client_config, write=WriteConfig(part_size=PART))
    dcp.save(state, storage_writer=writer)
    assert sorted(gcs_emulator.names(gcs_bucket)) == ["run/step-100/.metadata", "run/step-100/__0_0.distcp"]
    assert front.counts["upload"] >= 5  # data: initiate, 2 parts, complete; then .metadata in one request
    assert front.open_uploads == []

    front.reset_counts()
    loaded = blank_like(state)
    reader = GCSStorageReader(url, client=front.client_config, transfer=TransferConfig(part_size=MiB))
    dcp.load(loaded, storage_reader=reader)
    assert_same(loaded, state)
    assert front.counts["get"] == 0  # only ranged GETs, never a whole object
    # .metadata, the 6 MiB tensor as 1 MiB ranges, and the small items before and after it as one range each
    # (read in file order, not in the key order DCP plans them in)
    assert 8 <= front.counts["range_get"] <= 10
    (size,) = data_files(gcs_emulator, gcs_bucket, "run/step-100/").values()
    assert size <= reader.stats.bytes <= size + 64 * 1024  # the data file once, plus the metadata


def test_load_within_a_tiny_read_ahead_budget(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    state = model_state(seed=11)
    url = f"gs://{gcs_bucket}/budget"
    dcp.save(state, storage_writer=GCSStorageWriter(url, client=gcs_emulator.client_config))  # one request
    loaded = blank_like(state)
    transfer = TransferConfig(part_size=256 * 1024, max_buffered_bytes=1, max_in_flight=2)  # one span at a time
    reader = GCSStorageReader(url, client=gcs_emulator.client_config, transfer=transfer)
    dcp.load(loaded, storage_reader=reader)
    assert_same(loaded, state)
    assert reader.stats.requests >= 24  # the 6 MiB tensor alone takes 24 ranges of 256 KiB


def test_load_resumes_cut_ranges(front: GCSFront, gcs_bucket: str) -> None:
    state = model_state(seed=1)
    url = f"gs://{gcs_bucket}/cut"
    dcp.save(state, storage_writer=GCSStorageWriter(url, client=front.client_config, write=WriteConfig(part_size=PART)))
    front.set_faults([Fault("truncate", match="range_get", times=3)])
    loaded = blank_like(state)
    dcp.load(loaded, storage_reader=GCSStorageReader(url, client=front.client_config))
    assert_same(loaded, state)
    assert front.faults_injected["truncate"] == 3


@pytest.mark.parametrize("subset", [False, True], ids=["whole", "one-key"])
def test_each_item_is_checked_before_it_reaches_the_callers_tensors(
    front: GCSFront, gcs_bucket: str, subset: bool
) -> None:
    """Every item is saved with its crc32c; a load checks each item it reads (whole files and ranges alike)
    before DCP copies it, reads a damaged one again, and leaves the caller's tensors alone if it stays damaged."""
    generator = torch.Generator().manual_seed(3)
    state = {name: torch.randn(256, 1024, generator=generator) for name in "abcd"}  # 1 MiB each
    url = f"gs://{gcs_bucket}/checked-{subset}"
    dcp.save(state, storage_writer=GCSStorageWriter(url, client=front.client_config, write=WriteConfig(part_size=PART)))
    client = front.client_config

    def blank() -> dict[str, torch.Tensor]:
        return {"c": torch.zeros(256, 1024)} if subset else {name: torch.zeros(256, 1024) for name in state}

    data = r"GET /download/\S+\.distcp\?"  # the data files' ranged reads, not the metadata's
    front.set_faults([Fault("corrupt", match=data, times=1)])
    once = blank()
    dcp.load(once, storage_reader=GCSStorageReader(url, client=client, retry=FAST_RETRY))
    assert all(torch.equal(once[name], state[name]) for name in once) and front.faults_injected["corrupt"] == 1

    front.set_faults([Fault("corrupt", match=data)])
    always = blank()
    with pytest.raises(BaseException) as caught:  # DCP wraps it in its CheckpointException
        dcp.load(always, storage_reader=GCSStorageReader(url, client=client, retry=FAST_RETRY))
    assert "crc32c" in str(caught.value)
    assert all(not tensor.any() for tensor in always.values())  # nothing damaged was copied in


def test_loading_one_key_reads_only_its_byte_range(
    gcs_emulator: Emulator, gcs_bucket: str, proxy: RecordingProxy
) -> None:
    generator = torch.Generator().manual_seed(2)
    state = {name: torch.randn(256, 1024, generator=generator) for name in "abcd"}  # 1 MiB each
    url = f"gs://{gcs_bucket}/subset"
    dcp.save(state, storage_writer=GCSStorageWriter(url, client=gcs_emulator.client_config))
    ((name, size),) = data_files(gcs_emulator, gcs_bucket, "subset/").items()
    assert size > 4 * MiB

    only_c = {"c": torch.zeros(256, 1024)}
    reader = GCSStorageReader(url, client=ClientConfig(endpoint=proxy.endpoint))
    dcp.load(only_c, storage_reader=reader)
    assert torch.equal(only_c["c"], state["c"])
    ranges = media_ranges(proxy, name)
    assert ranges and None not in ranges  # ranged GETs only
    requested = sum(last - first + 1 for first, last in ranges)  # type: ignore[misc]
    assert MiB <= requested < 1.1 * MiB  # c's bytes, not the 4 MiB file
    assert reader.stats.bytes < 1.1 * MiB + 64 * 1024  # its range and the metadata


def test_zstandard_extension_round_trip_and_partial_load(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    generator = torch.Generator().manual_seed(3)
    state = {
        "zeros": torch.zeros(512, 1024),  # 2 MiB that compress to almost nothing
        "ramp": torch.arange(256 * 1024, dtype=torch.int32),
        "noise": torch.randn(128, 128, generator=generator),
        "step": 9,
    }
    url = f"gs://{gcs_bucket}/zstd"
    writer = GCSStorageWriter(url, client=gcs_emulator.client_config, _extensions=[ZStandard()])
    dcp.save(state, storage_writer=writer)
    (size,) = data_files(gcs_emulator, gcs_bucket, "zstd/").values()
    raw = sum(value.nbytes for value in state.values() if isinstance(value, torch.Tensor))
    assert size < raw / 4

    reader = GCSStorageReader(url, client=gcs_emulator.client_config)
    descriptors = {
        info.transform_descriptors and tuple(info.transform_descriptors)
        for info in reader.read_metadata().storage_data.values()
    }
    assert descriptors == {("stream.zstd/1",)}
    loaded = blank_like(state)
    dcp.load(loaded, storage_reader=reader)
    assert_same(loaded, state)

    partial = {"noise": torch.zeros(128, 128)}
    reader = GCSStorageReader(url, client=gcs_emulator.client_config)
    dcp.load(partial, storage_reader=reader)
    assert torch.equal(partial["noise"], torch.as_tensor(state["noise"]))
    assert reader.stats.bytes < size  # the noise item's compressed range, not the file


def test_async_save_snapshots_the_state_then_loads(front: GCSFront, gcs_bucket: str) -> None:
    state = model_state(seed=4)
    expected = {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in state.items()}
    url = f"gs://{gcs_bucket}/async"
    future = dcp.async_save(
        state, storage_writer=GCSStorageWriter(url, client=front.client_config, write=WriteConfig(part_size=PART))
    )
    state["encoder.weight"].add_(1.0)  # after staging: must not reach the checkpoint
    assert isinstance(future, Future)  # (an AsyncSaveResponse only with a stager that stages in the background)
    metadata = future.result(timeout=60)
    assert "encoder.weight" in metadata.state_dict_metadata
    loaded = blank_like(expected)
    dcp.load(loaded, storage_reader=GCSStorageReader(url, client=front.client_config))
    assert_same(loaded, expected)


@pytest.mark.skipif("strategy" not in inspect.signature(open_writer).parameters, reason="no compose strategy")
def test_compose_strategy_writes_large_files_to_the_bare_emulator(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    state = model_state(seed=5)
    url = f"gs://{gcs_bucket}/compose"
    writer = GCSStorageWriter(
        url, client=gcs_emulator.client_config, write=WriteConfig(part_size=PART, strategy="compose")
    )
    dcp.save(state, storage_writer=writer)
    loaded = blank_like(state)
    dcp.load(loaded, storage_reader=GCSStorageReader(url, client=gcs_emulator.client_config))
    assert_same(loaded, state)


def gets(front: GCSFront) -> int:
    """Media GETs the front answered, whole or ranged."""
    return front.counts["get"] + front.counts["range_get"]


def test_load_request_counts_before_and_after_coalescing(front: GCSFront, gcs_bucket: str) -> None:
    """A few hundred small tensors in one data file: read one request per item, a load would send one GET each;
    the reader fetches neighbours together, in a couple of GETs."""
    generator = torch.Generator().manual_seed(12)
    state = {f"layer{i}.bias": torch.randn(64, generator=generator) for i in range(300)}
    url = f"gs://{gcs_bucket}/small-items"
    dcp.save(state, storage_writer=GCSStorageWriter(url, client=front.client_config))
    front.reset_counts()
    loaded = blank_like(state)
    reader = GCSStorageReader(url, client=front.client_config)
    dcp.load(loaded, storage_reader=reader)
    assert_same(loaded, state)
    one_per_item = 1 + len(reader.storage_data)  # .metadata, then each stored item on its own
    assert one_per_item == 301
    assert gets(front) == reader.stats.requests <= 3  # .metadata and the data file's items in one range


class Halves(DefaultLoadPlanner):
    """Reads each tensor of two or more rows as two ReadItems (top and bottom rows) of the same stored item, as
    a rank holding two shards of one saved chunk does: both read the stored item's whole byte range."""

    def create_local_plan(self) -> LoadPlan:
        plan = super().create_local_plan()
        items: list[ReadItem] = []
        for item in plan.items:
            if item.type != LoadItemType.TENSOR or not item.lengths or item.lengths[0] < 2:
                items.append(item)
                continue
            half, rest = item.lengths[0] // 2, list(item.lengths[1:])
            items.append(replace(item, lengths=torch.Size([half, *rest])))
            items.append(
                replace(
                    item,
                    dest_offsets=torch.Size([item.dest_offsets[0] + half, *item.dest_offsets[1:]]),
                    storage_offsets=torch.Size([item.storage_offsets[0] + half, *item.storage_offsets[1:]]),
                    lengths=torch.Size([item.lengths[0] - half, *rest]),
                )
            )
        return replace(plan, items=items)


def test_read_items_of_one_stored_item_share_one_fetch(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """Two ReadItems of one stored item read the same byte range: it is fetched once, also when the item is
    larger than a span (here 4 MiB, read in 1 MiB ranges), not once per ReadItem."""
    generator = torch.Generator().manual_seed(13)
    state = {"big": torch.randn(1024, 1024, generator=generator)}
    state.update({f"small{i}": torch.randn(8, 4, generator=generator) for i in range(20)})
    url = f"gs://{gcs_bucket}/halves"
    dcp.save(state, storage_writer=GCSStorageWriter(url, client=front.client_config))
    (size,) = data_files(gcs_emulator, gcs_bucket, "halves/").values()
    transfer = TransferConfig(part_size=MiB)

    counts = []
    for planner in (DefaultLoadPlanner(), Halves()):
        front.reset_counts()
        loaded = blank_like(state)
        reader = GCSStorageReader(url, client=front.client_config, transfer=transfer)
        dcp.load(loaded, storage_reader=reader, planner=planner)
        assert_same(loaded, state)
        assert reader.stats.bytes < size + 64 * 1024  # the data file once, and .metadata
        counts.append(gets(front))
    plain, halves = counts
    assert halves == plain <= 8  # .metadata, the big item in 1 MiB ranges, the small ones together


# -- failures ------------------------------------------------------------------------------------------------


def test_unserializable_value_publishes_nothing(front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    state = {**model_state(), "callback": lambda: None}  # pickling a lambda fails mid-write
    with pytest.raises(CheckpointException, match="pickle|lambda"):
        dcp.save(state, storage_writer=GCSStorageWriter(f"gs://{gcs_bucket}/broken", client=front.client_config))
    assert gcs_emulator.names(gcs_bucket) == []
    assert front.open_uploads == []


def test_failed_overwrite_leaves_no_checkpoint_and_load_says_so(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    url = f"gs://{gcs_bucket}/run/latest"
    client = front.client_config
    dcp.save(
        model_state(seed=6), storage_writer=GCSStorageWriter(url, client=client, write=WriteConfig(part_size=PART))
    )
    assert "run/latest/.metadata" in gcs_emulator.names(gcs_bucket)

    front.set_faults([Fault("http_503", match=r"^PUT .*partNumber=2")])  # every attempt at the second part
    retry = replace(FAST_RETRY, deadline=1)  # a 503 is retried until the deadline
    writer = GCSStorageWriter(url, client=client, write=WriteConfig(part_size=PART), retry=retry)
    with pytest.warns(UserWarning, match="existing checkpoint"), pytest.raises(CheckpointException, match="503|part"):
        dcp.save(model_state(seed=7), storage_writer=writer)
    assert "run/latest/.metadata" not in gcs_emulator.names(gcs_bucket)  # the old one went before new data
    assert front.open_uploads == []

    front.set_faults([])
    with pytest.raises(CheckpointException, match=f"no DCP checkpoint at {url}: {url}/.metadata does not exist"):
        dcp.load(blank_like(model_state()), storage_reader=GCSStorageReader(url, client=client))


def small_files_state() -> dict[str, torch.Tensor]:
    """Four tensors: with ``single_file_per_rank=False``, four data files written in turn, each in one request."""
    return {f"t{i}": torch.full((1000,), float(i)) for i in range(4)}


def upload_of(name: str) -> str:
    """A fault's ``match`` for the upload that writes ``name`` (a single-request upload names it in its query)."""
    return rf"^POST /upload/\S+%2F{re.escape(name)}&"


def the_failure(caught: pytest.ExceptionInfo[CheckpointException]) -> BaseException:
    """The one error DCP wrapped in its ``CheckpointException`` (one process: one rank's)."""
    ((error, _),) = caught.value.failures.values()
    return error


def test_async_save_whose_last_data_file_fails_fails_its_future_and_leaves_no_checkpoint(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    url = f"gs://{gcs_bucket}/async-failed"
    front.set_faults([Fault("http_403", match=upload_of("__0_3.distcp"))])
    writer = GCSStorageWriter(url, client=front.client_config, retry=FAST_RETRY, single_file_per_rank=False)
    future = dcp.async_save(small_files_state(), storage_writer=writer)
    with pytest.raises(CheckpointException) as caught:
        future.result(timeout=60)
    error = the_failure(caught)
    assert isinstance(error, AccessDeniedError) and "__0_3.distcp" in str(error)
    assert front.faults_injected["http_403"] == 1
    names = set(gcs_emulator.names(gcs_bucket))
    assert {f"async-failed/__0_{i}.distcp" for i in range(3)} <= names  # the files before it were published
    assert not {"async-failed/__0_3.distcp", "async-failed/.metadata"} & names

    front.set_faults([])
    reader = GCSStorageReader(url, client=front.client_config)
    with pytest.raises(NotFoundError, match=f"no DCP checkpoint at {url}: "):
        reader.read_metadata()
    with pytest.raises(CheckpointException, match=f"no DCP checkpoint at {url}: "):
        dcp.load(blank_like(small_files_state()), storage_reader=GCSStorageReader(url, client=front.client_config))


@pytest.mark.parametrize("damaged", ["__0_3.distcp", ".metadata"])
def test_async_save_fails_its_future_when_gcs_stored_other_bytes_than_sent(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, damaged: str
) -> None:
    """One bit of a file's upload flipped on the way, by a server that stores it (GCS would refuse it, as the
    crc32c travels with it): the crc32c GCS reports for the object stored is compared with that of the bytes
    sent, the object is deleted, and the future fails. No ``.metadata`` is left, so nothing loads."""
    url = f"gs://{gcs_bucket}/async-damaged"
    front.set_faults([Fault("corrupt", match=upload_of(damaged), times=1)])
    writer = GCSStorageWriter(url, client=front.client_config, retry=FAST_RETRY, single_file_per_rank=False)
    future = dcp.async_save(small_files_state(), storage_writer=writer)
    with pytest.raises(CheckpointException) as caught:
        future.result(timeout=60)
    error = the_failure(caught)
    assert isinstance(error, IntegrityError) and f"{url}/{damaged}: the published object's crc32c" in str(error)
    assert front.faults_injected["corrupt"] == 1
    names = set(gcs_emulator.names(gcs_bucket))
    assert not {f"async-damaged/{damaged}", "async-damaged/.metadata"} & names
    with pytest.raises(NotFoundError, match=f"no DCP checkpoint at {url}: "):
        GCSStorageReader(url, client=front.client_config).read_metadata()


def test_async_save_completes_only_once_metadata_is_written(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    url = f"gs://{gcs_bucket}/async-order"
    returned = threading.Event()
    seen: dict[str, Any] = {}
    futures: list[Future[Any]] = []

    class Watched(GCSStorageWriter):
        def finish(self, metadata: Any, results: Any) -> None:
            returned.wait(timeout=60)  # async_save has handed out its future
            names = gcs_emulator.names(gcs_bucket)
            seen.update(done=futures[0].done(), data=sorted(names), metadata="async-order/.metadata" in names)
            super().finish(metadata, results)

    writer = Watched(url, client=front.client_config, single_file_per_rank=False)
    future = dcp.async_save(small_files_state(), storage_writer=writer)
    assert isinstance(future, Future)
    futures.append(future)
    returned.set()
    future.result(timeout=60)
    # every data file was published before .metadata was written, and the future was still pending then
    assert seen == {"done": False, "data": [f"async-order/__0_{i}.distcp" for i in range(4)], "metadata": False}
    assert "async-order/.metadata" in gcs_emulator.names(gcs_bucket)
    loaded = blank_like(small_files_state())
    dcp.load(loaded, storage_reader=GCSStorageReader(url, client=front.client_config))
    assert_same(loaded, small_files_state())


def test_failure_in_a_writer_thread_fails_the_save_after_every_thread_stopped(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    generator = torch.Generator().manual_seed(8)
    state = {name: torch.randn(1408, 1024, generator=generator) for name in "abc"}  # 5.5 MiB: one file each
    front.set_faults([Fault("http_403", match=r"__0_[12]\.distcp\?uploads")])  # two of the three files
    writer = GCSStorageWriter(
        f"gs://{gcs_bucket}/threads", client=front.client_config, write=WriteConfig(part_size=PART), thread_count=3
    )
    with pytest.raises(CheckpointException, match=r"AccessDeniedError: GCS answered 403 \(gs://\S+/__0_[12]\.distcp\)"):
        dcp.save(state, storage_writer=writer)
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("dcp-gcs-writer")]
    assert front.open_uploads == []
    names = set(gcs_emulator.names(gcs_bucket))
    assert "threads/.metadata" not in names
    assert not {"threads/__0_1.distcp", "threads/__0_2.distcp"} & names
    assert writer.thread_count == 3


def test_overwrite_false_refuses_an_existing_checkpoint(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    url = f"gs://{gcs_bucket}/keep"
    client = gcs_emulator.client_config
    dcp.save({"w": torch.ones(3)}, storage_writer=GCSStorageWriter(url, client=client, overwrite=False))
    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save({"w": torch.zeros(3)}, storage_writer=GCSStorageWriter(url, client=client, overwrite=False))
    loaded = {"w": torch.empty(3)}
    dcp.load(loaded, storage_reader=GCSStorageReader(url, client=client))
    assert torch.equal(loaded["w"], torch.ones(3))


def test_corrupted_metadata_is_detected(gcs_emulator: Emulator, gcs_bucket: str, proxy: RecordingProxy) -> None:
    url = f"gs://{gcs_bucket}/corrupt"
    dcp.save({"w": torch.ones(3)}, storage_writer=GCSStorageWriter(url, client=gcs_emulator.client_config))
    proxy.corrupt_downloads = True
    with pytest.raises(CheckpointException, match="crc32c"):
        reader = GCSStorageReader(url, client=ClientConfig(endpoint=proxy.endpoint), retry=FAST_RETRY)
        dcp.load({"w": torch.empty(3)}, storage_reader=reader)  # every read damaged: retried promptly, then refused


def test_settings_and_file_operations(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    client = gcs_emulator.client_config
    with pytest.raises(ValueError, match="ZStandard"):
        GCSStorageWriter(f"gs://{gcs_bucket}/x", client=client, write=WriteConfig(compression="zstd"))
    with pytest.raises(ValueError, match="part_size"):
        GCSStorageWriter(f"gs://{gcs_bucket}/x", client=client, write=WriteConfig(part_size=1024))
    assert GCSStorageWriter.validate_checkpoint_id("gs://bucket/ckpt/step-1")
    assert not GCSStorageReader.validate_checkpoint_id("/tmp/ckpt")

    writer = GCSStorageWriter(f"gs://{gcs_bucket}/ops/", client=client)
    fs = writer.fs
    assert writer.path == f"gs://{gcs_bucket}/ops"
    with fs.create_stream(fs.concat_path(writer.path, "a"), "wb") as stream:
        stream.write(b"hello")
    assert gcs_emulator.names(gcs_bucket) == ["ops/a"] and gcs_emulator.read(gcs_bucket, "ops/a") == b"hello"
    assert fs.exists(f"gs://{gcs_bucket}/ops/a") and not fs.exists(f"gs://{gcs_bucket}/ops/b")
    with pytest.raises(NotImplementedError):
        fs.rename(f"gs://{gcs_bucket}/ops/a", f"gs://{gcs_bucket}/ops/b")
    with fs.create_stream(f"gs://{gcs_bucket}/ops/a", "rb") as stream:
        stream.seek(-3, 2)
        assert stream.read() == b"llo" and stream.tell() == 5
    fs.rm_file(f"gs://{gcs_bucket}/ops/a")
    assert gcs_emulator.names(gcs_bucket) == []
    with pytest.raises(FileNotFoundError):
        fs.rm_file(f"gs://{gcs_bucket}/ops/a")

    # a writer and a reader pickle (for async_save in a process, or spawn): settings only
    copy = pickle.loads(pickle.dumps(GCSStorageReader(f"gs://{gcs_bucket}/ops", client=client)))
    assert copy.path == f"gs://{gcs_bucket}/ops" and copy.fs.client.config == client


# -- two ranks -----------------------------------------------------------------------------------------------

WORLD_SIZE = 2


def sharded_model() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(10)
    return {
        "encoder.weight": torch.randn(2048, 1536, generator=generator),  # 12 MiB: 6 MiB per rank, multipart
        "encoder.bias": torch.randn(1536, generator=generator),
        "head.weight": torch.randn(256, 64, generator=generator).to(torch.bfloat16),
        "odd": torch.randn(7, 5, generator=generator),  # shards of 4 and 3 rows, then 3 and 2 columns
    }


def run_rank(rank: int, port: int, url: str, client: ClientConfig, out: Path) -> None:
    """One rank's save and loads; it ends its process itself once both ranks are done.

    Once DTensor has used the device mesh, torch keeps the process group alive after
    ``destroy_process_group()`` (DTensor's redistribution caches and c10d hold it): gloo's worker and
    transport threads, and on rank 0 the TCPStore server thread, run on into interpreter exit and are torn
    down there, each rank on its own while its peer may already be gone. A C++ thread torn down in that
    state aborts the rank with "terminate called without an active exception" (seen once, under load).
    So both ranks meet at a barrier after their last collective, destroy the group, and leave through
    ``os._exit(0)``: nothing is pending then (every upload is complete, the results file is written), and
    no C++ thread is destroyed at exit. A failure still raises, and reaches the test as the rank's traceback.
    """
    warnings.filterwarnings("ignore", category=UserWarning)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        full = sharded_model()
        state: dict[str, Any] = {key: distribute_tensor(value, mesh, [Shard(0)]) for key, value in full.items()}
        state["step"] = 77
        dcp.save(state, storage_writer=GCSStorageWriter(url, client=client, write=WriteConfig(part_size=PART)))

        # the same layout: each rank reads its own shards
        same: dict[str, Any] = {
            key: distribute_tensor(torch.zeros_like(v), mesh, [Shard(0)]) for key, v in full.items()
        }
        same["step"] = 0
        reader = GCSStorageReader(url, client=client, transfer=TransferConfig(part_size=MiB))
        dcp.load(same, storage_reader=reader)
        assert same["step"] == 77
        for key, value in full.items():
            assert torch.equal(same[key].full_tensor(), value), key

        # resharded: columns instead of rows (1-D tensors replicated)
        placements = {key: [Shard(1)] if value.dim() == 2 else [Replicate()] for key, value in full.items()}
        resharded = {key: distribute_tensor(torch.zeros_like(v), mesh, placements[key]) for key, v in full.items()}
        dcp.load(resharded, storage_reader=GCSStorageReader(url, client=client))
        for key, value in full.items():
            local = resharded[key]
            assert isinstance(local, DTensor) and local.placements == tuple(placements[key]), key
            assert torch.equal(local.full_tensor(), value), key
        (out / f"rank{rank}.json").write_text(json.dumps({"same_layout_bytes": reader.stats.bytes}))
        dist.barrier()  # both ranks are past their last collective before either tears anything down
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_two_ranks_save_dtensor_shards_and_load_them_resharded(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, tmp_path: Path
) -> None:
    url = f"gs://{gcs_bucket}/dist/step-1"
    mp.start_processes(
        run_rank,
        args=(free_port(), url, front.client_config, tmp_path),
        nprocs=WORLD_SIZE,
        join=True,
        start_method="spawn",
    )
    files = data_files(gcs_emulator, gcs_bucket, "dist/step-1/")
    assert sorted(files) == ["dist/step-1/__0_0.distcp", "dist/step-1/__1_0.distcp"]
    assert front.open_uploads == []
    total = sum(files.values())
    for rank in range(WORLD_SIZE):  # each rank read about its own half, not both files
        read = json.loads((tmp_path / f"rank{rank}.json").read_text())["same_layout_bytes"]
        assert 0.4 * total < read < 0.6 * total, (rank, read, total)

    # and into plain full tensors in one process
    full = sharded_model()
    loaded: dict[str, Any] = {key: torch.zeros_like(value) for key, value in full.items()}
    loaded["step"] = 0
    dcp.load(loaded, storage_reader=GCSStorageReader(url, client=front.client_config))
    assert_same(loaded, {**full, "step": 77})


DCP_LOAD_CHILD = """
import json, sys, warnings
warnings.filterwarnings("ignore", "torch.distributed is disabled")
import torch
import torch.distributed.checkpoint as dcp
from torchdata_gcs import ClientConfig
from torchdata_gcs.dcp import GCSStorageReader

spec = json.load(sys.stdin)
client = ClientConfig(endpoint=spec["endpoint"])

def status(field):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

dcp.load({"x": torch.zeros(2)}, storage_reader=GCSStorageReader(spec["warm_up"], client=client))
targets = {f"t{i}": torch.zeros(16 * 2**20 // 4) for i in range(spec["tensors"])}  # allocated by the caller
with open("/proc/self/clear_refs", "w") as clear_refs:
    clear_refs.write("5")  # reset the peak
baseline = status("VmRSS")
dcp.load(targets, storage_reader=GCSStorageReader(spec["url"], client=client))
growth = status("VmHWM") - baseline
print(json.dumps({"growth": growth, "sums": {key: float(value.double().sum()) for key, value in targets.items()}}))
"""


def test_a_load_holds_a_bounded_read_ahead_beside_the_callers_tensors(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """DCP copies into tensors that exist already, so what is read ahead is extra: peak growth stays near
    the 64 MiB read-ahead, not the checkpoint's 256 MiB (the old 256 MiB read-ahead held about 300)."""
    client = gcs_emulator.client_config
    state = {f"t{i}": torch.full((16 * MiB // 4,), float(i)) for i in range(16)}
    dcp.save(state, storage_writer=GCSStorageWriter(f"gs://{gcs_bucket}/big", client=client))
    dcp.save({"x": torch.ones(2)}, storage_writer=GCSStorageWriter(f"gs://{gcs_bucket}/tiny", client=client))
    spec = {
        "endpoint": gcs_emulator.endpoint,
        "url": f"gs://{gcs_bucket}/big",
        "warm_up": f"gs://{gcs_bucket}/tiny",
        "tensors": 16,
    }
    child = subprocess.run(
        [sys.executable, "-c", DCP_LOAD_CHILD],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    answer = json.loads(child.stdout)
    assert answer["sums"] == {key: float(value.double().sum()) for key, value in state.items()}
    assert answer["growth"] < 192 * MiB, (
        f"peak growth {answer['growth'] / MiB:.0f} MiB loading 256 MiB into existing tensors"
    )
