"""Process lifecycle in one place: what each module forgets in a forked child, and what runs when the
process ends (interpreter exit, a multiprocessing worker's exit, SIGTERM), in an order fixed here rather
than by which module happened to be imported first.

Cleanups (deleting temporary objects) run first, at every kind of end; closings (sessions) run after
them, at a normal exit only. The SIGTERM handler can be set only from a main thread: it is set when this
module is imported (a spawned DataLoader worker imports the package while unpickling its DataPipe, on
its main thread) and inherited through fork, so it is in place even where the work runs on another
thread, as in torchdata's prefetcher.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["after_fork", "at_exit", "cleanup", "install", "watch_parent"]

PARENT_CHECK_SECONDS = 1.0
"""How often a worker looks whether its parent is still alive."""

_after_fork: list[Callable[[], None]] = []
_cleanups: list[Callable[[], None]] = []
_closings: list[Callable[[], None]] = []
_pending: list[Callable[[], bool]] = []  # whether some cleanup has work (a watched worker ends only then)
_finalizer_pid: int | None = None  # the process whose multiprocessing finalizer is registered
_watched_pid: int | None = None  # the process whose parent is watched
_previous_sigterm: Any = None  # the SIGTERM handler ours replaced, called after it


def after_fork(forget: Callable[[], None]) -> None:
    """Run ``forget`` in every forked child, before anything else there."""
    _after_fork.append(forget)


def cleanup(run: Callable[[], None], *, pending: Callable[[], bool] | None = None) -> None:
    """Run ``run`` at every end of the process, before any closing; ``pending`` says whether it has work."""
    _cleanups.append(run)
    if pending is not None:
        _pending.append(pending)


def at_exit(close: Callable[[], None]) -> None:
    """Run ``close`` at a normal end of the process, after every cleanup."""
    _closings.append(close)


def _run_cleanups() -> None:
    for run in _cleanups:
        run()


def _exit() -> None:
    _run_cleanups()
    for close in _closings:
        close()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _run_cleanups()
    if callable(_previous_sigterm):
        _previous_sigterm(signum, frame)
    else:  # the default action: die of SIGTERM, as the sender expects
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install() -> None:
    """Make sure this process runs the cleanups at a worker's exit (which skips ``atexit``) and on SIGTERM
    (whose default action skips both); cheap to call often, from any thread."""
    global _finalizer_pid, _previous_sigterm
    if _finalizer_pid != os.getpid() and multiprocessing.parent_process() is not None:
        _finalizer_pid = os.getpid()  # a worker's registry starts empty, and its end skips atexit
        multiprocessing.util.Finalize(None, _run_cleanups, exitpriority=100)
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm or current is signal.SIG_IGN:
        return
    _previous_sigterm = current
    signal.signal(signal.SIGTERM, _on_sigterm)


def watch_parent() -> None:
    """In a worker process, end through SIGTERM (so after the cleanups) once its parent is gone while a
    cleanup has work: a killed parent cannot stop its workers, as torchdata 0.9's cannot."""
    global _watched_pid
    parent = multiprocessing.parent_process()
    if _watched_pid == os.getpid() or parent is None or parent.pid is None:
        return
    _watched_pid = os.getpid()
    threading.Thread(target=_watch, args=(parent.pid,), name="torchdata-gcs-parent", daemon=True).start()


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_SECONDS)
    if any(pending() for pending in _pending):
        os.kill(os.getpid(), signal.SIGTERM)


def _forget_after_fork() -> None:
    for forget in _after_fork:
        forget()


atexit.register(_exit)
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_after_fork)
install()
