"""Libraries that reach GCS through fsspec, each writing and reading back through ``GCSFileSystem`` with its
own calls, as a gcsfs user's code makes them: pyarrow datasets, Hugging Face ``datasets``, zarr v3, torch DCP's
fsspec writer and reader, Lightning's ``ModelCheckpoint``, and pandas beyond the calls of test_tools.py.
Options are given the way gcsfs takes them (``endpoint_url``, ``token="anon"``) and reach a GCS front."""

from __future__ import annotations

import gzip
import io
import json
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import huggingface_hub
import lightning.pytorch as pl
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch.callbacks import ModelCheckpoint
from pandas.testing import assert_frame_equal
from pyarrow.fs import FSSpecHandler, PyFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from tests.checkpoint.test_lightning import assert_same_tensors, loader, tiny_module, trainer
from tests.filesystem.test_filesystem import registered  # noqa: F401 - the fixture
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def options(registered: None, gcs_front: GCSFront) -> Iterator[dict[str, Any]]:  # noqa: F811
    """gcsfs's arguments for the front, and gs:// served by ``GCSFileSystem`` (gcsfs installed or not); no
    filesystem made with them outlives the test."""
    GCSFileSystem.clear_instance_cache()
    yield {"endpoint_url": gcs_front.endpoint, "token": "anon"}
    GCSFileSystem.clear_instance_cache()


@pytest.fixture
def fs(options: dict[str, Any]) -> GCSFileSystem:
    return GCSFileSystem(**options)


def frame() -> pd.DataFrame:
    return pd.DataFrame({"step": range(300), "loss": [1 / (i + 1) for i in range(300)], "run": ["a", "b", "c"] * 100})


def test_pandas_compressed_csv_with_gcsfs_storage_options(
    options: dict[str, Any], gcs_front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    url = f"gs://{gcs_bucket}/frames/metrics.csv.gz"  # pandas infers gzip from the name
    frame().to_csv(url, index=False, storage_options=options)
    assert gcs_emulator.read(gcs_bucket, "frames/metrics.csv.gz")[:2] == b"\x1f\x8b"
    assert_frame_equal(pd.read_csv(url, storage_options=options), frame())
    assert gcs_front.counts["upload"] == 1


def test_pandas_partitioned_parquet_with_a_filesystem_and_with_storage_options(
    fs: GCSFileSystem, options: dict[str, Any], gcs_bucket: str
) -> None:
    url = f"gs://{gcs_bucket}/frames/partitioned"
    frame().to_parquet(url, partition_cols=["run"], filesystem=fs)
    assert sorted(fs.ls(url)) == [f"{gcs_bucket}/frames/partitioned/run={run}" for run in "abc"]
    # pyarrow matches the names a filesystem lists against the directory as given, so with filesystem= a
    # directory is named without gs:// (as with gcsfs); storage_options= take the URL
    for back in (
        pd.read_parquet(f"{gcs_bucket}/frames/partitioned", filesystem=fs),
        pd.read_parquet(url, storage_options=options),
    ):
        back = back.sort_values("step", ignore_index=True)
        assert back["run"].astype(str).tolist() == frame()["run"].tolist()
        assert_frame_equal(back.drop(columns="run"), frame().drop(columns="run"))


def test_pyarrow_dataset_writes_and_reads_through_fsspec_handler(fs: GCSFileSystem, gcs_bucket: str) -> None:
    arrow = PyFileSystem(FSSpecHandler(fs))
    table = pa.Table.from_pandas(frame(), preserve_index=False)
    root = f"{gcs_bucket}/arrow/metrics"
    ds.write_dataset(
        table,
        root,
        format="parquet",
        partitioning=["run"],
        filesystem=arrow,
        max_rows_per_file=60,
        max_rows_per_group=60,
    )
    names = sorted(fs.find(root))
    assert len(names) == 6 and all(name.startswith(f"{root}/") and name.endswith(".parquet") for name in names)
    dataset = ds.dataset(
        root, format="parquet", partitioning=ds.partitioning(pa.schema([("run", pa.string())])), filesystem=arrow
    )
    assert dataset.count_rows() == 300
    back = dataset.to_table(filter=ds.field("run") == "b").to_pandas().sort_values("step", ignore_index=True)
    expected = frame()[frame()["run"] == "b"].reset_index(drop=True)
    assert_frame_equal(back[["step", "loss"]], expected[["step", "loss"]])


@pytest.fixture
def offline_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Hugging Face libraries that never reach the Hub and cache in a directory of the test's own. The Hub's
    client is offline; ``datasets`` is not, since its offline mode refuses every remote path, gs:// too."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    # both read the variables when first imported: set what they read, in case that was earlier
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    return tmp_path / "hf-datasets"


def test_hugging_face_load_dataset_from_gs_parquet(
    offline_hf: Path, options: dict[str, Any], fs: GCSFileSystem, gcs_bucket: str
) -> None:
    frame().iloc[:150].to_parquet(f"gs://{gcs_bucket}/hf/train-0.parquet", filesystem=fs)
    frame().iloc[150:].to_parquet(f"gs://{gcs_bucket}/hf/train-1.parquet", filesystem=fs)
    loaded = datasets.load_dataset(
        "parquet",
        data_files=f"gs://{gcs_bucket}/hf/train-*.parquet",
        storage_options=options,
        cache_dir=str(offline_hf),
    )
    assert loaded["train"].num_rows == 300
    assert_frame_equal(loaded["train"].to_pandas(), frame())
    # datasets adds its Hub options to the dict it was given, under "hf" (fsspec's form for another protocol's
    # options); the same dict, used again to write, must still be taken
    loaded["train"].filter(lambda row: row["run"] == "a").to_parquet(
        f"gs://{gcs_bucket}/hf/only-a.parquet", storage_options=options
    )
    expected = frame()[frame()["run"] == "a"].reset_index(drop=True)
    assert_frame_equal(pd.read_parquet(f"gs://{gcs_bucket}/hf/only-a.parquet", storage_options=options), expected)
    streamed = datasets.load_dataset(
        "parquet", data_files=f"gs://{gcs_bucket}/hf/train-*.parquet", storage_options=options, split="train",
        streaming=True,
    )  # fmt: skip
    assert [row["step"] for row in streamed] == list(range(300))


def test_hugging_face_streams_compressed_json_lines_from_gs(
    offline_hf: Path, options: dict[str, Any], fs: GCSFileSystem, gcs_bucket: str
) -> None:
    """A compressed file is opened through ``datasets``' own filesystem, which hands the one beneath it
    ``client_kwargs`` (meant for an HTTP client), as it does for every protocol."""
    rows = [{"step": step, "run": "ab"[step % 2]} for step in range(50)]
    fs.pipe_file(
        f"{gcs_bucket}/hf/rows.jsonl.gz", gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode())
    )
    streamed = datasets.load_dataset(
        "json", data_files=f"gs://{gcs_bucket}/hf/*.jsonl.gz", storage_options=options, split="train", streaming=True
    )
    assert list(streamed) == rows


def test_hugging_face_streams_text_in_the_encoding_asked(
    offline_hf: Path, options: dict[str, Any], fs: GCSFileSystem, gcs_bucket: str
) -> None:
    """Streaming, ``datasets`` opens a text file with its encoding among the filesystem's options."""
    fs.pipe_file(f"{gcs_bucket}/text/notes.txt", "café\nnaïve\n".encode("latin-1"))
    streamed = datasets.load_dataset(
        "text", data_files=f"gs://{gcs_bucket}/text/*.txt", encoding="latin-1", storage_options=options,
        split="train", streaming=True,
    )  # fmt: skip
    assert [row["text"] for row in streamed] == ["café", "naïve"]


def test_hugging_face_streams_webdataset_shards_from_gs(
    offline_hf: Path, options: dict[str, Any], fs: GCSFileSystem, gcs_bucket: str
) -> None:
    """Tar shards read as they stream, opened with ``block_size=0`` among the filesystem's options."""
    for shard in range(2):
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for key in range(shard * 3, shard * 3 + 3):
                for extension, data in (("json", json.dumps({"step": key}).encode()), ("txt", f"text {key}".encode())):
                    member = tarfile.TarInfo(f"{key:06d}.{extension}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
        fs.pipe_file(f"{gcs_bucket}/shards/train-{shard}.tar", archive.getvalue())
    streamed = datasets.load_dataset(
        "webdataset", data_files=f"gs://{gcs_bucket}/shards/*.tar", storage_options=options, split="train",
        streaming=True,
    )  # fmt: skip
    assert [(row["json"]["step"], row["txt"]) for row in streamed] == [(key, f"text {key}") for key in range(6)]


def test_hugging_face_save_to_disk_and_load_from_disk_on_gs(
    offline_hf: Path, options: dict[str, Any], fs: GCSFileSystem, gcs_bucket: str
) -> None:
    original = datasets.Dataset.from_pandas(frame(), preserve_index=False)
    url = f"gs://{gcs_bucket}/hf/saved"
    original.save_to_disk(url, storage_options=options, max_shard_size="4KB")
    assert {"dataset_info.json", "state.json"} <= {name.rsplit("/", 1)[1] for name in fs.ls(url)}
    back = datasets.load_from_disk(url, storage_options=options)
    assert back.num_rows == 300 and back.features == original.features
    assert_frame_equal(back.to_pandas(), frame())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="zarr 3 needs Python 3.11")
def test_zarr_v3_sharded_array_in_an_fsspec_store(options: dict[str, Any], fs: GCSFileSystem, gcs_bucket: str) -> None:
    """zarr's fsspec store drives the asynchronous API; a sharded array's chunks are read as ranges of a shard,
    its index as the shard's last bytes."""
    import zarr
    from zarr.storage import FsspecStore

    values = np.arange(4000, dtype="float32").reshape(40, 100)
    store = FsspecStore(GCSFileSystem(asynchronous=True, **options), path=f"{gcs_bucket}/zarr/grid.zarr")
    array = zarr.create_array(
        store, shape=values.shape, chunks=(10, 25), shards=(20, 50), dtype="float32", attributes={"units": "m"}
    )
    array[:] = values
    array[5:15, 90:] = -1.0
    values[5:15, 90:] = -1.0
    assert sorted(name.split("/c/")[1] for name in fs.find(f"{gcs_bucket}/zarr/grid.zarr") if "/c/" in name) == [
        "0/0", "0/1", "1/0", "1/1"
    ]  # fmt: skip

    url = f"gs://{gcs_bucket}/zarr/grid.zarr"
    reopened = zarr.open_array(FsspecStore.from_url(url, storage_options=options, read_only=True))
    assert reopened.shape == (40, 100) and reopened.attrs["units"] == "m"
    np.testing.assert_array_equal(reopened[:], values)
    np.testing.assert_array_equal(reopened[12:31, 7:61], values[12:31, 7:61])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_fsspec_writer_and_reader_round_trip(
    options: dict[str, Any], gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    torch.manual_seed(0)
    state = {"weight": torch.randn(128, 32), "step": torch.tensor(3), "nested": {"bias": torch.arange(500.0)}}
    url = f"gs://{gcs_bucket}/dcp/step-3"
    dcp.save(state, storage_writer=FsspecWriter(url, thread_count=2, **options), no_dist=True)
    assert ".metadata" in [name.rsplit("/", 1)[1] for name in gcs_emulator.names(gcs_bucket)]
    restored = {"weight": torch.zeros(128, 32), "step": torch.tensor(0), "nested": {"bias": torch.zeros(500)}}
    dcp.load(restored, storage_reader=FsspecReader(url, **options), no_dist=True)
    assert torch.equal(restored["weight"], state["weight"]) and int(restored["step"]) == 3
    assert torch.equal(restored["nested"]["bias"], state["nested"]["bias"])


@pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning")
def test_lightning_model_checkpoint_saves_to_gs_and_loads_back(
    registered: None,  # noqa: F811
    gcs_front: GCSFront,
    monkeypatch: pytest.MonkeyPatch,
    gcs_bucket: str,
    tmp_path: Path,
) -> None:
    """The route a gcsfs user takes: ModelCheckpoint and load_from_checkpoint open gs:// with fsspec's handler."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_front.endpoint)
    GCSFileSystem.clear_instance_cache()
    callback = ModelCheckpoint(dirpath=f"gs://{gcs_bucket}/lightning", every_n_train_steps=2, save_top_k=-1)
    model = tiny_module(pl)
    trainer(pl, tmp_path, 1, [], enable_checkpointing=True, callbacks=[callback]).fit(model, loader())
    assert sorted(GCSFileSystem().ls(f"gs://{gcs_bucket}/lightning")) == [
        f"{gcs_bucket}/lightning/epoch=0-step=2.ckpt", f"{gcs_bucket}/lightning/epoch=0-step=4.ckpt"
    ]  # fmt: skip
    assert gcs_front.counts["upload"] == 2
    loaded = type(model).load_from_checkpoint(callback.best_model_path)
    assert loaded.hparams.lr == model.hparams.lr
    assert_same_tensors(loaded.state_dict(), model.state_dict())
