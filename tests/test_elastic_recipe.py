"""docs/elastic.md's recipe, run: ``examples/elastic.py`` under real ``torchrun`` (gloo, CPU) on 2 ranks x 2
workers, where one rank fails and torchrun restarts both from the last DCP checkpoint, then on 3 ranks x 1
worker from where that job stopped. Each rank logs the objects it trained on; counted across the attempts
(each up to the step the next one resumed from), every object of each epoch is trained on exactly once, and
every resume restored the model and optimizer that its checkpoint saved."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from torchdata_gcs.testing._process import free_port

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "elastic.py"
OBJECTS = 48

pytestmark = pytest.mark.timeout(600)


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs, as ``/proc`` tells."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        children = parents.get(queue.pop(), [])
        found += children
        queue += children
    return found


def torchrun(launch: list[str], settings: list[str], cwd: Path) -> str:
    """The example under ``torch.distributed.run``; its output. Killed with every process it started if it
    runs past a generous deadline."""
    environment = {key: value for key, value in os.environ.items() if key != "STORAGE_EMULATOR_HOST"}
    environment["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as docs/elastic.md says: a new store each restart
    command = [sys.executable, "-m", "torch.distributed.run", *launch, str(EXAMPLE), *settings]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=environment,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        ranks = descendants(child.pid)  # torchrun starts each rank in a session of its own: killpg misses them
        os.killpg(child.pid, signal.SIGKILL)
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        output, _ = child.communicate(timeout=30)
        pytest.fail(f"torchrun ran past 240 s: {output[-3000:]}")
    assert child.returncode == 0, output[-5000:]
    return output


def trained(folder: Path, attempt: int, until: int | None = None) -> list[tuple[int, int, str]]:
    """``(epoch, step, url)`` of every object that every rank of ``attempt`` trained on, up to step ``until``."""
    lines = [line.split() for log in sorted(folder.glob(f"reads.{attempt}.*")) for line in log.read_text().splitlines()]
    return [(int(epoch), int(step), url) for epoch, step, url in lines if until is None or int(step) <= until]


def test_stopped_on_two_ranks_restarted_by_torchrun_then_resumed_on_three_trains_on_each_object_once(
    tmp_path: Path,
) -> None:
    data = ["--data-dir", str(tmp_path / "data"), "--objects", str(OBJECTS), "--batch-size", "2"]
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()

    elastic = [
        "--nnodes=1:4", "--nproc-per-node=2", "--max-restarts=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={uuid.uuid4().hex}", "--rdzv-conf=last_call_timeout=1",
    ]  # fmt: skip
    stopped = torchrun(
        elastic,
        [*data, "--workers", "2", "--checkpoint-every", "2", "--fail-at-step", "5", "--stop-at-step", "6",
         "--log-reads", str(first)],
        tmp_path,
    )  # fmt: skip
    saved = dict(re.findall(r"saved gs://elastic/checkpoints/step-\d+ at step (\d+): state (\w+)", stopped))
    assert sorted(saved) == ["2", "4", "6"], stopped
    assert "rank 1 fails at step 5" in stopped
    # torchrun restarted both ranks: they loaded step 4's checkpoint, the model and optimizer as saved
    restarts = re.findall(r"resumed from \S+ at step (\d+) \(epoch (\d+)\): state (\w+)", stopped)
    assert restarts == [("4", "0", saved["4"])], stopped
    assert "training on 2 ranks x 2 workers from step 4, attempt 1" in stopped
    assert "stopping at step 6" in stopped

    resumed = torchrun(
        ["--standalone", "--nproc-per-node=3"],
        [*data, "--workers", "1", "--checkpoint-every", "8", "--log-reads", str(second)],
        tmp_path,
    )
    assert re.findall(r"resumed from \S+ at step (\d+) \(epoch (\d+)\): state (\w+)", resumed) == [
        ("6", "0", saved["6"])
    ], resumed
    assert "training on 3 ranks x 1 workers from step 6, attempt 0" in resumed
    # the rest of epoch 0: 24 objects, 6 a step on 3 ranks; then epoch 1 whole: 48 objects, 8 steps
    assert "epoch 0 done at step 10" in resumed and "epoch 1 done at step 18" in resumed, resumed

    attempts = [trained(first, 0, until=4), trained(first, 1), trained(second, 0)]
    assert [min(step for _, step, _ in reads) for reads in attempts] == [1, 5, 7], "each went on after its checkpoint"
    everything = [read for reads in attempts for read in reads]
    names = {f"gs://elastic/data/{index:05d}.bin" for index in range(OBJECTS)}
    for epoch in (0, 1):
        counts = Counter(url for read_epoch, _, url in everything if read_epoch == epoch)
        assert set(counts) == names, f"epoch {epoch}: {len(names - set(counts))} objects never trained on"
        twice = sorted(url for url, count in counts.items() if count > 1)
        assert not twice, f"epoch {epoch}: {len(twice)} objects trained on more than once: {twice}"
