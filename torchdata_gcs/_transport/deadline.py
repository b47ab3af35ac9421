"""When the request in progress must end: ``RetryConfig.deadline`` after it first went out, or sooner where
it is part of a call (a checkpoint save, an fsspec call) whose whole deadline comes first. Bounds every
attempt and every byte of its answer, not only the waits between attempts."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from collections.abc import Awaitable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

from ..config import RetryConfig
from ..errors import DeadlineExceededError

__all__ = ["TIDY_SECONDS", "Deadline", "call_deadline", "deadline_for", "tidying", "within"]

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
copies the context into a task, ``run_coroutine_threadsafe`` the caller's, ``asyncio.to_thread`` too)."""


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


def deadline_for(retry: RetryConfig, started: float) -> Deadline:
    """The deadline of a request whose first attempt began at ``started``: its own, or its call's if sooner."""
    own = Deadline(started + retry.deadline, retry.deadline, False)
    call = _CALL.get()
    return call if call is not None and call.ends < own.ends else own


if sys.version_info >= (3, 11):

    async def within(deadline: Deadline, work: Coroutine[Any, Any, T], url: str, attempts: int) -> T:
        """Await ``work``, cancelled when ``deadline`` comes (``DeadlineExceededError``)."""
        left = deadline.left()
        if left <= 0:
            work.close()
            raise deadline.exceeded(url, attempts)
        scope = asyncio.timeout(left)
        try:
            async with scope:
                return await work
        except TimeoutError:
            if not scope.expired():
                raise  # the work's own timeout (a read timeout), retried as such
            raise deadline.exceeded(url, attempts) from None

else:  # pragma: no cover - Python 3.10 has no asyncio.timeout

    async def within(deadline: Deadline, work: Coroutine[Any, Any, T], url: str, attempts: int) -> T:
        """Await ``work``, cancelled when ``deadline`` comes (``DeadlineExceededError``)."""
        left = deadline.left()
        if left <= 0:
            work.close()
            raise deadline.exceeded(url, attempts)
        try:
            return await asyncio.wait_for(work, left)
        except asyncio.TimeoutError:
            if deadline.left() > 0:
                raise
            raise deadline.exceeded(url, attempts) from None
