"""The one way from a thread onto the I/O loop: a wait that ends early (Ctrl-C, a timeout) cancels the work."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.interrupts import ctrl_c_after
from torchdata_gcs import RetryConfig
from torchdata_gcs._engines.ranges import read_into
from torchdata_gcs._ops.checksums import ObjectInfo
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.loop import run
from torchdata_gcs.testing import Emulator, Fault, GCSFront


async def _tasks_running(name: str) -> list[asyncio.Task[object]]:
    """The loop's tasks whose coroutine is ``name`` (a function's qualified name)."""
    return [task for task in asyncio.all_tasks() if task.get_coro().__qualname__ == name]  # type: ignore[union-attr]


def _gone_within(name: str, seconds: float) -> bool:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        if not run(_tasks_running(name)):
            return True
        time.sleep(0.05)
    return False


def test_a_wait_that_times_out_cancels_the_coroutine() -> None:
    ended = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ended.set()

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 0\.2 s; it was cancelled"):
        run(slow(), timeout=0.2)
    assert time.monotonic() - started < 30
    assert ended.wait(10), "the coroutine kept running after the wait timed out"


def test_a_coroutine_that_raises_timeout_error_is_not_taken_for_the_wait() -> None:
    async def refuses() -> None:
        raise TimeoutError("its own")

    with pytest.raises(TimeoutError, match="its own"):
        run(refuses(), timeout=30)


def test_ctrl_c_while_a_read_waits_cancels_the_read(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """``read_into`` waits for its ranged GETs; Ctrl-C there must stop them, not leave them reading on the
    loop (holding connections and the caller's buffer) after the caller has gone."""
    data = bytes(range(256)) * 64
    gcs_emulator.seed(gcs_bucket, {"big.bin": data})
    with GCSFront(gcs_emulator.endpoint) as front:
        client, retry = front.client_config, RetryConfig(deadline=60)
        info = ObjectInfo.from_json(Client(client, retry).head(gcs_bucket, "big.bin", None))
        front.set_faults([Fault("stall", match="alt=media", stall_seconds=30)])
        target = memoryview(bytearray(len(data)))
        with ctrl_c_after(0.5):
            read_into(target, f"gs://{gcs_bucket}/big.bin", info, Client(client, retry))
        assert _gone_within("read_ranges_into", 5), "the read kept running on the I/O loop after Ctrl-C"
