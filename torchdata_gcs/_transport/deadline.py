"""When the request in progress must end: ``RetryConfig.deadline`` after it first went out, or sooner where
it is part of a call (a checkpoint save, an fsspec call) whose whole deadline comes first. Bounds every
attempt and every byte of its answer, not only the waits between attempts; time spent waiting for the
consumer (room in the byte budget) does not count."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

from ..config import RetryConfig
from ..errors import DeadlineExceededError

__all__ = [
    "TIDY_SECONDS",
    "Deadline",
    "RequestDeadline",
    "call_deadline",
    "consumer_wait",
    "deadline_for",
    "own_deadlines",
    "progress_deadline",
    "tidying",
]

T = TypeVar("T")


class Deadline(NamedTuple):
    """An instant on ``time.monotonic()``'s clock, and the ``RetryConfig.deadline`` (seconds) it came from."""

    ends: float
    seconds: float
    whole_call: bool  # set by call_deadline: it bounds every request of the call, together

    def left(self) -> float:
        return self.ends - time.monotonic()

    def exceeded(self, url: str, attempts: int, failure: BaseException | None = None) -> DeadlineExceededError:
        """The error for a request of ``url`` still unfinished when the deadline came (``failure``: its last)."""
        scope = "the call" if self.whole_call else "the request"
        last = f"; last failure: {failure}" if failure is not None else ""
        return DeadlineExceededError(
            f"{url}: {scope} did not end within RetryConfig.deadline ({self.seconds:g} s, every retry and "
            f"every byte included; {attempts} attempt{'s' if attempts != 1 else ''}){last}",
            url=url,
            status=getattr(failure, "status", None),
        )


_CALL: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("call_deadline", default=None)
"""The deadline of the call in progress; tasks and threads started inside the call inherit it (asyncio
copies the context into a task, :func:`.loop.submit` the caller's, ``asyncio.to_thread`` too)."""


@contextmanager
def call_deadline(retry: RetryConfig) -> Iterator[None]:
    """Make everything run inside one call, ``retry.deadline`` from now at most; inside another call,
    the earlier deadline holds."""
    mine = Deadline(time.monotonic() + retry.deadline, retry.deadline, True)
    outer = _CALL.get()
    token = _CALL.set(mine if outer is None or mine.ends < outer.ends else outer)
    try:
        yield
    finally:
        _CALL.reset(token)


TIDY_SECONDS = 5.0
"""How long past its deadline a call that failed may still spend removing what it left behind (parts, an
unfinished upload) and looking at what a publish whose answer was lost did; at most the deadline itself."""


async def tidying(work: Awaitable[T]) -> T:
    """Await ``work``, which tidies up after a call, under the call's deadline stretched by
    :data:`TIDY_SECONDS` (without a call, each request under its own)."""
    call = _CALL.get()
    stretched = None if call is None else call._replace(ends=call.ends + min(TIDY_SECONDS, call.seconds))
    token = _CALL.set(stretched)
    try:
        return await work
    finally:
        _CALL.reset(token)


async def own_deadlines(work: Awaitable[T]) -> T:
    """Await ``work`` with each request under its own deadline, not the call's: for the one request GCS
    documents as taking minutes (a multipart upload's completion), whose deadline is its own."""
    token = _CALL.set(None)
    try:
        return await work
    finally:
        _CALL.reset(token)


def deadline_for(retry: RetryConfig, started: float) -> Deadline:
    """The deadline of a request whose first attempt began at ``started``: its own, or its call's if sooner."""
    own = Deadline(started + retry.deadline, retry.deadline, False)
    call = _CALL.get()
    return call if call is not None and call.ends < own.ends else own


def progress_deadline(deadline: Deadline, progress: float | None) -> Deadline:
    """A throttled request's deadline: ``deadline.seconds`` after the process last made ``progress`` (its last
    success), if that is later; a call's deadline (``whole_call``) stays as it is."""
    if deadline.whole_call or progress is None:
        return deadline
    return deadline._replace(ends=max(deadline.ends, progress + deadline.seconds))


class _Timer:
    """Cancels the task that runs one attempt when its deadline comes (as ``asyncio.timeout`` does, on Python
    3.10 too), except while :func:`consumer_wait` holds it; armed in its loop's :class:`_Ends`, or with a loop
    timer of its own where it would end before the last one there."""

    __slots__ = ("cancelling", "ends", "expired", "handle", "paused", "task", "when")

    def __init__(self, when: float) -> None:
        self.when, self.paused, self.expired, self.cancelling = when, 0.0, False, 0
        self.task: asyncio.Task[Any] | None = None
        self.handle: asyncio.TimerHandle | None = None
        self.ends: _Ends | None = None  # where it is armed, if there

    def arm(self) -> None:
        loop = asyncio.get_running_loop()  # its clock is time.monotonic()'s
        if not _ends_of(loop).add(self, loop):
            self.handle = loop.call_at(self.when, self.expire)

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.ends is not None:
            self.ends.armed -= 1
            self.ends = None

    @property
    def armed(self) -> bool:
        return self.handle is not None or self.ends is not None

    def expire(self) -> None:
        self.expired = True
        assert self.task is not None
        self.task.cancel()

    def __enter__(self) -> None:
        self.task = asyncio.current_task()
        assert self.task is not None
        # Task.cancelling() and uncancel() (Python 3.11+), as asyncio.timeout uses them
        self.cancelling = 0
        if sys.version_info >= (3, 11):
            self.cancelling = self.task.cancelling()
        self.arm()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.disarm()
        task, self.task = self.task, None
        if not self.expired:
            return
        assert task is not None
        left = 0
        if sys.version_info >= (3, 11):
            left = task.uncancel()
        if left <= self.cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError  # ours, and no one else's cancellation: the deadline came


class _Ends:
    """One loop's armed attempt timers in the order they end, under one loop timer (the first's): the attempts
    of one retry policy end in the order they began, so arming a timer is an append here and disarming it a
    count, where a loop timer each is a handle pushed into the loop's heap and later sifted out of it."""

    __slots__ = ("armed", "handle", "queue")

    def __init__(self) -> None:
        self.queue: deque[_Timer] = deque()
        self.armed = 0  # timers in the queue still armed (the others are dropped as they come first)
        self.handle: asyncio.TimerHandle | None = None

    def add(self, timer: _Timer, loop: asyncio.AbstractEventLoop) -> bool:
        """Arm ``timer`` here, unless it would end before the last one armed here."""
        queue = self.queue
        if queue and timer.when < queue[-1].when:
            return False
        queue.append(timer)
        timer.ends = self
        self.armed += 1
        if len(queue) > 2 * self.armed + 64:  # disarmed ones wait behind one that lasts: let them go
            self.queue = queue = deque(kept for kept in queue if kept.ends is self)
        if self.handle is None:
            self.handle = loop.call_at(queue[0].when, self.fire, loop)
        return True

    def fire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Expire the timers whose time has come, drop the disarmed ones before them, wait for the next."""
        self.handle = None
        queue, now = self.queue, loop.time()
        while queue and (queue[0].ends is not self or queue[0].when <= now):
            timer = queue.popleft()
            if timer.ends is self:
                timer.ends = None
                self.armed -= 1
                timer.expire()
        if queue:
            self.handle = loop.call_at(queue[0].when, self.fire, loop)


_ENDS: dict[int, _Ends] = {}  # by id(loop): see _ends_of


def _ends_of(loop: asyncio.AbstractEventLoop) -> _Ends:
    """``loop``'s :class:`_Ends`, made at its first attempt and dropped with the loop."""
    ends = _ENDS.get(id(loop))
    if ends is None:
        ends = _ENDS[id(loop)] = _Ends()
        weakref.finalize(loop, _ENDS.pop, id(loop), None)
    return ends


_ATTEMPTS: dict[asyncio.Task[Any], _Timer] = {}
"""The timer of each task's attempt in progress (of the inner one, while an attempt makes a request of its own)."""


@contextmanager
def consumer_wait() -> Iterator[None]:
    """Stop the clock of the attempt in progress while it waits for the consumer (room in the byte
    budget): a consumer busy for longer than the deadline is no server failing to answer."""
    timer = _ATTEMPTS.get(asyncio.current_task())  # type: ignore[arg-type]  # None (no task) finds none
    if timer is None or timer.expired or not timer.armed:
        yield
        return
    timer.disarm()
    paused = time.monotonic()
    try:
        yield
    finally:
        waited = time.monotonic() - paused
        timer.when += waited
        timer.paused += waited
        timer.arm()


class RequestDeadline:
    """One request's deadline (see :func:`deadline_for`), moved later by the time its attempts waited for
    the consumer (:func:`consumer_wait`)."""

    __slots__ = ("deadline",)

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline

    async def attempt(self, work: Coroutine[Any, Any, T], url: str, attempts: int) -> T:
        """Await ``work``, cancelled when the deadline comes (``DeadlineExceededError``)."""
        deadline = self.deadline
        if deadline.left() <= 0:
            work.close()
            raise deadline.exceeded(url, attempts)
        timer = _Timer(deadline.ends)
        task = asyncio.current_task()
        assert task is not None
        outer = _ATTEMPTS.get(task)
        _ATTEMPTS[task] = timer
        try:
            with timer:
                return await work
        except TimeoutError:
            if not timer.expired:
                raise  # the work's own timeout (a read timeout), retried as such
            raise deadline.exceeded(url, attempts) from None
        finally:
            if outer is None:
                del _ATTEMPTS[task]
            else:
                _ATTEMPTS[task] = outer
            if timer.paused:
                self.deadline = deadline._replace(ends=deadline.ends + timer.paused)
