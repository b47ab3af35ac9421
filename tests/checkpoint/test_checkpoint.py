"""checkpoint.save / load over real HTTP: multipart upload through GCSFront, ranged reads back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torchdata_gcs import NotFoundError, TransferConfig, WriteConfig, checkpoint
from torchdata_gcs._engines.compressed_read import TAIL
from torchdata_gcs._engines.ranges import RANGES_AT_ONCE
from torchdata_gcs._engines.upload import MIN_PART_SIZE
from torchdata_gcs.testing import Emulator, Fault, GCSFront

BUCKET = "checkpoints"
MiB = 1024 * 1024


@pytest.fixture
def front(gcs_emulator: Emulator, gcs_front: GCSFront) -> GCSFront:
    gcs_emulator.create_bucket(BUCKET)
    return gcs_front


def state_dict() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "encoder.weight": torch.randn(1024, 1536, generator=generator),  # 6 MiB
        "encoder.bias": torch.randn(1536, generator=generator),
        "step": torch.tensor(1234),
        "head.weight": torch.randn(512, 2048, generator=generator).to(torch.bfloat16),
    }


def assert_equal(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert loaded.keys() == expected.keys()
    for key, tensor in expected.items():
        assert loaded[key].dtype == tensor.dtype and torch.equal(loaded[key], tensor), key


def test_round_trip_bit_exact_in_parts_and_ranges(front: GCSFront) -> None:
    state = state_dict()
    url = f"gs://{BUCKET}/run/step-1.pt"
    generation = checkpoint.save(state, url, client=front.client_config, write=WriteConfig(part_size=MIN_PART_SIZE))
    assert generation > 0 and front.counts["upload"] >= 4  # initiate, 2+ parts, complete
    loaded = checkpoint.load(url, client=front.client_config, transfer=TransferConfig(part_size=1024 * 1024))
    assert_equal(loaded, state)
    assert front.counts["range_get"] >= 8  # read as concurrent 1 MiB ranges
    assert front.open_uploads == []


def test_load_reads_a_checkpoint_of_few_parts_as_many_ranges_at_once(gcs_emulator: Emulator) -> None:
    """GCS's throughput is per connection: a checkpoint a few ``part_size`` long still goes out as
    ``RANGES_AT_ONCE`` ranged GETs in flight together, which tile it (no byte read twice)."""
    gcs_emulator.create_bucket(BUCKET)
    state = {"w": torch.randn(4 * MiB // 4, generator=torch.Generator().manual_seed(0))}  # under one part
    url = f"gs://{BUCKET}/few-parts.pt"
    checkpoint.save(state, url, client=gcs_emulator.client_config, write=WriteConfig(strategy="compose"))
    size = len(gcs_emulator.read(BUCKET, "few-parts.pt"))
    with GCSFront(gcs_emulator.endpoint, bandwidth=1e6, record=True) as front:  # a range takes 0.25 s or more
        assert_equal(checkpoint.load(url, client=front.client_config), state)
        ranges = sorted(
            (int(first), int(last) + 1)
            for request in front.recorded
            if request.method == "GET" and "generation=" in request.target
            for value in request.header("Range")
            for first, last in [value.removeprefix("bytes=").split("-")]
        )
        peak = front.peak_connections
    probe = (size - TAIL, size)  # the last bytes, where a compressed checkpoint keeps its block table
    ranges.remove(probe)
    assert len(ranges) == RANGES_AT_ONCE and peak >= RANGES_AT_ONCE, (ranges, peak)
    assert [start for start, _ in ranges] == [0] + [end for _, end in ranges[:-1]] and ranges[-1][1] == size


def test_failed_save_publishes_nothing(front: GCSFront, gcs_emulator: Emulator) -> None:
    state = {**state_dict(), "not a tensor": lambda: None}  # torch.save cannot pickle a lambda
    with pytest.raises(Exception, match="pickle|lambda"):
        checkpoint.save(
            state, f"gs://{BUCKET}/broken.pt", client=front.client_config, write=WriteConfig(part_size=MIN_PART_SIZE)
        )
    assert "broken.pt" not in gcs_emulator.names(BUCKET)
    assert front.open_uploads == []


def test_load_survives_cut_ranges_and_reports_missing(front: GCSFront) -> None:
    state = state_dict()
    url = f"gs://{BUCKET}/cut.pt"
    checkpoint.save(state, url, client=front.client_config)
    front.set_faults([Fault("truncate", match="range_get", times=3)])
    loaded = checkpoint.load(url, client=front.client_config, transfer=TransferConfig(part_size=2 * 1024 * 1024))
    assert_equal(loaded, state)
    assert front.faults_injected["truncate"] == 3
    with pytest.raises(NotFoundError):
        checkpoint.load(f"gs://{BUCKET}/missing.pt", client=front.client_config)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_load_reads_again_after_a_byte_flipped_on_the_way(front: GCSFront, compression: str | None) -> None:
    state = state_dict()
    url = f"gs://{BUCKET}/flipped-{compression}.pt"
    checkpoint.save(state, url, client=front.client_config, write=WriteConfig(compression=compression))
    front.set_faults([Fault("corrupt", match="range_get", times=1)])
    loaded = checkpoint.load(url, client=front.client_config, transfer=TransferConfig(part_size=2 * 1024 * 1024))
    assert_equal(loaded, state)
    assert front.faults_injected["corrupt"] == 1


def test_the_loose_writer_keywords_still_work_with_a_deprecation_warning(front: GCSFront) -> None:
    url = f"gs://{BUCKET}/legacy.pt"
    with pytest.warns(DeprecationWarning, match=r"pass write=WriteConfig\(part_size=\.\.\., strategy=\.\.\.\)"):
        checkpoint.save(
            {"w": torch.ones(3)}, url, client=front.client_config, part_size=MIN_PART_SIZE, strategy="compose"
        )
    assert torch.equal(checkpoint.load(url, client=front.client_config)["w"], torch.ones(3))
    with pytest.raises(TypeError, match="not both"):
        checkpoint.save({}, url, client=front.client_config, write=WriteConfig(), part_size=MIN_PART_SIZE)


def test_default_settings_work_on_the_bare_emulator(caplog: pytest.LogCaptureFixture) -> None:
    """fake-gcs-server has no XML API multipart upload: a multipart save notices once and composes instead."""
    state = {"weights": torch.randn(1024, 1536)}  # 6 MiB: more than one part
    write = WriteConfig(part_size=MIN_PART_SIZE)
    with Emulator() as emulator, caplog.at_level("WARNING"):  # an endpoint of its own: asked anew
        emulator.create_bucket("bare")
        for _ in range(2):
            checkpoint.save(state, "gs://bare/bare.pt", client=emulator.client_config, write=write)
        loaded = checkpoint.load("gs://bare/bare.pt", client=emulator.client_config)
        names = emulator.names("bare")
    assert torch.equal(loaded["weights"], state["weights"]) and names == ["bare.pt"]
    notes = [record.getMessage() for record in caplog.records if "multipart" in record.getMessage()]
    assert len(notes) == 1 and "strategy='compose'" in notes[0]


LOAD_CHILD = textwrap.dedent(
    """
    import json, sys
    from torchdata_gcs import ClientConfig, checkpoint

    spec = json.load(sys.stdin)
    client = ClientConfig(endpoint=spec["endpoint"])

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

    checkpoint.load(spec["warm_up"], client=client)  # the I/O thread, the session, the imports
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset the peak
    baseline = status("VmRSS")
    state = checkpoint.load(spec["url"], client=client)
    growth = status("VmHWM") - baseline
    print(json.dumps({"growth": growth, "sums": {key: float(value.double().sum()) for key, value in state.items()}}))
    """
)


def test_load_holds_the_checkpoint_once(front: GCSFront, gcs_emulator: Emulator) -> None:
    """Read into an anonymous file that torch.load maps: peak memory near the checkpoint's size, where
    reading into a buffer and letting torch.load copy out of it took twice that."""
    state = {f"layer{i}": torch.full((4 * MiB // 4,), float(i)) for i in range(24)}  # 96 MiB
    client = gcs_emulator.client_config
    checkpoint.save(state, f"gs://{BUCKET}/big.pt", client=client)
    checkpoint.save({"x": torch.ones(2)}, f"gs://{BUCKET}/tiny.pt", client=client)
    spec = {"endpoint": gcs_emulator.endpoint, "url": f"gs://{BUCKET}/big.pt", "warm_up": f"gs://{BUCKET}/tiny.pt"}
    child = subprocess.run(
        [sys.executable, "-c", LOAD_CHILD],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    answer = json.loads(child.stdout)
    assert answer["sums"] == {key: float(value.double().sum()) for key, value in state.items()}
    assert answer["growth"] < 1.3 * 96 * MiB, f"peak growth {answer['growth'] / MiB:.0f} MiB for a 96 MiB checkpoint"


def test_load_without_anonymous_files_reads_into_a_buffer(front: GCSFront, monkeypatch: pytest.MonkeyPatch) -> None:
    state = state_dict()
    url = f"gs://{BUCKET}/portable.pt"
    checkpoint.save(state, url, client=front.client_config)
    monkeypatch.delattr(os, "memfd_create")  # as on macOS and Windows
    assert_equal(checkpoint.load(url, client=front.client_config), state)


SAVE_CHILD = textwrap.dedent(
    """
    import json, resource, sys, torch
    from torchdata_gcs import ClientConfig, WriteConfig, checkpoint

    spec = json.load(sys.stdin)
    client = ClientConfig(endpoint=spec["endpoint"])
    write = WriteConfig(part_size=spec["part"], max_parts_in_flight=spec["in_flight"], strategy=spec["strategy"])

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

    state = {f"t{i}": torch.full((16 * 2**20 // 4,), float(i)) for i in range(spec["tensors"])}
    checkpoint.save({"x": torch.ones(2)}, spec["url"] + ".warm-up", client=client, write=write)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset the peak
    baseline, faults = status("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    checkpoint.save(state, spec["url"], client=client, write=write)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(json.dumps({"growth": status("VmHWM") - baseline, "faults": faults}))
    """
)


@pytest.mark.parametrize("strategy", ["multipart", "compose"])
def test_save_holds_the_parts_in_flight_and_one_being_filled(
    front: GCSFront, gcs_emulator: Emulator, strategy: str
) -> None:
    """No copy of a part's body is made to send it, nor of a tensor to write it: peak memory stays near
    ``part_size x (max_parts_in_flight + 1)`` (40 MiB here) while 192 MiB of tensors are saved. Those buffers
    are filled again and again: the pages of a new one are each faulted in at first touch, as costly as the copy
    (with transparent huge pages always on, a fault maps 2 MiB, and this count says little)."""
    part, in_flight = 8 * MiB, 4
    spec = {"endpoint": front.endpoint, "url": f"gs://{BUCKET}/bounded-{strategy}.pt", "strategy": strategy,
            "part": part, "in_flight": in_flight, "tensors": 12}  # fmt: skip
    child = subprocess.run(
        [sys.executable, "-c", SAVE_CHILD],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    answer = json.loads(child.stdout)
    growth, faulted = answer["growth"], answer["faults"] * os.sysconf("SC_PAGE_SIZE")
    assert growth < part * (in_flight + 1) + 32 * MiB, f"peak growth {growth / MiB:.0f} MiB"
    assert faulted < part * (in_flight + 1) + 32 * MiB, f"{faulted / MiB:.0f} MiB of pages faulted in"
    assert len(gcs_emulator.read(BUCKET, f"bounded-{strategy}.pt")) > 192 * MiB
