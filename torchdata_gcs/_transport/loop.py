"""The process's asyncio loop: one daemon thread, started on first use, anew after fork.

Every request runs as a coroutine on this loop, so thousands of requests share one thread instead
of contending for the GIL from many; synchronous callers hand work over here only (:func:`run`,
:func:`submit` and :func:`wait`, :class:`Handoff`), which cancels it if they stop waiting."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from . import lifecycle

T = TypeVar("T")

__all__ = ["Handoff", "io_loop", "on_io_loop", "run", "submit", "wait", "wait_unless_on_io_loop"]

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
            lifecycle.after_fork(_forget_after_fork)
        return _loop


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def submit(coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coroutine`` on the I/O loop; a future of its result, which :func:`wait` waits for.
    Cancelling the future cancels the coroutine."""
    return asyncio.run_coroutine_threadsafe(coroutine, io_loop())


def wait(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """The result of a coroutine :func:`submit` started, waited for at most ``timeout`` seconds if given.
    Whatever ends the wait early (Ctrl-C's ``KeyboardInterrupt``, the timeout's ``TimeoutError``) cancels
    the coroutine before it propagates: nothing keeps running, or holding connections, unwatched."""
    try:
        return future.result(timeout)
    except BaseException as exc:
        # Not done when cancelled: the wait timed out, not the coroutine (on Python 3.10, with the futures' own class).
        if future.cancel() and isinstance(exc, (TimeoutError, concurrent.futures.TimeoutError)):
            raise TimeoutError(f"the I/O loop did not finish the work within {timeout:g} s; it was cancelled") from None
        raise


def run(coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coroutine`` on the I/O loop and wait for its result (see :func:`wait`); its own timeouts and
    retry deadline bound the wait unless ``timeout`` does. The one blocking way from a thread onto the loop."""
    if _on_loop(io_loop()):
        coroutine.close()
        raise RuntimeError("a blocking call on the I/O loop's own thread would wait forever")
    return wait(submit(coroutine), timeout)


async def on_io_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await ``coroutine`` on the I/O loop from any event loop (the process's sessions live on that one)."""
    if _on_loop(io_loop()):
        return await coroutine
    return await asyncio.wrap_future(submit(coroutine))


def wait_unless_on_io_loop(coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T | None:
    """Run ``coroutine`` on the I/O loop and wait for its result; on the loop's own thread (say, a
    finalizer the garbage collector ran there), where waiting would wait forever, schedule it and
    return ``None``."""
    if _on_loop(io_loop()):
        # No reference kept: a pending task is held by the loop's queue or by what it awaits (a request's
        # socket, a timer, a lock others hold), so it is collected only if nothing could ever wake it.
        asyncio.ensure_future(coroutine)
        return None
    return wait(submit(coroutine), timeout)


class Handoff:
    """Coroutines and calls for the I/O loop, gathered on another thread and handed over together.

    Each ``call_soon_threadsafe`` wakes the loop through a pipe and costs tens of microseconds on
    both threads (more under GIL contention), as much as a small object's own request work: one
    :meth:`flush` hands over everything gathered since the last. Calls run before the coroutines
    start, in the order they were made. Nothing runs until :meth:`flush`.
    """

    def __init__(self) -> None:
        self._loop = io_loop()
        self._coroutines: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]] = []
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def __len__(self) -> int:
        """Coroutines gathered and not yet handed over."""
        return len(self._coroutines)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """A future of ``coroutine``'s result; cancelling it cancels the coroutine."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._coroutines.append((coroutine, future))
        return future

    def call(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` on the loop at the next flush."""
        self._calls.append((function, args))

    def flush(self) -> None:
        """Hand everything gathered to the loop with one wake-up."""
        if self._coroutines or self._calls:
            self._loop.call_soon_threadsafe(_start, self._calls, self._coroutines)
            self._coroutines, self._calls = [], []


def _start(
    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]],
    coroutines: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]],
) -> None:
    for function, args in calls:
        function(*args)
    loop = asyncio.get_running_loop()
    for coroutine, future in coroutines:
        if future.cancelled():
            coroutine.close()
            continue
        task = loop.create_task(coroutine)
        task.add_done_callback(lambda task, future=future: _settle(future, task))
        future.add_done_callback(
            lambda future, task=task: future.cancelled() and loop.call_soon_threadsafe(task.cancel)
        )


def _settle(future: concurrent.futures.Future[Any], task: asyncio.Task[Any]) -> None:
    """Pass a finished task's outcome to its future, unless the future was cancelled meanwhile."""
    if task.cancelled():
        future.cancel()
    if not future.set_running_or_notify_cancel():
        return
    if task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())


def _forget_after_fork() -> None:
    """A forked child has no loop thread: the next ``io_loop()`` starts one."""
    global _lock, _loop
    _lock, _loop = threading.Lock(), None
