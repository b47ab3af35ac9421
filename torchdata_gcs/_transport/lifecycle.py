"""Process lifecycle in one place: what each module forgets in a forked child, and what runs when the
process ends (interpreter exit, a multiprocessing worker's exit), in an order fixed here rather than by
which module happened to be imported first.

At a normal exit, in this order: stops (what still reads or writes: open streams and writers), cleanups
(deleting temporary objects), closings (sessions), and last the I/O loop's own end. Nothing is
registered at import: the process-wide hooks (``atexit``, ``os.register_at_fork``, a worker's
finalizer) are set when a module first registers something, at its first use. No signal
handler is ever set: a process ended by a signal leaves its temporary objects to the reaper
(:mod:`.reaper`).
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
from typing import TypeVar

__all__ = ["after_fork", "at_exit", "cleanup", "install", "stop_at_exit", "watch_parent"]

T = TypeVar("T")

PARENT_CHECK_SECONDS = 1.0
"""How often a worker looks whether its parent is still alive."""

_after_fork: list[Callable[[], None]] = []
_stops: list[Callable[[], None]] = []
_cleanups: list[Callable[[], None]] = []
_closings: list[Callable[[], None]] = []
_lasts: list[Callable[[], None]] = []
_pending: list[Callable[[], bool]] = []  # whether some cleanup has work (a watched worker ends only then)
_hooked = False  # atexit and at-fork hooks registered (inherited through fork, as the registrations are)
_finalizer_pid: int | None = None  # the process whose multiprocessing finalizer is registered
_watched_pid: int | None = None  # the process whose parent is watched


def _add(registry: list[T], item: T) -> None:
    """Add ``item`` once: modules register at every first use, again after a fork."""
    if item not in registry:
        registry.append(item)
    _hook()


def after_fork(forget: Callable[[], None]) -> None:
    """Run ``forget`` in every forked child, before anything else there."""
    _add(_after_fork, forget)


def cleanup(run: Callable[[], None], *, pending: Callable[[], bool] | None = None) -> None:
    """Run ``run`` at every normal end of the process, before any closing; ``pending`` says whether it has work."""
    _add(_cleanups, run)
    if pending is not None:
        _add(_pending, pending)
    install()


def stop_at_exit(stop: Callable[[], None]) -> None:
    """Run ``stop`` at a normal end of the process, before any cleanup."""
    _add(_stops, stop)


def at_exit(close: Callable[[], None], *, last: bool = False) -> None:
    """Run ``close`` at a normal end of the process, after every cleanup (``last``: after every other closing)."""
    _add(_lasts if last else _closings, close)


def _run_cleanups() -> None:
    for run in _cleanups:
        run()


def _exit() -> None:
    for stop in _stops:
        stop()
    _run_cleanups()
    for close in _closings + _lasts:
        close()


def _forget_after_fork() -> None:
    for forget in _after_fork:
        forget()


def _hook() -> None:
    global _hooked
    if _hooked:
        return
    _hooked = True
    atexit.register(_exit)
    if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
        os.register_at_fork(after_in_child=_forget_after_fork)


def install() -> None:
    """Make sure this process runs the cleanups at a multiprocessing worker's exit, which skips
    ``atexit``; cheap to call often, from any thread."""
    global _finalizer_pid
    _hook()
    if _finalizer_pid != os.getpid() and multiprocessing.parent_process() is not None:
        _finalizer_pid = os.getpid()  # a worker's registry starts empty
        multiprocessing.util.Finalize(None, _run_cleanups, exitpriority=100)


def watch_parent() -> None:
    """In a worker process, end through SIGTERM once its parent is gone while a cleanup has work: a
    killed parent cannot stop its workers, as torchdata 0.9's cannot. SIGTERM's default action ends
    the worker at once; its reaper then deletes what it left."""
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
