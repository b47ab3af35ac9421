"""Ranks of one gloo process group, forked from the test process (which has imported torch already, so
they start fast), ranks told by torchrun's environment variables, and the list requests a front received."""

from __future__ import annotations

import datetime
import multiprocessing
import pickle
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from torchdata_gcs import ClientConfig
from torchdata_gcs.testing import GCSFront

DEADLINE = 90.0  # seconds for a whole run of ranks, start to end


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int, per_node: int | None = None) -> None:
    """Make this process rank ``rank`` of ``world`` as torchrun tells it (``RANK``, ``WORLD_SIZE``), on nodes of
    ``per_node`` ranks each if given (``LOCAL_WORLD_SIZE``, ``GROUP_RANK``), else on no node named."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    if per_node is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        monkeypatch.delenv("GROUP_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
        monkeypatch.setenv("GROUP_RANK", str(rank // per_node))


def list_requests(front: GCSFront, since: int = 0) -> Counter[str]:
    """List requests a front made with ``record=True`` received after its first ``since`` requests, by bucket."""
    return Counter(
        request.target.split("/")[4]
        for request in front.recorded[since:]
        if request.method == "GET" and request.target.startswith("/storage/v1/b/") and "/o?" in request.target
    )


def _rank(
    rank: int, world: int, folder: str, timeout: float, work: Callable[[int, ClientConfig], Any], endpoint: str
) -> None:
    outcome: dict[str, Any] = {}
    torch.set_num_threads(1)  # forked after this process's OpenMP pool started, a parallel op would hang
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{folder}/store",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
        )
        outcome["result"] = work(rank, ClientConfig(endpoint=endpoint))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome["error"] = (type(exc).__name__, str(exc), traceback.format_exc())
    try:  # no rank leaves while another is still starting its process group
        dist.barrier()
    except (RuntimeError, ValueError):  # a rank that never started one, or one that outwaited the timeout
        pass
    Path(folder, f"rank-{rank}.pkl").write_bytes(pickle.dumps(outcome))


def run_ranks(
    world: int,
    folder: Path,
    endpoint: str,
    work: Callable[[int, ClientConfig], Any],
    timeout: float = 60.0,
    killed: int | None = None,
) -> list[dict[str, Any]]:
    """Run ``work(rank, client)`` on ``world`` forked ranks of one gloo process group (``timeout`` seconds
    for its collectives); each rank's ``{"result": ...}`` or ``{"error": (type name, message, traceback)}``,
    and ``{"killed": True}`` for rank ``killed``, which must end killed by SIGKILL."""
    context = multiprocessing.get_context("fork")
    ranks = [
        context.Process(target=_rank, args=(rank, world, str(folder), timeout, work, endpoint)) for rank in range(world)
    ]
    for process in ranks:
        process.start()
    end = time.monotonic() + DEADLINE
    for process in ranks:
        process.join(max(end - time.monotonic(), 0.1))
    hung = [rank for rank, process in enumerate(ranks) if process.is_alive()]
    for rank in hung:
        ranks[rank].kill()
    assert not hung, f"ranks {hung} still running after {DEADLINE} s"
    assert [process.exitcode for process in ranks] == [-9 if rank == killed else 0 for rank in range(world)]
    return [
        {"killed": True} if rank == killed else pickle.loads((folder / f"rank-{rank}.pkl").read_bytes())
        for rank in range(world)
    ]
