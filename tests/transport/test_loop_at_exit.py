"""The I/O loop at the end of a process: streams still open are closed while the loop runs (their work
cancelled), then the loop ends, and nothing after that waits on it or prints, at any point of the exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

PRELUDE = """
import asyncio, sys, threading
from torchdata_gcs._transport.loop import Handoff, iterate, run, submit, wait_unless_on_io_loop

async def endless(name):
    try:
        for i in range(10**9):
            await asyncio.sleep(0.001)
            yield i
    finally:
        print(f"{name} closed", flush=True)
"""


def run_script(code: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=30, check=False
    )
    return done, time.monotonic() - started


def test_a_stream_left_half_read_at_module_level_is_closed_at_exit_while_the_loop_runs() -> None:
    done, _ = run_script(
        """
        items = iterate(endless("listing"))
        print(next(items), next(items), flush=True)
        """
    )
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["0", "1", "listing", "closed"], "")


def test_a_stream_kept_by_a_reference_cycle_is_closed_at_exit() -> None:
    done, _ = run_script(
        """
        def train():
            holder = {}
            holder["self"], holder["items"] = holder, iterate(endless("cycle"))
            next(holder["items"])

        import gc
        gc.disable()  # only the end of the process collects it
        train()
        """
    )
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["cycle", "closed"], "")


def test_a_stream_another_thread_waits_in_does_not_hold_the_exit() -> None:
    done, seconds = run_script(
        """
        async def never():
            await asyncio.Event().wait()
            yield None

        started = threading.Event()
        def reader():
            items = iterate(never())
            started.set()
            next(items)

        threading.Thread(target=reader, daemon=True).start()
        started.wait()
        """
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert seconds < 30


def test_after_the_loop_has_ended_work_is_dropped_without_waiting_or_a_warning() -> None:
    """An ``atexit`` handler registered before the loop's own (so run after it): closing, cancelling and
    handing over neither waits nor prints "coroutine was never awaited"."""
    done, _ = run_script(
        """
        import atexit, gc

        async def work():
            return 1

        def late():
            items.close()
            print(wait_unless_on_io_loop(work()), flush=True)
            handoff.submit(work())
            handoff.flush()
            gc.collect()
            print("done", flush=True)

        atexit.register(late)
        handoff = Handoff()
        items = iterate(endless("listing"))
        next(items)
        """
    )
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["listing", "closed", "None", "done"], "")
