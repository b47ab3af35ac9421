"""The process's asyncio loop: one daemon thread, started on first use, anew after fork.

Every request runs as a coroutine on this loop, so thousands of requests share one thread instead
of contending for the GIL from many; synchronous callers hand work over with :func:`run`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import lifecycle

T = TypeVar("T")

__all__ = ["io_loop", "on_io_loop", "run", "wait_unless_on_io_loop"]

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


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the I/O loop and wait for its result (its own timeouts and retry deadline
    bound the wait); an interruption such as Ctrl-C cancels it before it propagates."""
    loop = io_loop()
    if _on_loop(loop):
        coroutine.close()
        raise RuntimeError("a blocking call on the I/O loop's own thread would wait forever")
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


async def on_io_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await ``coroutine`` on the I/O loop from any event loop (the process's sessions live on that one)."""
    loop = io_loop()
    if _on_loop(loop):
        return await coroutine
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))


def wait_unless_on_io_loop(coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T | None:
    """Run ``coroutine`` on the I/O loop and wait for its result; on the loop's own thread (say, a
    finalizer the garbage collector ran there), where waiting would wait forever, schedule it and
    return ``None``."""
    loop = io_loop()
    if _on_loop(loop):
        asyncio.ensure_future(coroutine)
        return None
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)


def _forget_after_fork() -> None:
    """A forked child has no loop thread: the next ``io_loop()`` starts one."""
    global _lock, _loop
    _lock, _loop = threading.Lock(), None


lifecycle.after_fork(_forget_after_fork)
