"""The process's asyncio loop for object reads: one daemon thread, started on first use, anew after fork.

Reads run as coroutines on this loop, so thousands of requests share one thread instead of
contending for the GIL from many; DataPipes hand work over with ``run_coroutine_threadsafe``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import lifecycle

T = TypeVar("T")

__all__ = ["io_loop", "wait_unless_on_io_loop"]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def io_loop() -> asyncio.AbstractEventLoop:
    """This process's I/O loop, running in its own thread."""
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="torchdata-gcs-io", daemon=True).start()
            _loop = loop
        return _loop


def wait_unless_on_io_loop(coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T | None:
    """Run ``coroutine`` on the I/O loop and wait for its result; on the loop's own thread (say, a
    finalizer the garbage collector ran there), where waiting would wait forever, schedule it and
    return ``None``."""
    loop = io_loop()
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop:
        asyncio.ensure_future(coroutine)
        return None
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)


def _forget_after_fork() -> None:
    """A forked child has no loop thread: the next ``io_loop()`` starts one."""
    global _lock, _loop
    _lock, _loop = threading.Lock(), None


lifecycle.after_fork(_forget_after_fork)
