"""``torchdata-gcs pack`` end to end against the emulator: shards written and summed up, a progress line
rewritten in place on a terminal, and one clear line with a non-zero exit for each error."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from torchdata_gcs.cli import main
from torchdata_gcs.testing import Emulator, GCSFront

ROOT = Path(__file__).resolve().parents[2]


def seed(emulator: Emulator, bucket: str, samples: int, size: int = 2048) -> None:
    emulator.seed(bucket, {f"src/{i:05d}.{ext}": os.urandom(size) for i in range(samples) for ext in ("jpg", "cls")})


def test_pack_writes_shards_and_sums_up(gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]):
    seed(gcs_emulator, gcs_bucket, 30)
    argv = ["--endpoint", gcs_emulator.endpoint, "pack", f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/"]
    assert main([*argv, "--shard-size", "20KiB"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"packed gs://{gcs_bucket}/src/ into gs://{gcs_bucket}/out/: 60 objects (30 samples, ")
    assert "shards written, 0 already there" in out and "objects/s" in out and "MB/s" in out
    assert "Traceback" not in err
    names = sorted(n for n in gcs_emulator.names(gcs_bucket) if n.startswith("out/") and n.endswith(".tar"))
    assert len(names) == 10  # three samples of 5,120 bytes of tar a shard
    members = []
    for name in names:
        with tarfile.open(fileobj=io.BytesIO(gcs_emulator.read(gcs_bucket, name))) as tar:
            members += tar.getnames()
    assert members == [f"{i:05d}.{ext}" for i in range(30) for ext in ("cls", "jpg")]
    assert main([*argv, "--shard-size", "20480", "--group-by", "stem"]) == 0  # the same shards: all there
    assert "0 objects (0 samples, 0.0 MB) in 0 shards written, 10 already there" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("where", "extra", "line"),
    [
        ("src-typo/", [], "torchdata-gcs pack: nothing to pack: no object under gs://{b}/src-typo/ (an empty source"),
        ("src/", ["--group-by", "none"], "torchdata-gcs pack: the destination gs://{b}/src/out/ is inside the source"),
        ("src/", [], "torchdata-gcs pack: gs://{b}/src/.x: '.x' has no sample key"),
    ],
)
def test_errors_are_one_line_and_exit_one(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str], where: str, extra: list[str], line: str
) -> None:
    seed(gcs_emulator, gcs_bucket, 2)
    gcs_emulator.seed(gcs_bucket, {"src/.x": b"x"})
    destination = f"gs://{gcs_bucket}/{'src/out/' if 'inside' in line else 'out/'}"
    code = main(["--endpoint", gcs_emulator.endpoint, "pack", f"gs://{gcs_bucket}/{where}", destination, *extra])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith(line.format(b=gcs_bucket)) and err.count("\n") == 1, err


def test_a_bad_shard_size_is_a_usage_error(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "5 GBs", "1.5GB", "-3"):
        with pytest.raises(SystemExit) as exited:
            main(["--endpoint", gcs_emulator.endpoint, "pack", "gs://bkt/src/", "gs://bkt/out/", "--shard-size", bad])
        assert exited.value.code == 2
        assert "--shard-size" in capsys.readouterr().err


def test_the_progress_line_is_rewritten_in_place_on_a_terminal(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    seed(gcs_emulator, gcs_bucket, 60, size=64 * 1024)
    with GCSFront(gcs_emulator.endpoint, latency=0.05, bandwidth=2_000_000) as slow:
        main_fd, terminal = pty.openpty()
        command = [sys.executable, "-m", "torchdata_gcs.cli", "--endpoint", slow.endpoint, "pack"]
        command += [f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/", "--shard-size", "1MiB"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=terminal)
        os.close(terminal)
        seen = b""
        deadline = time.monotonic() + 120
        while child.poll() is None or seen.count(b"\r") < 2:
            try:
                seen += os.read(main_fd, 4096)
            except OSError:  # the terminal closed: the child ended
                break
            assert time.monotonic() < deadline
        os.close(main_fd)
        assert child.wait(60) == 0
        with child.stdout:  # type: ignore[union-attr]  # piped
            summary = child.stdout.read().decode()  # type: ignore[union-attr]  # piped
    updates = [part for part in seen.decode().split("\r") if part.startswith("packing: ")]
    assert len(updates) >= 2, seen
    assert all("objects/s" in update and "MB/s" in update and "\x1b[K" in update for update in updates)
    assert seen.endswith(b"\n") and seen.count(b"\n") == 1  # one line, ended once
    assert "120 objects (60 samples" in summary
