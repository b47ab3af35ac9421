"""Tools that reach GCS through fsspec, with GCSFileSystem registered for gs://: Lightning's
ModelCheckpoint and torch.distributed.checkpoint with a gs:// checkpoint id."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.checkpoint.test_lightning import assert_same_tensors, loader, tiny_module, trainer
from tests.filesystem.test_filesystem import registered  # noqa: F401 - the fixture
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),  # dcp in one process, as meant
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"),
]


def test_lightning_model_checkpoint_to_a_gs_dirpath(
    registered: None,  # noqa: F811 - the fixture imported above
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
    registered: None,  # noqa: F811 - the fixture imported above
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
