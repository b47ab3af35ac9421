"""torchdata_gcs.safetensors over real HTTP: files written by us and by safetensors itself, cut and damaged
ranges, memory growth, sharded checkpoints and bad input."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest
import safetensors.torch
import torch

from torchdata_gcs import IntegrityError, NotFoundError, RetryConfig, TransferConfig, WriteConfig
from torchdata_gcs import safetensors as ours
from torchdata_gcs._engines.upload import MIN_PART_SIZE
from torchdata_gcs.testing import Emulator, Fault, GCSFront

BUCKET = "weights"
MiB = 1024 * 1024
FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


@pytest.fixture
def front(gcs_emulator: Emulator, gcs_front: GCSFront) -> GCSFront:
    gcs_emulator.create_bucket(BUCKET)
    return gcs_front


def many_dtypes() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "big.f32": torch.randn(1024, 1536, generator=generator),  # 6 MiB: several parts and ranges
        "bf16": torch.randn(300, 7, generator=generator).to(torch.bfloat16),
        "f16": torch.randn(5, 3, generator=generator).to(torch.float16),
        "f64": torch.randn(9, generator=generator).double(),
        "i64": torch.randint(-(2**62), 2**62, (11,), generator=generator),
        "i32": torch.randint(-(2**31), 2**31 - 1, (2, 3), dtype=torch.int32, generator=generator),
        "i8": torch.randint(-128, 127, (13,), dtype=torch.int8, generator=generator),
        "u8": torch.randint(0, 255, (17,), dtype=torch.uint8, generator=generator),
        "bool": torch.rand(19, generator=generator) > 0.5,
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(3.25),
        "transposed": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous: written in C order
    }


def assert_equal(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert loaded.keys() == expected.keys()
    for key, tensor in expected.items():
        assert loaded[key].dtype == tensor.dtype and loaded[key].shape == tensor.shape, key
        assert torch.equal(loaded[key].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), key


def test_round_trip_of_many_dtypes_is_bit_exact_and_safetensors_reads_it(
    gcs_emulator: Emulator, front: GCSFront
) -> None:
    tensors = many_dtypes()
    url = f"gs://{BUCKET}/model.safetensors"
    ours.save_file(
        tensors, url, {"format": "pt"}, client=front.client_config, write=WriteConfig(part_size=MIN_PART_SIZE)
    )
    assert front.counts["upload"] + front.counts["compose"] > 1  # written in parts
    loaded = ours.load_file(url, client=front.client_config, transfer=TransferConfig(part_size=MiB))
    assert_equal(loaded, tensors)
    elsewhere = ours.load_file(url, "meta", client=front.client_config)  # another device: loaded, then moved
    assert {k: (t.device.type, t.dtype, t.shape) for k, t in elsewhere.items()} == {
        k: ("meta", t.dtype, t.shape) for k, t in tensors.items()
    }
    raw = gcs_emulator.read(BUCKET, "model.safetensors")
    assert_equal(safetensors.torch.load(raw), tensors)
    assert_equal(ours.load(raw), tensors)
    assert raw == ours.save(tensors, {"format": "pt"})
    (length,) = struct.unpack("<Q", raw[:8])
    assert json.loads(raw[8 : 8 + length])["__metadata__"] == {"format": "pt"}


def test_reads_what_safetensors_writes_and_safetensors_reads_what_we_save(
    gcs_emulator: Emulator, front: GCSFront
) -> None:
    tensors = many_dtypes()
    theirs = safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()}, metadata={"a": "b"})
    gcs_emulator.upload(BUCKET, "theirs.safetensors", theirs)
    assert_equal(ours.load_file(f"gs://{BUCKET}/theirs.safetensors", client=front.client_config), tensors)
    assert_equal(ours.load(theirs), tensors)
    assert_equal(safetensors.torch.load(ours.save(tensors)), tensors)


def test_a_tensor_not_aligned_to_its_dtype_gets_its_own_copy(gcs_emulator: Emulator, front: GCSFront) -> None:
    header = json.dumps({
        "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]},
    }).encode()  # fmt: skip
    data = struct.pack("<Q", len(header)) + header + b"\x07" + struct.pack("<2f", 1.5, -2.0)
    gcs_emulator.upload(BUCKET, "odd.safetensors", data)
    loaded = ours.load_file(f"gs://{BUCKET}/odd.safetensors", client=front.client_config)
    assert loaded["a"].tolist() == [7] and loaded["b"].tolist() == [1.5, -2.0]
    assert_equal(ours.load(data), safetensors.torch.load(data))


def test_a_header_longer_than_the_first_read_is_read_on(gcs_emulator: Emulator, front: GCSFront) -> None:
    tensors = {f"layer.{i:05d}.weight.with.a.long.name": torch.full((2,), float(i)) for i in range(20_000)}
    data = ours.save(tensors)
    assert struct.unpack("<Q", data[:8])[0] > 1 << 20
    gcs_emulator.upload(BUCKET, "long-header.safetensors", data)
    assert_equal(ours.load_file(f"gs://{BUCKET}/long-header.safetensors", client=front.client_config), tensors)


@pytest.mark.parametrize("kind", ["truncate", "reset", "http_503"])
def test_a_failed_range_is_read_again_alone(gcs_emulator: Emulator, kind: str) -> None:
    gcs_emulator.create_bucket(BUCKET)
    generator = torch.Generator().manual_seed(1)
    tensors = {"w": torch.randn(2 * MiB, generator=generator)}  # 8 MiB: the header read and 8 data ranges
    url = f"gs://{BUCKET}/cut.safetensors"
    transfer = TransferConfig(part_size=MiB)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        ours.save_file(tensors, url, client=front.client_config)
        assert_equal(ours.load_file(url, client=front.client_config, transfer=transfer), tensors)
        clean = ranges_asked(front)
        front.set_faults([Fault(kind, match="range_get", times=1)])
        assert_equal(ours.load_file(url, client=front.client_config, transfer=transfer), tensors)
        assert front.faults_injected[kind] == 1
        again = ranges_asked(front)[len(clean) :]  # the recording keeps the first load's requests
    assert len(clean) == 9 and len(again) == 10  # only the failed range was asked again, not the whole file
    assert set(clean) <= set(again)
    if kind == "truncate":  # resumed from the byte it reached: a Range the clean load never asked for
        assert len(set(again) - set(clean)) == 1


def ranges_asked(front: GCSFront) -> list[str]:
    return [value for request in front.recorded for value in request.header("Range")]


def test_damage_on_the_way_is_read_again_and_never_handed_out(front: GCSFront) -> None:
    tensors = {"w": torch.arange(2 * MiB, dtype=torch.float32)}
    url = f"gs://{BUCKET}/damaged.safetensors"
    ours.save_file(tensors, url, client=front.client_config)
    transfer = TransferConfig(part_size=MiB)
    front.set_faults([Fault("corrupt", match="range_get", times=1)])
    assert_equal(ours.load_file(url, client=front.client_config, transfer=transfer), tensors)
    assert front.faults_injected["corrupt"] == 1
    front.set_faults([Fault("corrupt", match="range_get")])  # every read damaged: nothing comes back
    with pytest.raises(IntegrityError, match="crc32c"):
        ours.load_file(url, client=front.client_config, transfer=transfer, retry=FAST_RETRY)


def test_missing_objects_and_bad_headers_raise_typed_errors_naming_the_url(
    gcs_emulator: Emulator, front: GCSFront
) -> None:
    with pytest.raises(NotFoundError):
        ours.load_file(f"gs://{BUCKET}/missing.safetensors", client=front.client_config)
    good = ours.save({"w": torch.ones(4)})
    length = struct.unpack("<Q", good[:8])[0]
    bad = {
        "short": b"\x01\x02",
        "too-long": struct.pack("<Q", 10**12) + b"{}",
        "not-json": struct.pack("<Q", 4) + b"{no}",
        "wrong-size": good.replace(b'"shape":[4]', b'"shape":[5]'),
        "gap": good[: 8 + length] + good[8 + length :] + b"\0" * 4,
        "dtype": good.replace(b'"F32"', b'"X32"'),
    }
    for name, data in bad.items():
        gcs_emulator.upload(BUCKET, f"bad/{name}", data)
        with pytest.raises(IntegrityError, match=f"gs://{BUCKET}/bad/{name}.*not a safetensors file"):
            ours.load_file(f"gs://{BUCKET}/bad/{name}", client=front.client_config)
        with pytest.raises(IntegrityError, match="not a safetensors file"):
            ours.load(data)
    gcs_emulator.upload(BUCKET, "bad/model.safetensors.index.json", b'{"weights": {}}')
    with pytest.raises(IntegrityError, match="not a safetensors index"):
        ours.load_sharded(f"gs://{BUCKET}/bad/model.safetensors.index.json", client=front.client_config)


def test_a_failed_save_publishes_nothing(front: GCSFront) -> None:
    url = f"gs://{BUCKET}/never.safetensors"
    with pytest.raises(ValueError, match="complex64"):
        ours.save_file({"a": torch.ones(2), "z": torch.ones(2, dtype=torch.complex64)}, url, client=front.client_config)
    with pytest.raises(ValueError, match="without compression"):
        ours.save_file({"a": torch.ones(2)}, url, client=front.client_config, write=WriteConfig(compression="zstd"))
    with pytest.raises(NotFoundError):
        ours.load_file(url, client=front.client_config)


def test_sharded_checkpoint_round_trip(gcs_emulator: Emulator, front: GCSFront) -> None:
    tensors = {f"layer{i}.weight": torch.full((256, 256), float(i)) for i in range(5)}  # 256 KiB each
    index = ours.save_sharded(tensors, f"gs://{BUCKET}/sharded/", max_shard_size=600 * 1024, client=front.client_config)
    assert index == f"gs://{BUCKET}/sharded/model.safetensors.index.json"
    written = json.loads(gcs_emulator.read(BUCKET, "sharded/model.safetensors.index.json"))
    assert written["metadata"]["total_size"] == 5 * 256 * 1024
    assert sorted(set(written["weight_map"].values())) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    first = safetensors.torch.load(gcs_emulator.read(BUCKET, "sharded/model-00001-of-00003.safetensors"))
    assert sorted(first) == ["layer0.weight", "layer1.weight"]
    front.reset_counts()
    assert_equal(ours.load_sharded(index, client=front.client_config), tensors)
    assert front.counts["range_get"] >= 3


MEMORY_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    from torchdata_gcs import ClientConfig, WriteConfig, safetensors

    spec = json.load(sys.stdin)
    client = ClientConfig(endpoint=spec["endpoint"], anonymous=True)
    write = WriteConfig(part_size=spec["part"], max_parts_in_flight=2)

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

    def peak_growth(work):
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # reset the peak
        baseline = status("VmRSS")
        result = work()
        return status("VmHWM") - baseline, result

    safetensors.save_file({"w": torch.ones(2)}, spec["url"], client=client, write=write)  # the I/O thread, imports
    safetensors.load_file(spec["url"], client=client)
    tensors = {f"t{i}": torch.full((2 * 1024 * 1024,), float(i)) for i in range(8)}  # 64 MiB
    saving, _ = peak_growth(lambda: safetensors.save_file(tensors, spec["url"], client=client, write=write))
    loading, loaded = peak_growth(lambda: safetensors.load_file(spec["url"], client=client))
    same = all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())
    print(json.dumps({"saving": saving, "loading": loading, "same": same}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's peak RSS reset")
def test_memory_saving_holds_the_parts_in_flight_and_loading_about_the_file(front: GCSFront) -> None:
    spec = {"endpoint": front.endpoint, "url": f"gs://{BUCKET}/memory.safetensors", "part": MIN_PART_SIZE}
    child = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout)
    assert result["same"]
    # saving: the parts in flight (3 x 5 MiB) and the writer's buffers; a copy of the state would add 64 MiB
    assert result["saving"] < 40 * MiB, f"peak RSS grew {result['saving'] / MiB:.0f} MiB saving 64 MiB"
    assert result["loading"] < 1.5 * 64 * MiB, f"peak RSS grew {result['loading'] / MiB:.0f} MiB loading 64 MiB"
