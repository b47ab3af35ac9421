"""zstd checkpoints: bit-exact round trips, byte grouping where it pays, detection on read, damage caught."""

from __future__ import annotations

import functools
import gc
import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import IntegrityError, RetryConfig, TransferConfig, WriteConfig, Zstd, checkpoint
from torchdata_gcs._engines.compressing import CompressingWriter
from torchdata_gcs._engines.compression import (
    BLOCK_HEADER,
    INDEX_FRAME,
    INDEX_MAGIC,
    MAGIC,
    blocks,
    decompress,
    read_block_table,
)
from torchdata_gcs._engines.ranges import RANGES_AT_ONCE
from torchdata_gcs.testing import Emulator, Fault, GCSFront

KiB = 1024


def trained_like_state() -> dict[str, torch.Tensor]:
    """Weights of a small network after a few hundred SGD steps on a real regression task (a fresh copy of
    tensors trained once per session: the training is deterministic and the slowest part of these tests)."""
    return {key: value.clone() for key, value in _trained().items()}


@functools.cache
def _trained() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(512, 64, generator=generator)
    targets = torch.sin(inputs.cumsum(dim=1))
    for _ in range(200):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    state["half"] = state["0.weight"].to(torch.bfloat16)
    state["step"] = torch.tensor(200)
    return state


def assert_equal(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert loaded.keys() == expected.keys()
    for key, tensor in expected.items():
        assert loaded[key].dtype == tensor.dtype and torch.equal(loaded[key], tensor), key


PROMPT = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.02)
"""Retries without the default's growing waits, where every attempt fails the same way."""


def widths(data: bytes) -> list[int]:
    return [width for _, _, _, width in blocks(memoryview(data), "test")]


def test_round_trip_is_bit_exact_and_detected_on_read(gcs_bucket: str, gcs_emulator: Emulator) -> None:
    state = trained_like_state()
    client = gcs_emulator.client_config
    plain, packed = f"gs://{gcs_bucket}/plain.pt", f"gs://{gcs_bucket}/packed.pt"
    checkpoint.save(state, plain, client=client)
    checkpoint.save(
        state,
        packed,
        client=client,
        write=WriteConfig(compression=Zstd(level=3, block_size=64 * KiB), strategy="compose"),
    )
    stored = gcs_emulator.read(gcs_bucket, "packed.pt")
    assert stored.startswith(INDEX_MAGIC) and len(stored) < len(gcs_emulator.read(gcs_bucket, "plain.pt"))
    assert len(widths(stored)) >= 3  # several blocks, compressed on several threads
    assert_equal(checkpoint.load(packed, client=client), state)  # no need to say it is compressed
    assert_equal(checkpoint.load(plain, client=client), state)


def test_the_default_is_standard_zstd_that_other_tools_read(
    gcs_bucket: str, gcs_emulator: Emulator, tmp_path: Path
) -> None:
    """Checkpoints saved with ``compression="zstd"`` need neither this library nor its index to be read."""
    state = trained_like_state()
    url = f"gs://{gcs_bucket}/portable.pt.zst"
    checkpoint.save(state, url, client=gcs_emulator.client_config, write=WriteConfig(compression="zstd"))
    stored = gcs_emulator.read(gcs_bucket, "portable.pt.zst")
    plain = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored), read_across_frames=True).read()
    assert_equal(torch.load(io.BytesIO(plain), weights_only=True), state)
    if shutil.which("zstd"):
        (tmp_path / "portable.pt.zst").write_bytes(stored)
        subprocess.run(["zstd", "-q", "-d", "--check", str(tmp_path / "portable.pt.zst")], check=True)
        assert (tmp_path / "portable.pt").read_bytes() == plain
    with pytest.raises(zstandard.ZstdError):  # the frames carry checksums: a flipped byte is caught
        damaged = bytearray(stored)
        damaged[INDEX_FRAME.size + 40] ^= 0xFF
        zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bytes(damaged)), read_across_frames=True).read()


def test_byte_grouping_is_chosen_per_block_and_pays_on_floats() -> None:
    state = trained_like_state()
    floats = state["0.weight"].numpy().tobytes()  # 64 KiB each: one block apiece
    halves = torch.cat([state["0.weight"].ravel(), state["2.weight"].ravel()]).to(torch.bfloat16).view(torch.int16)
    halves = halves.numpy().tobytes()
    text = Path(torch.__file__).read_bytes()[: 64 * KiB]  # source code
    sizes = {}
    for grouping in (True, False):
        sink = MemorySink()
        with CompressingWriter(sink, Zstd(block_size=64 * KiB, byte_grouping=grouping)) as writer:
            for part in (floats, halves, text):
                writer.write(part)
        assert decompress(sink.data) == floats + halves + text
        found = list(blocks(memoryview(sink.data), "test"))
        sizes[grouping] = [compressed for _, compressed, _, _ in found]
        chosen = [width for _, _, _, width in found]
        if grouping:  # float32 grouped by 4 or 8 (exponent bytes together either way), bfloat16 by 2+, text not
            assert chosen[0] in (4, 8) and chosen[1] in (2, 4, 8) and chosen[2] == 1, chosen
        else:
            assert chosen == [1, 1, 1]
    # smaller where grouped (on real trained weights by about 10%: see benchmarks/), the same where not
    assert sizes[True][0] < sizes[False][0] and sizes[True][1] < sizes[False][1], sizes
    assert sizes[True][2] == sizes[False][2], sizes


class MemorySink(io.BytesIO):
    """A stand-in sink for the format tests (the GCS writers are tested over HTTP elsewhere)."""

    url = "memory"
    generation: int | None = None
    aborted = False

    def close(self) -> None:
        self.data = self.getvalue()
        self.generation = 1
        super().close()

    def abort(self) -> None:
        self.aborted = True
        super().close()


def test_plain_zstd_and_uncompressed_objects_load_too(gcs_bucket: str, gcs_emulator: Emulator) -> None:
    state = trained_like_state()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    gcs_emulator.seed(gcs_bucket, {"by-zstd-tool.pt.zst": zstandard.ZstdCompressor().compress(buffer.getvalue())})
    assert_equal(checkpoint.load(f"gs://{gcs_bucket}/by-zstd-tool.pt.zst", client=gcs_emulator.client_config), state)
    assert decompress(b"not compressed") == b"not compressed"


@pytest.mark.parametrize("grouping", [False, True])
def test_damaged_compressed_data_raises_integrity_error(
    gcs_bucket: str, gcs_emulator: Emulator, grouping: bool
) -> None:
    sink = MemorySink()
    with CompressingWriter(sink, Zstd(block_size=64 * KiB, byte_grouping=grouping)) as writer:
        writer.write(np.arange(100_000, dtype=np.float32).tobytes())
    first_frame = len(MAGIC) + BLOCK_HEADER.size if grouping else INDEX_FRAME.size
    damaged = bytearray(sink.data)
    damaged[first_frame + 40] ^= 0xFF  # inside the first zstd frame
    with pytest.raises(IntegrityError):
        decompress(damaged, "gs://b/x")
    with pytest.raises(IntegrityError, match="ends inside a block header"):
        decompress(sink.data[: first_frame - 3], "gs://b/x")
    gcs_emulator.seed(gcs_bucket, {f"damaged-{grouping}.pt": bytes(damaged)})  # stored whole: only its content is wrong
    with pytest.raises(IntegrityError):  # read again after each damaged read, promptly, then given up
        checkpoint.load(f"gs://{gcs_bucket}/damaged-{grouping}.pt", client=gcs_emulator.client_config, retry=PROMPT)


def test_failure_while_compressing_publishes_nothing(
    gcs_bucket: str, gcs_emulator: Emulator, gcs_front: GCSFront
) -> None:
    state = {**trained_like_state(), "not a tensor": lambda: None}
    url = f"gs://{gcs_bucket}/broken.pt"
    with pytest.raises(Exception, match="pickle|lambda"):
        checkpoint.save(
            state, url, client=gcs_front.client_config, write=WriteConfig(compression="zstd", part_size=5 * 1024 * KiB)
        )
    assert gcs_emulator.names(gcs_bucket) == [] and gcs_front.open_uploads == []


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_writer_dropped_without_close_publishes_nothing(
    gcs_bucket: str, gcs_emulator: Emulator, gcs_front: GCSFront, compression: str | None
) -> None:
    """A writer left unclosed by an exception inside ``torch.save`` keeps the previous checkpoint."""
    url = f"gs://{gcs_bucket}/kept.pt"
    good = trained_like_state()
    checkpoint.save(good, url, client=gcs_front.client_config, write=WriteConfig(compression=compression))

    def save_without_closing() -> None:
        writer = checkpoint.open_writer(url, client=gcs_front.client_config, write=WriteConfig(compression=compression))
        torch.save({**trained_like_state(), "not a tensor": lambda: None}, writer)

    with pytest.raises(Exception, match="pickle|lambda"):
        save_without_closing()
    gc.collect()  # the writer, held by the traceback until now, is finalized
    assert_equal(checkpoint.load(url, client=gcs_front.client_config), good)
    assert gcs_emulator.names(gcs_bucket) == ["kept.pt"] and gcs_front.open_uploads == []


def test_sink_datapipe_compresses(gcs_bucket: str, gcs_emulator: Emulator) -> None:
    state = trained_like_state()
    url = f"gs://{gcs_bucket}/epoch-1.pt"
    saved = list(
        IterableWrapper([(url, state)]).save_by_gcs(
            client=gcs_emulator.client_config, write=WriteConfig(compression=Zstd(level=1))
        )
    )
    assert saved == [url] and gcs_emulator.read(gcs_bucket, "epoch-1.pt").startswith(INDEX_MAGIC)
    assert_equal(checkpoint.load(url, client=gcs_emulator.client_config), state)


def test_bad_compression_settings() -> None:
    with pytest.raises(ValueError, match="compression"):
        checkpoint.open_writer("gs://bucket/x", write=WriteConfig(compression="lz4"))
    with pytest.raises(ValueError, match="strategy"):
        checkpoint.open_writer("gs://bucket/x", write=WriteConfig(strategy="resumable"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="level"):
        Zstd(level=30)
    with pytest.raises(ValueError, match="block_size"):
        Zstd(block_size=1)


@pytest.mark.parametrize("grouping", [False, True])
def test_a_compressed_checkpoint_is_decompressed_range_by_range_as_it_downloads(
    gcs_bucket: str, gcs_emulator: Emulator, gcs_front: GCSFront, grouping: bool
) -> None:
    """Its block table, read from its last bytes, lets the load read ranges of whole blocks (as many as
    the uncompressed object would take) and decompress each as it arrives; a damaged range is read again."""
    state = trained_like_state() | {f"w{i}": torch.linspace(0, i, 256 * KiB) for i in range(8)}  # ~8.5 MiB raw
    url = f"gs://{gcs_bucket}/ranged.pt.zst"
    settings = Zstd(block_size=256 * KiB, byte_grouping=grouping)
    checkpoint.save(state, url, client=gcs_front.client_config, write=WriteConfig(compression=settings))
    stored = gcs_emulator.read(gcs_bucket, "ranged.pt.zst")
    table = read_block_table(stored, len(stored), url)
    assert isinstance(table, list) and len(table) >= 30 and sum(block.raw for block in table) > 8 * 1024 * KiB
    assert {block.width for block in table} != {1} if grouping else {block.width for block in table} == {1}
    assert_equal(torch.load(io.BytesIO(decompress(stored, url)), weights_only=True), state)  # read whole, too
    gcs_front.reset_counts()
    assert_equal(
        checkpoint.load(url, client=gcs_front.client_config, transfer=TransferConfig(part_size=1024 * KiB)), state
    )
    assert gcs_front.counts.keys() == {"metadata", "range_get"}
    # its tail, then ranges of equal compressed size, about as many as the raw object is read in (16 here)
    assert 1 + RANGES_AT_ONCE // 2 <= gcs_front.counts["range_get"] <= 1 + RANGES_AT_ONCE + 2
    gcs_front.reset_counts()
    gcs_front.set_faults([Fault("corrupt", match="range_get", times=3)])  # the table's answer, then ranges
    assert_equal(
        checkpoint.load(url, client=gcs_front.client_config, transfer=TransferConfig(part_size=1024 * KiB)), state
    )
    assert gcs_front.faults_injected["corrupt"] == 3 and gcs_front.counts["range_get"] > 1 + 9

    # Without the table (as written before it existed), the object is read whole and decompressed after.
    frame = len(stored) - (table[-1].frame + table[-1].compressed)
    gcs_emulator.upload(gcs_bucket, "untabled.pt.zst", stored[:-frame])
    assert_equal(checkpoint.load(f"gs://{gcs_bucket}/untabled.pt.zst", client=gcs_emulator.client_config), state)
