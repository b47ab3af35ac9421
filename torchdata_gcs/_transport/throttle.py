"""The process's answer to HTTP 429: fewer requests in flight, a slower pace, and one backoff for all.

GCS answers 429 when a bucket or an object is used faster than it can scale. Retrying every request
after its own backoff keeps the pressure on, and so do many processes each starting at full speed;
here every loader and writer of the process shares one :class:`Throttle`: after a 429 it halves the
requests in flight and paces new requests (retries included) at a share of what the bucket granted
lately, grows both back as requests succeed, and holds the backoff step its 429 retries wait by.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

__all__ = ["CUT_INTERVAL", "Throttle"]

CEILING = 4096
"""The limit when nothing has been throttled: per-loader limits (``max_in_flight``) bind first."""

CUT_INTERVAL = 0.25
"""Seconds after a cut during which further 429s cut nothing more (the backoff step grows at most this often).
A quarter second, not more: the first cut's estimate of what succeeded comes from a young window and can be
too high, and a pace still over the bucket's rate is then cut again at once; with a second, three processes
starting together drew 29% of their reads as 429s, with a quarter 20%."""

DECREASE = 0.7
"""A cut sets the pace to this share of the requests per second that succeeded lately."""

GROWTH = 10.0
"""Each success raises the pace by this over the pace: a pace that is met grows by this many requests per
second each second, whatever it is, so processes that share a bucket converge on equal shares (additive
increase, multiplicative decrease)."""

QUIET = 3.0
"""Seconds without a cut after which a met pace grows in proportion again (as TCP's slow start)."""

SPURT = 0.1
"""After :data:`QUIET` seconds without a cut, each success raises the pace by at least this: a met pace grows
by a tenth each second, fast enough to follow the bucket's doubling, while after a recent cut growth stays
additive so that processes sharing a bucket converge."""

MIN_PACE = 10.0
"""Requests per second a cut never goes below (and where the first cut starts if nothing got through): slower
than that, the shared backoff step slows a process whose requests keep being refused (it grows while nothing
succeeds), not the pace."""


class _Rate:
    """Events per second over about the last second (two one-second windows)."""

    __slots__ = ("before", "count", "start")

    def __init__(self) -> None:
        self.start, self.count, self.before = float("-inf"), 0, 0

    def add(self, now: float) -> None:
        if now - self.start >= 1.0:
            self.start, self.count, self.before = now, 0, (self.count if now - self.start < 2.0 else 0)
        self.count += 1

    def per_second(self, now: float) -> float:
        elapsed = now - self.start
        if elapsed >= 2.0:
            return 0.0
        if elapsed >= 1.0 or not self.before:  # a young first window: over-estimating costs one more cut
            return self.count / max(elapsed, 0.1)
        return (self.count + self.before) / (1.0 + elapsed)


class Throttle:
    """Admits requests while fewer than ``limit`` are in flight, and, once a 429 came, no faster than
    ``pace`` per second; lives on the I/O loop."""

    def __init__(self, ceiling: int = CEILING) -> None:
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.in_flight = 0
        self.pace: float | None = None  # requests per second; None until the first 429
        self.level = 0  # the backoff step of 429 retries: one more per cut, back to 0 on a success
        self.progress: float | None = None  # time.monotonic() of the last success (before any: the first request)
        self._waiting = 0
        self._last_cut = float("-inf")
        self._next_start = 0.0
        self._queue: deque[asyncio.Future[None]] = deque()  # new requests waiting for their turn at the pace
        self._retries: deque[asyncio.Future[None]] = deque()  # retries waiting: they go first
        self._pacer: asyncio.Task[None] | None = None
        self._succeeded = _Rate()
        self._free = asyncio.Condition()

    def admit(self) -> bool:
        """Let a new request in at once if it need not wait (no pace set since no 429 came, room in flight): as
        :meth:`acquire` without a coroutine, for the many requests that never wait; ``False`` leaves it to that."""
        if self.pace is not None or self.in_flight >= self.limit:
            return False
        if self.progress is None:
            self.progress = time.monotonic()
        self.in_flight += 1
        return True

    async def acquire(self, paced: bool = True, retry: bool = False) -> None:
        """Wait for the request's turn at the pace (unless not ``paced``: a request resuming; a ``retry`` goes
        before the new requests waiting, as a reader in order waits for it first), then for room."""
        if paced and self.pace is not None:
            now = time.monotonic()
            if self._queue or self._retries or now < self._next_start:
                turn = asyncio.get_running_loop().create_future()
                (self._retries if retry else self._queue).append(turn)
                if self._pacer is None:
                    self._pacer = asyncio.ensure_future(self._pace_queue())
                await turn
            else:
                self._next_start = now + 1.0 / self.pace
        if paced and self.progress is None:
            self.progress = time.monotonic()
        if self.in_flight >= self.limit:
            self._waiting += 1
            try:
                async with self._free:
                    await self._free.wait_for(lambda: self.in_flight < self.limit)
            finally:
                self._waiting -= 1
        self.in_flight += 1

    async def _pace_queue(self) -> None:
        """Let the waiting requests go one by one, each ``1 / pace`` after the one before (the pace in force then)."""
        try:
            while self._queue or self._retries:
                wait = self._next_start - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                turn = (self._retries or self._queue).popleft()
                if turn.done():  # its request was cancelled
                    continue
                turn.set_result(None)
                assert self.pace is not None
                self._next_start = max(self._next_start, time.monotonic() - 1.0 / self.pace) + 1.0 / self.pace
        finally:
            self._pacer = None

    def leave(self) -> None:
        """A request is done: one fewer in flight, and a request waiting for room is let look (in a task of its
        own: only when one waits)."""
        self.in_flight -= 1
        if self._waiting:
            # No reference kept: the task is in the loop's queue, or waits on the condition's lock, which this
            # throttle holds; it can only be collected along with the throttle and the requests waiting on it.
            asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._free:
            self._free.notify()

    def throttled(self, sent: float | None = None) -> None:
        """A request sent at ``sent`` (``time.monotonic()``) got 429: halve the limit, set the pace to a share of
        what succeeded lately, and step the shared backoff up. Answers to requests sent before the last cut, and
        any within :data:`CUT_INTERVAL` of it, cut nothing more: one burst counts once."""
        now = time.monotonic()
        if now - self._last_cut < CUT_INTERVAL or (sent is not None and sent < self._last_cut):
            return
        self._last_cut = now
        self.level += 1
        self.limit = max(1.0, min(self.limit, self.in_flight) / 2)
        granted = self._succeeded.per_second(now)  # 0 when nothing got through: start from MIN_PACE
        if self.pace is not None:  # at most halved per cut: a process others crowd out still gets its turns
            granted = max(min(granted, self.pace), self.pace / (2 * DECREASE))
        self.pace = max(MIN_PACE, DECREASE * granted)

    def succeeded(self) -> None:
        """A request succeeded: grow the limit by one per ``limit`` successes, and the pace as :data:`GROWTH`
        and :data:`SPURT` say; the backoff step goes back to 0."""
        now = time.monotonic()
        self.progress = now
        self.level = 0
        self._succeeded.add(now)
        if self.limit < self.ceiling:
            self.limit = min(float(self.ceiling), self.limit + 1 / self.limit)
        if self.pace is not None:
            quiet = now - self._last_cut >= QUIET
            self.pace += max(GROWTH / self.pace, SPURT if quiet else 0.0)
