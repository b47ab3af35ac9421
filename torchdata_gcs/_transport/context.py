"""The request context every engine shares: the process's session, retry policy, concurrency slots,
byte budget and statistics, and the one way a request is sent under them (:func:`with_retry`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from ..config import ClientConfig, RetryConfig, TransferConfig
from .deadline import RequestDeadline, consumer_wait, deadline_for, progress_deadline
from .retry import Attempts
from .session import Destination, Session, session_for
from .slots import Slots

__all__ = ["ByteBudget", "ConsumerGone", "LoadStats", "RequestContext", "new_context", "with_retry"]

T = TypeVar("T")


@dataclass
class LoadStats:
    """What loading cost so far: requests sent, bytes received, retries, 429 answers, objects
    delivered, objects skipped because they do not exist (``skip_missing``), seconds the consumer
    waited for the next object, (``compose_shards_by_gcs``) compose calls made and kept
    composites reused, and (with a ``LocalCache``) objects read from the cache, objects read from GCS
    through it, and the bytes read from the cache (``bytes`` counts GCS's alone)."""

    requests: int = 0
    bytes: int = 0
    retries: int = 0
    throttled: int = 0
    objects: int = 0
    missing: int = 0
    wait_seconds: float = 0.0
    composes: int = 0
    reused: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes: int = 0

    def count_retry(self, _: BaseException) -> None:
        self.retries += 1


class ConsumerGone(Exception):
    """The consumer went away while a download waited for buffer space."""


class ByteBudget:
    """Counts bytes buffered ahead of the consumer; lives on the I/O loop, except :meth:`give_back`.

    The oldest undelivered item never waits, so nothing deadlocks. Any other waits until its bytes fit with
    room to spare for the oldest, as much as the largest share within the limit so far: answers come out of
    order, and without that room later items fill the budget and the oldest then takes it past its limit by
    all of its own share (reading objects of 100 KiB to 40 MiB on a 128 MiB budget, up to 191 MiB in use).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._largest = 0  # the room kept for the oldest item (a share over the limit is its own)
        self._head = 0
        self._closed = False
        self._waiting = 0
        self._changed = asyncio.Condition()
        self._given_back = threading.Lock()  # guards the consumer's two counts below and _waiting
        self._returned = 0
        self._delivered = 0

    def give_back(self, nbytes: int, delivered: int) -> bool:
        """From the consumer's thread: ``nbytes`` are free and the first ``delivered`` items are delivered.

        The loop counts them when a read next finds no room, so this costs it nothing while reads fit.
        Returns whether a read waits already: then the caller must run :meth:`wake` on the loop. The
        answer is exact: a read counts itself waiting under the same lock, and only then counts what
        came back before it.
        """
        with self._given_back:
            self._returned += nbytes
            self._delivered = delivered
            return bool(self._waiting)

    def try_acquire(self, nbytes: int, seq: int) -> bool:
        """Reserve ``nbytes`` for item ``seq`` if that needs no wait."""
        if self._closed:
            raise ConsumerGone
        if not self._fits(nbytes, seq):
            with self._given_back:
                self._used -= self._returned
                self._head = self._delivered
                self._returned = 0
            if not self._fits(nbytes, seq):
                return False
        self._used += nbytes
        if self._largest < nbytes <= self.limit:
            self._largest = nbytes
        return True

    def _fits(self, nbytes: int, seq: int) -> bool:
        return seq == self._head or self._used + nbytes + self._largest <= self.limit

    async def acquire(self, nbytes: int, seq: int) -> None:
        """Reserve ``nbytes`` for item ``seq``, waiting for room."""
        if self.try_acquire(nbytes, seq):
            return
        with self._given_back:
            self._waiting += 1
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self.try_acquire(nbytes, seq))
        finally:
            with self._given_back:
                self._waiting -= 1

    def release(self, nbytes: int) -> None:
        """Free ``nbytes`` (a read that failed, a stream closed)."""
        self._used -= nbytes
        self.wake()

    def close(self) -> None:
        self._closed = True
        self.wake()

    def wake(self) -> None:
        """Let reads that wait for room look again."""
        if self._waiting:  # a task per release costs more than the rest of it: only when needed
            # No reference kept: the task is in the loop's queue, or waits on the condition's lock, which
            # this budget holds; it can only be collected along with the budget and the reads waiting on it.
            asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


@dataclass
class RequestContext:
    """What every request of one iteration (a loader's, a writer's) shares."""

    session: Session
    retry: RetryConfig
    part_size: int
    budget: ByteBudget
    slots: Slots  # requests in flight for this loader
    stats: LoadStats
    hold_until_verified: bool = False  # an object larger than the budget is held whole, not streamed

    async def reserve_while_sending(self, nbytes: int, seq: int) -> None:
        """Reserve budget from inside a request; if that must wait, the request's slots are lent
        out meanwhile, so older objects can still be read (the oldest never waits)."""
        if self.budget.try_acquire(nbytes, seq):
            return
        self.slots.release()
        self.session.throttle.leave()
        with consumer_wait():
            try:
                await self.budget.acquire(nbytes, seq)
            finally:
                await self.session.throttle.acquire(paced=False)
                await self.slots.acquire()


async def with_retry(
    context: RequestContext, url: str, attempt_once: Callable[[], Coroutine[Any, Any, T]], *, repeatable: bool = True
) -> T:
    """Run one request (``attempt_once``) under the loader's and the process's limits, retried; a write
    that is not ``repeatable`` is sent once (see :class:`~.retry.Attempts`). Its deadline (see
    :mod:`.deadline`) counts from when its first attempt got its slots, and cuts an attempt off
    whatever it is doing: sending, waiting, or reading the answer byte by byte."""
    stats, throttle, slots = context.stats, context.session.throttle, context.slots
    attempts: Attempts | None = None  # made at the first failure: most requests succeed at once
    clock: RequestDeadline | None = None
    sent: float | None = None
    throttled = False
    while True:
        try:
            # The request's slot and turn, taken without a coroutine where none needs a wait (most requests)
            if not slots.take():
                await slots.acquire()
            try:
                if attempts is not None or not throttle.admit():
                    await throttle.acquire(retry=attempts is not None)
                try:
                    sent = time.monotonic()
                    if clock is None:
                        clock = RequestDeadline(deadline_for(context.retry, sent))
                    elif throttled:  # it waited for its turn while the process made progress
                        clock.deadline = progress_deadline(clock.deadline, throttle.progress)
                    stats.requests += 1
                    result = await clock.attempt(attempt_once(), url, attempts.attempt if attempts else 1)
                finally:
                    throttle.leave()
            finally:
                slots.release()
            throttle.succeeded()
            return result
        except Exception as exc:  # noqa: BLE001 - Attempts re-raises what is not retryable
            throttled = getattr(exc, "status", None) == 429
            if throttled:
                stats.throttled += 1
                throttle.throttled(sent)
                if clock is not None:  # throttled while the process makes progress: not a failure
                    clock.deadline = progress_deadline(clock.deadline, throttle.progress)
            if attempts is None:
                attempts = Attempts(context.retry, url, stats.count_retry, repeatable=repeatable, throttle=throttle)
            if clock is not None:
                attempts.deadline = clock.deadline
            await asyncio.sleep(attempts.delay_after(exc))


def new_context(
    destination: Destination | ClientConfig, transfer: TransferConfig, retry: RetryConfig, stats: LoadStats
) -> RequestContext:
    """A fresh context for one iteration, on this process's session for ``destination``."""
    return RequestContext(
        session_for(destination),
        retry,
        transfer.part_size,
        ByteBudget(transfer.max_buffered_bytes),
        Slots(transfer.max_in_flight),
        stats,
        transfer.hold_until_verified,
    )
