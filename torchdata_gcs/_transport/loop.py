"""The process's asyncio loop: one daemon thread, started on first use, anew after fork, ended at exit.

Every request runs as a coroutine on this loop, so thousands of requests share one thread instead
of contending for the GIL from many; synchronous callers hand work over here only (:func:`run`,
:func:`submit` and :func:`wait`, :func:`iterate`, :class:`Handoff`), which cancels it if they stop waiting.
At a normal exit, the streams still open are closed (their requests cancelled), then the loop ends; from
then on, and while the interpreter finalizes (when the loop's thread is frozen), nothing waits on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterable
from typing import Any, Generic, Protocol, TypeVar, cast

from . import lifecycle

T = TypeVar("T")
C = TypeVar("C", bound="_Closable")

__all__ = [
    "Handoff",
    "Slot",
    "close_at_exit",
    "io_loop",
    "iterate",
    "on_io_loop",
    "run",
    "submit",
    "wait",
    "wait_unless_on_io_loop",
]

CLOSE_SECONDS = 10.0
"""How long closing a stream waits for the loop to cancel its work (it takes milliseconds)."""

END_SECONDS = 5.0
"""How long the end of the process waits for the loop to finish what is left on it."""

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_ending = threading.Event()  # set when the exit's wind-down starts cancelling what is left on the loop


class _Closable(Protocol):
    def close(self) -> None: ...


# What to close at exit, with how: streams (closed) and writers (aborted) of this process.
_open: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def io_loop() -> asyncio.AbstractEventLoop:
    """This process's I/O loop, running in its own thread."""
    global _loop, _thread
    with _lock:
        if _loop is None:
            if sys.is_finalizing():
                raise RuntimeError("the interpreter is exiting: no new I/O can start")
            loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=loop.run_forever, name="torchdata-gcs-io", daemon=True)
            _thread.start()
            _loop = loop
            lifecycle.after_fork(_forget_after_fork)
            lifecycle.stop_at_exit(_close_open_streams)
            lifecycle.at_exit(_end_at_exit, last=True)
        return _loop


def _usable(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether work handed to ``loop`` will run: it is this process's loop, its thread is alive and the
    interpreter is not finalizing (when a daemon thread such as the loop's is frozen for good)."""
    return loop is _loop and _thread is not None and _thread.is_alive() and not sys.is_finalizing()


def close_at_exit(stream: C, close: Callable[[C], None] | None = None) -> C:
    """``stream`` (a generator or reader whose ``close`` cancels its work on the loop), closed at a normal
    exit while the loop still runs, if it is still open then, by ``close(stream)`` if given (a writer's
    abort: what is not published by then never is); returns it."""
    _open[stream] = close or _close
    return stream


def _close(stream: _Closable) -> None:
    stream.close()


def _close_open_streams() -> None:
    """At exit: close what is still open (a stream half-read at module level, or kept by a reference
    cycle), so that its requests are cancelled while the loop runs, not left to the finalizing interpreter."""
    for stream, close in list(_open.items()):
        # A generator another thread is inside cannot be closed; its thread is frozen at finalization.
        with contextlib.suppress(ValueError):
            close(stream)


def _end_at_exit() -> None:
    """At exit, after every closing: cancel what is still on the loop, let it unwind, and end the loop, so that
    nothing is left pending (asyncio's "Task was destroyed but it is pending!") when the interpreter finalizes."""
    global _loop, _thread
    with _lock:
        loop, thread, _loop, _thread = _loop, _thread, None, None
    if loop is None or thread is None or not thread.is_alive():
        return
    _ending.set()
    try:
        asyncio.run_coroutine_threadsafe(_wind_down(), loop).result(END_SECONDS)
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
        pass  # something would not unwind: the loop is left as it is, and never waited for again
    else:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(END_SECONDS)
        if not thread.is_alive():
            loop.close()


async def _wind_down() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def submit(coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coroutine`` on the I/O loop; a future of its result, which :func:`wait` waits for.
    Cancelling the future cancels the coroutine. While the interpreter finalizes, raises ``RuntimeError``."""
    try:
        loop = io_loop()
        if not _usable(loop):
            raise RuntimeError("the interpreter is exiting: the I/O loop runs no more work")
    except BaseException:
        coroutine.close()  # never started: no "never awaited" warning
        raise
    return asyncio.run_coroutine_threadsafe(coroutine, loop)


def wait(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """The result of a coroutine :func:`submit` started, waited for at most ``timeout`` seconds if given.
    Whatever ends the wait early (Ctrl-C's ``KeyboardInterrupt``, the timeout's ``TimeoutError``) cancels
    the coroutine before it propagates: nothing keeps running, or holding connections, unwatched."""
    try:
        return future.result(timeout)
    except concurrent.futures.CancelledError:
        if _ending.is_set():  # only daemon threads run now: this one waits to be frozen, not to print a traceback
            threading.Event().wait()
        raise
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
    return ``None``; where nothing would run it (the loop has ended, the interpreter finalizes), drop it
    and return ``None``."""
    loop = _loop
    if loop is None or not _usable(loop):
        coroutine.close()
        return None
    if _on_loop(loop):
        # No reference kept: a pending task is held by the loop's queue or by what it awaits (a request's
        # socket, a timer, a lock others hold), so it is collected only if nothing could ever wake it.
        asyncio.ensure_future(coroutine)
        return None
    return wait(submit(coroutine), timeout)


def iterate(items: AsyncGenerator[T, None]) -> Generator[T, None, None]:
    """The items of ``items``, an async generator run on the I/O loop, for a blocking caller (each one
    :func:`run`); when the caller stops early (closes this iterator, or Ctrl-C ends a wait), ``items`` is
    closed there, so nothing of it keeps running. Closed at exit if still open (:func:`close_at_exit`)."""
    return close_at_exit(_iterate(items))


def _iterate(items: AsyncGenerator[T, None]) -> Generator[T, None, None]:
    try:
        while (item := run(_next(items))) is not _END:
            yield cast(T, item)  # anything but _END is an item
    finally:
        with contextlib.suppress(TimeoutError):  # not closed in time: the loop's end at exit cancels it
            wait_unless_on_io_loop(_aclose(items), CLOSE_SECONDS)


_END = object()


async def _next(items: AsyncGenerator[T, None]) -> T | object:
    try:
        return await anext(items)
    except StopAsyncIteration:
        return _END


async def _aclose(items: AsyncGenerator[Any, None]) -> None:
    while getattr(items, "ag_running", False):  # the step a Ctrl-C cancelled is still unwinding
        await asyncio.sleep(0)
    await items.aclose()


class Handoff:
    """Coroutines and calls for the I/O loop, gathered on another thread and handed over together.

    Each ``call_soon_threadsafe`` wakes the loop through a pipe and costs tens of microseconds on
    both threads (more under GIL contention), as much as a small object's own request work: one
    :meth:`flush` hands over everything gathered since the last. Calls run before the coroutines
    start, in the order they were made. Nothing runs until :meth:`flush`. Each coroutine's result
    comes back in a :class:`Slot`, all of a handoff's sharing one condition to wait on.
    """

    def __init__(self) -> None:
        self._loop = io_loop()
        self._settled = threading.Condition()
        self._coroutines: list[tuple[Coroutine[Any, Any, Any], Slot[Any]]] = []
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def __len__(self) -> int:
        """Coroutines gathered and not yet handed over."""
        return len(self._coroutines)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Slot[T]:
        """A slot for ``coroutine``'s result; cancelling it cancels the coroutine."""
        slot: Slot[T] = Slot(self._loop, self._settled)
        self._coroutines.append((coroutine, slot))
        return slot

    def call(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` on the loop at the next flush."""
        self._calls.append((function, args))

    def cancel(self, slots: Iterable[Slot[Any]]) -> None:
        """Cancel ``slots`` (of this handoff) and, at the next flush, their coroutines."""
        cancelled = [slot for slot in slots if slot._cancel()]
        if cancelled:
            self.call(_cancel_tasks, cancelled)

    def flush(self) -> None:
        """Hand everything gathered to the loop with one wake-up; where the loop runs no more work (the
        process is ending), close the coroutines instead."""
        if self._coroutines or self._calls:
            coroutines, calls, self._coroutines, self._calls = self._coroutines, self._calls, [], []
            if _usable(self._loop):
                self._loop.call_soon_threadsafe(_start, calls, coroutines)
            else:
                for coroutine, slot in coroutines:
                    coroutine.close()
                    slot._cancel()


_NOTHING_TO_WAIT_FOR = threading.Condition()
"""The condition of slots that hold their result from the start: never waited on."""


class Slot(Generic[T]):
    """One handed-over coroutine's result: what a ``concurrent.futures.Future`` gives a waiting thread,
    in one small object without a lock, condition or callback list of its own (thousands of results
    alive at once stay cheap for the garbage collector)."""

    __slots__ = ("_loop", "_settled", "_task", "_done", "_cancelled", "_awaited", "_result", "_error")

    def __init__(self, loop: asyncio.AbstractEventLoop, settled: threading.Condition) -> None:
        self._loop, self._settled = loop, settled
        self._task: asyncio.Task[T] | None = None
        self._done = self._cancelled = False
        self._awaited = False  # whether a thread waits for this slot (its result wakes it; no other does)
        self._result: T | None = None
        self._error: BaseException | None = None

    @classmethod
    def holding(cls, result: T) -> Slot[T]:
        """A slot whose result is already in (no coroutine, nothing on the loop)."""
        slot: Slot[T] = cls(io_loop(), _NOTHING_TO_WAIT_FOR)
        slot._done, slot._result = True, result
        return slot

    def done(self) -> bool:
        """Whether the result (or error, or cancellation) is in."""
        return self._done

    def cancelled(self) -> bool:
        return self._cancelled

    def result(self, timeout: float | None = None) -> T:
        """The coroutine's result, or its exception raised; waits at most ``timeout`` seconds if given."""
        if not self._done:
            with self._settled:
                self._awaited = True
                if not self._settled.wait_for(self.done, timeout):
                    raise concurrent.futures.TimeoutError
        if self._error is not None:
            raise self._error
        return cast(T, self._result)  # done without an error: the result is in

    def cancel(self) -> bool:
        """Cancel the coroutine (at once, on the loop); ``False`` if its result is already in."""
        if not self._cancel():
            return False
        if _usable(self._loop):
            self._loop.call_soon_threadsafe(_cancel_tasks, [self])
        return True

    def _cancel(self) -> bool:
        with self._settled:
            if self._done:
                return self._cancelled
            self._cancelled = self._done = True
            self._error = concurrent.futures.CancelledError()
            self._settled.notify_all()
        return True

    def __call__(self, task: asyncio.Task[T]) -> None:
        """The task's done callback (the slot itself, so no bound method is kept per task)."""
        with self._settled:
            if self._done:
                return
            if task.cancelled():
                self._cancelled, self._error = True, concurrent.futures.CancelledError()
            elif task.exception() is not None:
                self._error = task.exception()
            else:
                self._result = task.result()
            self._done = True
            self._task = None
            if self._awaited:  # the waiting thread wakes for its own slot only, not for every other one's
                self._settled.notify_all()


def _start(
    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]],
    coroutines: list[tuple[Coroutine[Any, Any, Any], Slot[Any]]],
) -> None:
    for function, args in calls:
        function(*args)
    loop = asyncio.get_running_loop()
    for coroutine, slot in coroutines:
        if slot._cancelled:
            coroutine.close()
            continue
        slot._task = task = loop.create_task(coroutine)
        task.add_done_callback(slot)


def _cancel_tasks(slots: list[Slot[Any]]) -> None:
    """On the loop: cancel the started tasks of cancelled slots (those not started yet never will be)."""
    for slot in slots:
        if slot._task is not None:
            slot._task.cancel()
            slot._task = None


def _forget_after_fork() -> None:
    """A forked child has no loop thread and none of its parent's streams: the next ``io_loop()`` starts one."""
    global _lock, _loop, _thread
    _lock, _loop, _thread = threading.Lock(), None, None
    _open.clear()
