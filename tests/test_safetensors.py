"""torchdata_gcs.safetensors over real HTTP: files written by us and by safetensors itself, cut and damaged
ranges, memory growth, sharded checkpoints and bad input."""

from __future__ import annotations

import json
import os
import struct
import textwrap
import threading
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tests.children import run_child
from torchdata_gcs import IntegrityError, LocalCache, NotFoundError, RetryConfig, TransferConfig, WriteConfig
from torchdata_gcs import safetensors as ours
from torchdata_gcs._engines.tensor_files import MAX_HEADER, MAX_INDEX
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


def test_every_dtype_safetensors_torch_saves_round_trips(gcs_emulator: Emulator, front: GCSFront) -> None:
    tensors = {
        name: torch.arange(6, dtype=torch.float32).reshape(2, 3).to(dtype)
        for name, dtype in safetensors.torch._TYPES.items()  # its own table of names
    }
    theirs = safetensors.torch.save(tensors)
    gcs_emulator.upload(BUCKET, "all-dtypes.safetensors", theirs)
    assert_equal(ours.load_file(f"gs://{BUCKET}/all-dtypes.safetensors", client=front.client_config), tensors)
    ours.save_file(tensors, f"gs://{BUCKET}/all-dtypes-ours.safetensors", client=front.client_config)
    assert_equal(safetensors.torch.load(gcs_emulator.read(BUCKET, "all-dtypes-ours.safetensors")), tensors)


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


def test_a_load_asks_no_metadata_its_first_answer_names_the_version(front: GCSFront) -> None:
    tensors = {"w": torch.arange(3 * MiB // 4 - 256, dtype=torch.float32)}  # < 3 MiB: the header read, 2 ranges
    url = f"gs://{BUCKET}/counted.safetensors"
    ours.save_file(tensors, url, client=front.client_config)
    front.reset_counts()
    assert_equal(ours.load_file(url, client=front.client_config, transfer=TransferConfig(part_size=MiB)), tensors)
    assert dict(front.counts) == {"range_get": 3}  # generation, size and crc32c came with the header's answer


@pytest.mark.parametrize("headers", ["all", "only_promised"])
def test_a_file_rewritten_between_header_and_ranges_is_never_mixed(gcs_emulator: Emulator, headers: str) -> None:
    gcs_emulator.create_bucket(BUCKET)
    old, new = ({"w": torch.full((MiB // 2,), value)} for value in (1.0, 2.0))  # 2 MiB: a header read, 1 range
    url = f"gs://{BUCKET}/rewritten.safetensors"
    gcs_emulator.upload(BUCKET, "rewritten.safetensors", ours.save(old))
    # The data range (pinned: it names a generation) stalls; the object is rewritten while it waits.
    stall = Fault("stall", match=r"[?&]generation=", times=1, stall_seconds=1.0)
    with GCSFront(gcs_emulator.endpoint, faults=[stall], only_promised_headers=headers != "all") as front:
        config, transfer = front.client_config, TransferConfig(part_size=MiB)
        rewriting = threading.Thread(target=rewrite_after_first_range, args=(front, gcs_emulator, ours.save(new)))
        rewriting.start()
        try:
            with pytest.raises(NotFoundError, match="generation .* no longer exists"):
                ours.load_file(url, client=config, transfer=transfer, retry=FAST_RETRY)
        finally:
            rewriting.join()
        assert front.faults_injected["stall"] == 1
        assert front.counts["metadata"] == (headers != "all")  # the answers named no generation or crc32c
        assert_equal(ours.load_file(url, client=config, transfer=transfer), new)


def rewrite_after_first_range(front: GCSFront, emulator: Emulator, data: bytes) -> None:
    deadline = time.monotonic() + 10
    while not front.faults_injected["stall"] and time.monotonic() < deadline:
        time.sleep(0.005)
    emulator.upload(BUCKET, "rewritten.safetensors", data)


def test_crc32c_is_checked_when_the_answers_name_none(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    tensors = {"w": torch.arange(2 * MiB, dtype=torch.float32)}
    gcs_emulator.upload(BUCKET, "unnamed.safetensors", ours.save(tensors))
    url, transfer = f"gs://{BUCKET}/unnamed.safetensors", TransferConfig(part_size=MiB)
    with GCSFront(gcs_emulator.endpoint, only_promised_headers=True) as front:
        assert_equal(ours.load_file(url, client=front.client_config, transfer=transfer), tensors)
        assert front.counts["metadata"] == 1  # GCS promises neither x-goog-hash nor x-goog-generation
        front.set_faults([Fault("corrupt", match="range_get")])
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
        "empty": b"",
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
    with pytest.raises(ValueError, match="complex128"):
        ours.save_file(
            {"a": torch.ones(2), "z": torch.ones(2, dtype=torch.complex128)}, url, client=front.client_config
        )
    with pytest.raises(ValueError, match="without compression"):
        ours.save_file({"a": torch.ones(2)}, url, client=front.client_config, write=WriteConfig(compression="zstd"))
    with pytest.raises(NotFoundError):
        ours.load_file(url, client=front.client_config)


def test_what_safetensors_refuses_to_save_is_refused_alike_and_nothing_is_written(front: GCSFront) -> None:
    url, config = f"gs://{BUCKET}/refused.safetensors", front.client_config
    cases = [
        ({"w": torch.ones(2)}, {"epoch": 3}, TypeError),  # safetensors could not read such a header back
        ({"w": torch.ones(2)}, {1: "x"}, TypeError),
        ({1: torch.ones(2)}, None, TypeError),
        ({"w": [1.0]}, None, ValueError),
        ([torch.ones(2)], None, ValueError),
        ({"w": torch.eye(3).to_sparse()}, None, ValueError),
    ]
    for tensors, metadata, error in cases:
        with pytest.raises(error):
            safetensors.torch.save(tensors, metadata=metadata)
        with pytest.raises(error):
            ours.save(tensors, metadata)
        with pytest.raises(error):
            ours.save_file(tensors, url, metadata, client=config)
        with pytest.raises(error):
            ours.save_sharded(tensors, f"gs://{BUCKET}/refused/", metadata=metadata, client=config)
    with pytest.raises(NotFoundError):
        ours.load_file(url, client=config)
    with pytest.raises(NotFoundError):
        ours.load_file(f"gs://{BUCKET}/refused/model-00001-of-00001.safetensors", client=config)
    assert not front.open_uploads  # and no upload was left begun


def test_a_device_torch_cannot_use_fails_before_anything_is_read(gcs_emulator: Emulator, front: GCSFront) -> None:
    url = f"gs://{BUCKET}/device.safetensors"
    gcs_emulator.upload(BUCKET, "device.safetensors", ours.save({"w": torch.ones(4)}))
    index = ours.save_sharded({"w": torch.ones(4)}, f"gs://{BUCKET}/device/", client=front.client_config)
    front.reset_counts()
    for load in (lambda: ours.load_file(url, "cuda:99", client=front.client_config),
                 lambda: ours.load_sharded(index, "cuda:99", client=front.client_config)):  # fmt: skip
        with pytest.raises((RuntimeError, AssertionError)):  # torch's own: no CUDA, or no such GPU
            load()
    assert not front.counts


def test_a_header_longer_than_the_format_allows_is_refused_before_it_is_read(
    gcs_emulator: Emulator, front: GCSFront
) -> None:
    too_long = struct.pack("<Q", MAX_HEADER + 1) + b" " * (MAX_HEADER + 1)
    with pytest.raises(safetensors.SafetensorError, match="header too large"):
        safetensors.torch.load(too_long)
    with pytest.raises(IntegrityError, match=f"a {MAX_HEADER + 1}-byte header .* at most {MAX_HEADER} bytes"):
        ours.load(too_long)
    del too_long
    # The object need not hold the header for the length alone to be refused, with no range asked.
    gcs_emulator.upload(BUCKET, "long-header.safetensors", struct.pack("<Q", MAX_HEADER + 1) + b" " * 64)
    front.reset_counts()
    with pytest.raises(IntegrityError, match=f"at most {MAX_HEADER} bytes"):
        ours.load_file(f"gs://{BUCKET}/long-header.safetensors", client=front.client_config)
    assert front.counts["range_get"] == 1


def test_an_index_given_to_load_file_is_named_as_one(front: GCSFront) -> None:
    index = ours.save_sharded({"w": torch.ones(4)}, f"gs://{BUCKET}/indexed/", client=front.client_config)
    with pytest.raises(IntegrityError, match="not a safetensors file.*starts like JSON.*load_sharded"):
        ours.load_file(index, client=front.client_config)


def test_a_safetensors_file_given_to_load_sharded_is_refused_unread(gcs_emulator: Emulator, front: GCSFront) -> None:
    big = ours.save({"w": torch.zeros(MAX_INDEX // 4 + 1, dtype=torch.float32)})
    gcs_emulator.upload(BUCKET, "big.safetensors", big)
    gcs_emulator.upload(BUCKET, "small.safetensors", ours.save({"w": torch.ones(4)}))
    front.reset_counts()
    with pytest.raises(IntegrityError, match=r"not a safetensors index: \d+ bytes.*load_file"):
        ours.load_sharded(f"gs://{BUCKET}/big.safetensors", client=front.client_config)
    assert front.counts["metadata"] == 1 and set(front.counts) == {"metadata"}  # its bytes were never asked for
    with pytest.raises(IntegrityError, match="not a safetensors index.*load_file") as caught:
        ours.load_sharded(f"gs://{BUCKET}/small.safetensors", client=front.client_config)
    assert len(str(caught.value)) < 400  # the message quotes none of the file's bytes


def test_max_shard_size_takes_hugging_face_sizes(gcs_emulator: Emulator, front: GCSFront) -> None:
    state, config = {"a": torch.ones(256), "b": torch.ones(256), "c": torch.ones(256)}, front.client_config
    for size, shards in (("2KB", 3), ("2KiB", 2), ("3kb", 2), ("3KiB", 1), (2048, 2)):  # 1024-byte tensors
        index = ours.save_sharded(state, f"gs://{BUCKET}/sizes/{size}/", size, client=config)
        assert_equal(ours.load_sharded(index, client=config), state)
        assert index.endswith(f"/{size}/{ours.INDEX_NAME}")
        assert (
            len(
                set(json.loads(gcs_emulator.read(BUCKET, index.removeprefix(f"gs://{BUCKET}/")))["weight_map"].values())
            )
            == shards
        ), size
    for bad in ("5 GBs", "GB", "0GB", -1, 0, True, 2.5):
        with pytest.raises(ValueError, match="max_shard_size"):
            ours.save_sharded(state, f"gs://{BUCKET}/sizes/bad/", bad, client=config)  # type: ignore[arg-type]


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


def test_load_files_reads_a_folder_by_its_index_or_by_its_files(gcs_emulator: Emulator, front: GCSFront) -> None:
    tensors = {f"layer{i}.weight": torch.full((64, 64), float(i)) for i in range(4)}
    ours.save_sharded(tensors, f"gs://{BUCKET}/by-index/", max_shard_size=40_000, client=front.client_config)
    for url in (f"gs://{BUCKET}/by-index", f"gs://{BUCKET}/by-index/", f"gs://{BUCKET}/by-index/{ours.INDEX_NAME}"):
        assert_equal(ours.load_files(url, client=front.client_config), tensors)
    for number in range(2):  # no index: every .safetensors file directly in the folder, nothing deeper
        part = {name: tensor for name, tensor in tensors.items() if int(name[5]) % 2 == number}
        gcs_emulator.upload(BUCKET, f"plain/part{number}.safetensors", ours.save(part))
    gcs_emulator.upload(BUCKET, "plain/README.md", b"not weights")
    gcs_emulator.upload(BUCKET, "plain/old/part9.safetensors", ours.save({"stale": torch.ones(1)}))
    assert_equal(ours.load_files(f"gs://{BUCKET}/plain/", client=front.client_config), tensors)


def test_load_files_refuses_a_model_whose_files_and_index_disagree(gcs_emulator: Emulator, front: GCSFront) -> None:
    index = {"weight_map": {"a": "one.safetensors", "b": "one.safetensors", "c": "two.safetensors"}}
    gcs_emulator.upload(BUCKET, f"odd/{ours.INDEX_NAME}", json.dumps(index).encode())
    gcs_emulator.upload(BUCKET, "odd/one.safetensors", ours.save({"a": torch.ones(1), "b": torch.ones(1)}))
    gcs_emulator.upload(BUCKET, "odd/two.safetensors", ours.save({"c": torch.ones(1), "d": torch.ones(1)}))
    with pytest.raises(
        IntegrityError, match=r"odd/two.safetensors: holds tensor 'd', where the index .* names no such"
    ):
        ours.load_files(f"gs://{BUCKET}/odd/", client=front.client_config)
    gcs_emulator.upload(BUCKET, "odd/two.safetensors", ours.save({"a": torch.ones(1)}))
    with pytest.raises(IntegrityError, match=r"tensor 'a' is also in another file"):
        ours.load_files(f"gs://{BUCKET}/odd/", client=front.client_config)
    gcs_emulator.upload(BUCKET, "odd/two.safetensors", ours.save({"x": torch.ones(1)}))
    with pytest.raises(IntegrityError, match=r"holds tensor 'x', where the index"):
        ours.load_files(f"gs://{BUCKET}/odd/", client=front.client_config)
    gcs_emulator.upload(BUCKET, "odd/two.safetensors", ours.save({}))
    with pytest.raises(IntegrityError, match=r"odd/: tensor 'c' is not in two.safetensors, where the index puts it"):
        ours.load_files(f"gs://{BUCKET}/odd/", client=front.client_config)
    gcs_emulator.delete(BUCKET, "odd/two.safetensors")
    with pytest.raises(NotFoundError, match="odd/two.safetensors"):
        ours.load_files(f"gs://{BUCKET}/odd/", client=front.client_config)


def test_load_files_of_a_folder_with_no_weights_is_an_error(front: GCSFront) -> None:
    with pytest.raises(NotFoundError, match=r"gs://weights/typo/: no safetensors files and no model.safetensors"):
        ours.load_files(f"gs://{BUCKET}/typo", client=front.client_config)


def test_process_group_is_checked_before_anything_is_read(front: GCSFront, tmp_path: Path) -> None:
    url = f"gs://{BUCKET}/checked.safetensors"
    ours.save_file({"w": torch.ones(3)}, url, client=front.client_config)
    front.reset_counts()
    with pytest.raises(TypeError, match="process_group: expected a torch.distributed ProcessGroup, got int"):
        ours.load_file(url, process_group=0, client=front.client_config)
    with pytest.raises(ValueError, match="give process_group or cache, not both"):
        ours.load_file(url, process_group=object(), cache=LocalCache(tmp_path, limit=2**20), client=front.client_config)
    assert sum(front.counts.values()) == 0


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
    result = run_child(MEMORY_CHILD, spec)
    assert result["same"]
    # saving: the parts in flight (3 x 5 MiB) and the writer's buffers; a copy of the state would add 64 MiB
    assert result["saving"] < 40 * MiB, f"peak RSS grew {result['saving'] / MiB:.0f} MiB saving 64 MiB"
    assert result["loading"] < 1.5 * 64 * MiB, f"peak RSS grew {result['loading'] / MiB:.0f} MiB loading 64 MiB"
