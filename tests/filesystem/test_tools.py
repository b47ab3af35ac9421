"""Tools that reach GCS through fsspec, each the way the README's fsspec section says: Lightning's
ModelCheckpoint and torch.distributed.checkpoint with a gs:// checkpoint id (GCSFileSystem registered),
pandas' text formats through fsspec's gs:// handler, and pandas' parquet calls and pyarrow's own
given storage_options or a filesystem. Requests are counted at a GCS front to show whose client made them.
Lightning and DCP run as an identity with object roles only, as training jobs do."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch.callbacks import ModelCheckpoint
from pandas.testing import assert_frame_equal

from tests.checkpoint.test_lightning import assert_same_tensors, loader, tiny_module, trainer
from tests.filesystem.test_filesystem import registered  # noqa: F401 - the fixture
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),  # dcp in one process, as meant
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"),
]


@pytest.fixture
def object_only(registered: None, gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[GCSFront]:  # noqa: F811
    """``gs://`` with no settings goes to a front that acts as a service account with object roles only
    (no ``storage.buckets.get``), as training jobs usually run."""
    with GCSFront(gcs_emulator.endpoint, object_only=True) as front:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", front.endpoint)
        GCSFileSystem.clear_instance_cache()
        yield front
    GCSFileSystem.clear_instance_cache()


def test_lightning_model_checkpoint_to_a_gs_dirpath(
    object_only: GCSFront,
    gcs_emulator: Emulator,
    gcs_bucket: str,
    tmp_path: Path,
) -> None:
    def checkpoints() -> ModelCheckpoint:
        return ModelCheckpoint(
            dirpath=f"gs://{gcs_bucket}/run",
            filename="{epoch}",
            save_top_k=2,
            monitor="step",
            mode="max",
            save_last=True,
        )

    first, model = trainer(pl, tmp_path, 3, [], enable_checkpointing=True, callbacks=[checkpoints()]), tiny_module(pl)
    first.fit(model, loader())
    assert gcs_emulator.names(gcs_bucket) == ["run/epoch=1.ckpt", "run/epoch=2.ckpt", "run/last.ckpt"]  # top 2 kept
    assert first.checkpoint_callback.best_model_path == f"gs://{gcs_bucket}/run/epoch=2.ckpt"

    resumed, again = trainer(pl, tmp_path, 4, [], enable_checkpointing=True, callbacks=[checkpoints()]), tiny_module(pl)
    with pytest.warns(UserWarning, match="exists and is not empty"):  # Lightning sees the run's checkpoints
        resumed.fit(again, loader(), ckpt_path=f"gs://{gcs_bucket}/run/last.ckpt")
    assert (resumed.current_epoch, resumed.global_step) == (4, 16)
    assert gcs_emulator.names(gcs_bucket) == ["run/epoch=2.ckpt", "run/epoch=3.ckpt", "run/last.ckpt"]
    with GCSFileSystem().open(f"gs://{gcs_bucket}/run/last.ckpt", "rb") as f:
        saved = torch.load(f, weights_only=True)
    assert saved["epoch"] == 4 - 1 and saved["global_step"] == 16
    assert_same_tensors(saved["state_dict"], again.state_dict())


def test_distributed_checkpoint_with_a_gs_checkpoint_id(
    object_only: GCSFront,
    gcs_emulator: Emulator,
    gcs_bucket: str,
) -> None:
    torch.manual_seed(0)
    state = {"weight": torch.randn(256, 64), "step": torch.tensor(7), "nested": {"bias": torch.arange(1000.0)}}
    checkpoint_id = f"gs://{gcs_bucket}/dcp/step-7"
    dcp.save(state, checkpoint_id=checkpoint_id)
    assert ".metadata" in [name.rsplit("/", 1)[1] for name in gcs_emulator.names(gcs_bucket)]
    restored = {"weight": torch.zeros(256, 64), "step": torch.tensor(0), "nested": {"bias": torch.zeros(1000)}}
    dcp.load(restored, checkpoint_id=checkpoint_id)
    assert torch.equal(restored["weight"], state["weight"]) and int(restored["step"]) == 7
    assert torch.equal(restored["nested"]["bias"], state["nested"]["bias"])


def frame() -> pd.DataFrame:
    return pd.DataFrame({"step": range(2000), "loss": [1 / (i + 1) for i in range(2000)], "run": ["a", "b"] * 1000})


@pytest.fixture
def default_endpoint(gcs_front: GCSFront, monkeypatch: pytest.MonkeyPatch) -> Iterator[GCSFront]:
    """``gs://`` with no settings goes to the front; no filesystem made earlier with other ones is reused."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_front.endpoint)
    GCSFileSystem.clear_instance_cache()
    yield gcs_front
    GCSFileSystem.clear_instance_cache()


def test_pandas_text_formats_go_through_fsspecs_gs_handler(default_endpoint: GCSFront, gcs_bucket: str) -> None:
    csv, json = f"gs://{gcs_bucket}/frames/metrics.csv", f"gs://{gcs_bucket}/frames/metrics.json"
    frame().to_csv(csv, index=False)
    frame().to_json(json, orient="records")
    assert default_endpoint.counts["upload"] == 2
    default_endpoint.reset_counts()
    assert_frame_equal(pd.read_csv(csv), frame())
    assert_frame_equal(pd.read_json(json, orient="records"), frame())
    assert default_endpoint.counts["get"] + default_endpoint.counts["range_get"] >= 2


def test_pandas_parquet_goes_through_fsspecs_gs_handler_given_empty_storage_options(
    gcs_emulator: Emulator, default_endpoint: GCSFront, gcs_bucket: str
) -> None:
    url = f"gs://{gcs_bucket}/frames/c.parquet"
    frame().to_parquet(url, storage_options={})
    assert default_endpoint.counts["upload"] == 1 and frame().equals(
        parquet_at(gcs_emulator, gcs_bucket, "frames/c.parquet")
    )
    default_endpoint.reset_counts()
    assert_frame_equal(pd.read_parquet(url, storage_options={}), frame())
    assert default_endpoint.counts["range_get"] >= 1


def parquet_at(emulator: Emulator, bucket: str, name: str) -> pd.DataFrame:
    return pq.read_table(io.BytesIO(emulator.read(bucket, name))).to_pandas()


def test_pandas_parquet_goes_through_gcsfilesystem_given_storage_options(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    url, options = f"gs://{gcs_bucket}/frames/a.parquet", {"client": gcs_front.client_config}
    frame().to_parquet(url, storage_options=options)
    assert gcs_front.counts["upload"] == 1 and frame().equals(parquet_at(gcs_emulator, gcs_bucket, "frames/a.parquet"))
    gcs_front.reset_counts()
    assert_frame_equal(pd.read_parquet(url, storage_options=options), frame())
    assert gcs_front.counts["range_get"] >= 1  # the footer, then the columns


def test_pandas_parquet_goes_through_a_filesystem_given_as_one(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    url, fs = (
        f"gs://{gcs_bucket}/frames/b.parquet",
        GCSFileSystem(client=gcs_front.client_config, skip_instance_cache=True),
    )
    frame().to_parquet(url, filesystem=fs)
    assert gcs_front.counts["upload"] == 1 and frame().equals(parquet_at(gcs_emulator, gcs_bucket, "frames/b.parquet"))
    gcs_front.reset_counts()
    assert_frame_equal(pd.read_parquet(url, filesystem=fs), frame())
    assert gcs_front.counts["range_get"] >= 1


def test_pyarrow_reads_and_writes_through_a_filesystem_given_as_one(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    fs = GCSFileSystem(client=gcs_front.client_config, skip_instance_cache=True)
    table = pa.Table.from_pandas(frame(), preserve_index=False)
    pq.write_table(table, f"{gcs_bucket}/tables/t.parquet", filesystem=fs)
    assert gcs_front.counts["upload"] == 1 and frame().equals(parquet_at(gcs_emulator, gcs_bucket, "tables/t.parquet"))
    gcs_front.reset_counts()
    assert pq.read_table(f"{gcs_bucket}/tables/t.parquet", filesystem=fs).equals(table)
    assert pq.read_table(f"gs://{gcs_bucket}/tables/t.parquet", filesystem=fs).equals(table)
    assert gcs_front.counts["range_get"] >= 2
