"""The README's main job: trains on the embedded emulator, resumes when run again, and runs under torchrun."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchdata_gcs.testing._process import free_port

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "train.py"

pytestmark = pytest.mark.timeout(400)


def run(*command: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=360, cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    settings = ("--images", "240", "--epochs", "2", "--batch-size", "32", "--data-dir", str(tmp_path / "data"))
    first = run(sys.executable, str(TRAIN), *settings, cwd=tmp_path)
    assert "seeded 240 images under gs://shapes/images/" in first
    assert "resumed" not in first
    for epoch in (1, 2):
        assert re.search(rf"epoch {epoch}: loss [\d.]+, accuracy [\d.]+%.*240 of 240 samples read, 0 read more", first)
        assert re.search(rf"checkpoint   gs://shapes/checkpoints/single/epoch-000{epoch}\.pt: [\d.]+ MB", first)
    samples = re.search(r"samples      ([\d,]+) in [\d.]+ s of training: ([\d,]+) samples/s, ([\d.]+) MB/s", first)
    assert samples and samples.group(1) == "480" and float(samples.group(3)) > 0
    requests = re.search(r"requests     ([\d,]+) \(([\d.]+) per sample; ([\d,]+) composes", first)
    assert requests and 0 < float(requests.group(2)) < 0.5  # composites: far fewer requests than samples

    second = run(sys.executable, str(TRAIN), *settings, cwd=tmp_path)
    assert "seeded" not in second  # the dataset was kept in the data folder
    assert "resumed from gs://shapes/checkpoints/single/epoch-0002.pt (epoch 2)" in second
    assert "epoch 3:" in second and "epoch 4:" in second and "epoch 1:" not in second


def test_two_ranks_under_torchrun_read_each_sample_once_and_write_dcp_checkpoints(tmp_path: Path) -> None:
    settings = ("--images", "240", "--epochs", "1", "--batch-size", "30", "--data-dir", str(tmp_path / "data"))
    launcher = (
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    )
    environment = {key: value for key, value in os.environ.items() if key != "STORAGE_EMULATOR_HOST"}
    first = run(*launcher, str(TRAIN), *settings, cwd=tmp_path, env=environment)
    # 240 samples over 2 ranks x 2 workers: each read exactly once across the job
    assert "epoch 1:" in first and "240 of 240 samples read, 0 read more than once" in first
    assert re.search(r"checkpoint   gs://shapes/checkpoints/ddp/epoch-0001: [\d.]+ MB", first)
    resumed = run(*launcher, str(TRAIN), *settings, cwd=tmp_path, env=environment)
    assert "resumed from gs://shapes/checkpoints/ddp/epoch-0001/.metadata (epoch 1)" in resumed
    assert "epoch 2:" in resumed
