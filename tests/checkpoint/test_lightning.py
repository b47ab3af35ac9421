"""GCSCheckpointIO with real Lightning Trainers over HTTP to the emulator."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning.fabric
import lightning.pytorch
import pytest
import torch
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchdata_gcs import InvalidURIError, NotFoundError, TransferConfig, UploadError, WriteConfig, checkpoint
from torchdata_gcs._engines.upload import MIN_PART_SIZE
from torchdata_gcs.lightning import GCSCheckpointIO
from torchdata_gcs.testing import Emulator, Fault, GCSFront

pytestmark = [
    pytest.mark.timeout(120),
    # Lightning 2.6 still checks pytree specs the way torch 2.13 deprecates; nothing to do with checkpoints.
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"),
]

FLAVOURS = {"lightning": lightning.pytorch}
PADDING = 1_600_000  # floats in a buffer: a 6.4 MB checkpoint, two 5 MiB parts


def tiny_module(pl: ModuleType, padding: int = 0) -> Any:
    """A Linear regression LightningModule of the given flavour; SGD with momentum, so optimizer state has tensors."""

    class Tiny(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self, lr: float = 0.05, padding: int = 0) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = nn.Linear(4, 1)
            self.register_buffer("padding", torch.linspace(0, 1, padding))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    torch.manual_seed(0)
    return Tiny(padding=padding)


def loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=generator)
    return DataLoader(TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])), batch_size=8)


def trainer(pl: ModuleType, root: Path, max_epochs: int, plugins: list[Any], **options: Any) -> Any:
    options = {"enable_checkpointing": False, **options}
    return pl.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        plugins=plugins,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


def assert_same_tensors(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert actual.keys() == expected.keys()
    for key, tensor in expected.items():
        assert actual[key].dtype == tensor.dtype and torch.equal(actual[key], tensor), key


@pytest.fixture
def front(gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str) -> GCSFront:
    return gcs_front


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fit_save_load_and_resume_from_gcs(
    flavour: str, front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, tmp_path: Path
) -> None:
    pl = FLAVOURS[flavour]
    url = f"gs://{gcs_bucket}/run-1/last.ckpt"
    plugin = GCSCheckpointIO(client=front.client_config, transfer=TransferConfig(part_size=1024 * 1024))
    first, model = trainer(pl, tmp_path, 2, [plugin]), tiny_module(pl)
    first.fit(model, loader())
    front.reset_counts()
    first.save_checkpoint(url)
    first.save_checkpoint(tmp_path / "local.ckpt")  # the same state through Lightning's own local writer
    assert gcs_emulator.names(gcs_bucket) == ["run-1/last.ckpt"]
    assert front.counts["upload"] == 1 and front.open_uploads == []

    stored = torch.load(io.BytesIO(gcs_emulator.read(gcs_bucket, "run-1/last.ckpt")), weights_only=True)
    loaded = plugin.load_checkpoint(url)  # weights_only=None: torch.load's default, as TorchCheckpointIO does
    for saved in (stored, loaded):
        assert (saved["epoch"], saved["global_step"]) == (2, 8)
        assert saved["hyper_parameters"] == {"lr": 0.05, "padding": 0}
        assert_same_tensors(saved["state_dict"], model.state_dict())
    assert loaded["optimizer_states"][0]["state"][0]["momentum_buffer"].abs().sum() > 0
    # load_from_checkpoint has no Trainer, so no CheckpointIO: it takes the stream open_reader gives.
    restored = type(model).load_from_checkpoint(checkpoint.open_reader(url, client=front.client_config))
    assert_same_tensors(restored.state_dict(), model.state_dict())

    # Resume from GCS and, as the reference, from the local copy with Lightning's default checkpoint IO.
    front.reset_counts()
    resumed, from_gcs = trainer(pl, tmp_path, 3, [plugin]), tiny_module(pl)
    resumed.fit(from_gcs, loader(), ckpt_path=url)
    assert front.counts["get"] + front.counts["range_get"] >= 1
    reference, from_disk = trainer(pl, tmp_path, 3, []), tiny_module(pl)
    reference.fit(from_disk, loader(), ckpt_path=tmp_path / "local.ckpt")
    assert type(reference.strategy.checkpoint_io).__name__ == "TorchCheckpointIO"
    assert (resumed.current_epoch, resumed.global_step) == (reference.current_epoch, reference.global_step) == (3, 12)
    assert_same_tensors(from_gcs.state_dict(), from_disk.state_dict())
    assert not torch.equal(from_gcs.layer.weight, model.layer.weight)  # the third epoch did train


def test_fabric_save_and_load_compressed(front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    plugin = GCSCheckpointIO(client=front.client_config, write=WriteConfig(compression="zstd"))
    fabric = lightning.fabric.Fabric(accelerator="cpu", devices=1, plugins=[plugin])
    torch.manual_seed(0)
    model, other = fabric.setup_module(nn.Linear(4, 2)), fabric.setup_module(nn.Linear(4, 2))
    fabric.save(f"gs://{gcs_bucket}/fabric.ckpt", {"model": model, "step": 7})
    assert gcs_emulator.names(gcs_bucket) == ["fabric.ckpt"]
    assert not gcs_emulator.read(gcs_bucket, "fabric.ckpt").startswith(b"PK")  # not torch.save's plain zip
    assert fabric.load(f"gs://{gcs_bucket}/fabric.ckpt", {"model": other}) == {"step": 7}
    assert_same_tensors(other.state_dict(), model.state_dict())


class SaveEveryEpoch(lightning.pytorch.Callback):
    def __init__(self, bucket: str) -> None:
        self.bucket = bucket

    def on_train_epoch_end(
        self, trainer: lightning.pytorch.Trainer, pl_module: lightning.pytorch.LightningModule
    ) -> None:
        trainer.save_checkpoint(f"gs://{self.bucket}/epoch-{trainer.current_epoch}.ckpt")


def test_async_checkpoint_io_uploads_in_the_background(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, tmp_path: Path
) -> None:
    plugin = AsyncCheckpointIO(GCSCheckpointIO(client=front.client_config, write=WriteConfig(part_size=MIN_PART_SIZE)))
    fit = trainer(lightning.pytorch, tmp_path, 2, [plugin], callbacks=[SaveEveryEpoch(gcs_bucket)])
    model = tiny_module(lightning.pytorch, padding=PADDING)
    fit.fit(model, loader())  # the end of fit tears the plugin down, which waits for the uploads
    assert fit.strategy.checkpoint_io is plugin
    assert gcs_emulator.names(gcs_bucket) == ["epoch-0.ckpt", "epoch-1.ckpt"]
    assert front.counts["upload"] == 2 * 5 and front.open_uploads == []  # initiate, marker, two parts, complete; twice
    reader = GCSCheckpointIO(client=front.client_config)
    epoch_0, epoch_1 = (reader.load_checkpoint(f"gs://{gcs_bucket}/epoch-{n}.ckpt") for n in (0, 1))
    assert (epoch_0["global_step"], epoch_1["global_step"]) == (4, 8)
    assert_same_tensors(epoch_1["state_dict"], model.state_dict())  # tensors cloned when the save was asked for
    assert not torch.equal(epoch_0["state_dict"]["layer.weight"], model.layer.weight)

    url = f"gs://{gcs_bucket}/after-fit.ckpt"
    fit.save_checkpoint(url)
    plugin.teardown()  # waits for the background save
    assert_same_tensors(reader.load_checkpoint(url)["state_dict"], model.state_dict())


def test_remove_checkpoint_like_torch_checkpoint_io(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, tmp_path: Path
) -> None:
    plugin = GCSCheckpointIO(client=front.client_config)
    fit = trainer(lightning.pytorch, tmp_path, 2, [plugin], enable_checkpointing=True)
    fit.fit(tiny_module(lightning.pytorch), loader())
    # The default ModelCheckpoint (a local directory) still works: local paths go to TorchCheckpointIO,
    # which saved epoch 0 and 1 and removed epoch 0's checkpoint (save_top_k=1).
    assert [path.name for path in tmp_path.glob("checkpoints/*")] == ["epoch=1-step=8.ckpt"]
    assert front.counts["upload"] == 0
    keep, drop = f"gs://{gcs_bucket}/keep.ckpt", f"gs://{gcs_bucket}/drop.ckpt"
    fit.save_checkpoint(keep)
    fit.save_checkpoint(drop)
    front.reset_counts()
    fit.strategy.remove_checkpoint(drop)  # what ModelCheckpoint calls when it rotates checkpoints
    assert gcs_emulator.names(gcs_bucket) == ["keep.ckpt"] and front.counts["delete"] == 1
    with pytest.raises(FileNotFoundError, match="drop.ckpt"):
        plugin.load_checkpoint(drop)

    # A missing checkpoint is no error (nothing raised), for Lightning's own local plugin and for this one.
    TorchCheckpointIO().remove_checkpoint(tmp_path / "never-saved.ckpt")
    plugin.remove_checkpoint(drop)  # the live generation is asked first (deletes are conditional): none, no DELETE
    assert front.counts["delete"] == 1 and gcs_emulator.names(gcs_bucket) == ["keep.ckpt"]
    with pytest.raises(NotFoundError):
        plugin.load_checkpoint(f"gs://{gcs_bucket}/never-saved.ckpt")


@dataclass
class RunInfo:
    """Not a tensor, nor a type that torch.load's weights_only mode allows."""

    name: str


def test_weights_only_and_map_location_as_torch_checkpoint_io(front: GCSFront, gcs_bucket: str, tmp_path: Path) -> None:
    state = {"state_dict": {"w": torch.arange(3.0)}, "info": RunInfo("run-1")}
    plugin, local = GCSCheckpointIO(client=front.client_config), TorchCheckpointIO()
    url, path = f"gs://{gcs_bucket}/info.ckpt", tmp_path / "info.ckpt"
    plugin.save_checkpoint(state, url)
    local.save_checkpoint(state, path)
    for io_, where in ((plugin, url), (local, path)):
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            io_.load_checkpoint(where)  # weights_only=None is torch.load's default: True
        assert io_.load_checkpoint(where, weights_only=False)["info"] == RunInfo("run-1")
    assert plugin.load_checkpoint(url, map_location="meta", weights_only=False)["state_dict"]["w"].is_meta


def test_failed_saves_publish_nothing_and_leave_no_upload_open(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, tmp_path: Path
) -> None:
    plugin = GCSCheckpointIO(client=front.client_config, write=WriteConfig(part_size=MIN_PART_SIZE))
    fit = trainer(lightning.pytorch, tmp_path, 1, [plugin])
    model = tiny_module(lightning.pytorch, padding=PADDING)
    fit.fit(model, loader())
    url = f"gs://{gcs_bucket}/model.ckpt"
    fit.save_checkpoint(url)
    published = gcs_emulator.read(gcs_bucket, "model.ckpt")

    # 1. torch.save cannot pickle what a hook put into the checkpoint: the earlier checkpoint stays as it was.
    model.on_save_checkpoint = lambda checkpoint: checkpoint.update(hook=lambda: None)  # type: ignore[method-assign]
    with pytest.raises(Exception, match="pickle|lambda"):
        fit.save_checkpoint(url)
    assert gcs_emulator.read(gcs_bucket, "model.ckpt") == published
    del model.on_save_checkpoint

    # 2. GCS refuses the second part mid-stream, in a background save: the error surfaces at teardown.
    front.set_faults([Fault("http_403", match=r"PUT .*partNumber=2")])
    front.reset_counts()
    background = AsyncCheckpointIO(plugin)
    background.save_checkpoint(fit._checkpoint_connector.dump_checkpoint(), f"gs://{gcs_bucket}/other.ckpt")
    with pytest.raises(UploadError, match="other.ckpt"):
        background.teardown()
    assert front.faults_injected["http_403"] == 1 and front.counts["delete"] == 2  # the upload aborted, its marker gone
    assert gcs_emulator.names(gcs_bucket) == ["model.ckpt"]
    assert front.open_uploads == []


def test_bad_paths_and_options_are_refused_before_any_request(front: GCSFront, gcs_bucket: str, tmp_path: Path) -> None:
    plugin = GCSCheckpointIO(client=front.client_config)
    fit = trainer(lightning.pytorch, tmp_path, 1, [plugin])
    fit.fit(tiny_module(lightning.pytorch), loader())
    front.reset_counts()
    with pytest.raises(ValueError, match=r"gs://bucket/name URLs and local paths, not 's3://"):
        fit.save_checkpoint(f"s3://{gcs_bucket}/model.ckpt")
    with pytest.raises(ValueError, match=r"pathlib.Path turns '//' into '/'"):
        fit.save_checkpoint(Path(f"gs://{gcs_bucket}/model.ckpt"))
    with pytest.raises(InvalidURIError, match="bucket name"):
        plugin.load_checkpoint("gs://Not_A_Bucket/model.ckpt")
    with pytest.raises(InvalidURIError, match="object name must not be empty"):
        plugin.remove_checkpoint(f"gs://{gcs_bucket}/")
    with pytest.raises(TypeError, match="storage_options"):
        fit.save_checkpoint(f"gs://{gcs_bucket}/model.ckpt", storage_options={"part_size": MIN_PART_SIZE})
    with pytest.raises(TypeError, match="partsize"):
        GCSCheckpointIO(partsize=MIN_PART_SIZE)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="part_size must be an integer 5242880"):
        GCSCheckpointIO(write=WriteConfig(part_size=1024))
    with pytest.raises(ValueError, match="compression must be"):
        GCSCheckpointIO(write=WriteConfig(compression="gzip"))
    assert sum(front.counts.values()) == 0


def test_lightning_is_an_optional_import() -> None:
    script = textwrap.dedent(
        """
        import sys
        import torchdata_gcs
        loaded = sorted(name for name in sys.modules if "lightning" in name)
        assert not loaded, loaded

        sys.modules["lightning"] = None  # not installed
        try:
            import torchdata_gcs.lightning
        except ImportError as exc:
            print(exc)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "pip install 'torchdata-gcs[lightning]'" in result.stdout
