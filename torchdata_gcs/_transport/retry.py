"""What is retryable and how long to wait: jittered exponential backoff until the deadline; answers that ask
to try again (throttling) are retried until then, other failures at most ``max_attempts`` times. A 429 waits by
the process's shared backoff step (see :mod:`.throttle`), not the request's own."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import google.auth.exceptions

from ..config import RetryConfig
from ..errors import DeadlineExceededError, EndpointError, GCSError, IntegrityError, TransientError
from .aio import NETWORK_ERRORS as AIOHTTP_NETWORK_ERRORS
from .deadline import deadline_for
from .http import RETRYABLE_STATUSES, Unanswered
from .throttle import Throttle

logger = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")
OnRetry = Callable[[BaseException], None] | None

UNANSWERED_DELAYS = (0.25, 0.75, 1.5)
"""The waits before each new attempt at an endpoint that has never answered in this process and refuses
the connection or whose host does not resolve: about 2.5 s in all, enough for a server still starting,
short enough that a wrong endpoint is said at once."""


_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,  # resets, refused connections, a body cut off before its Content-Length (any transport)
    TimeoutError,  # no byte for the read timeout
    *AIOHTTP_NETWORK_ERRORS,  # aiohttp's, which are not all of those
    google.auth.exceptions.TransportError,  # the token endpoint could not be reached
)


def is_retryable(exc: BaseException) -> bool:
    """True for failures a new attempt may cure: transient statuses, network faults, bad bytes, an endpoint
    not up yet; never for an endpoint that cannot be reached or trusted (``EndpointError``)."""
    if isinstance(exc, EndpointError):  # a ConnectionError, and yet final
        return False
    return isinstance(exc, (TransientError, IntegrityError, Unanswered, *_NETWORK_ERRORS))


_JITTER = random.SystemRandom()
"""Jitter from the OS: no per-call seeding, and worker processes forked alike still draw apart."""


def backoff_delay(attempt: int, retry: RetryConfig, rng: random.Random) -> float:
    """Full-jitter delay before retry number ``attempt`` (1 for the first retry)."""
    try:
        ceiling = min(retry.max_delay, retry.initial_delay * retry.multiplier ** (attempt - 1))
    except OverflowError:  # attempts past a thousand or so: a throttle is retried until the deadline
        ceiling = retry.max_delay
    return rng.uniform(0, ceiling)


def asks_to_try_again(exc: BaseException) -> bool:
    """Whether ``exc`` is an answer that asks for a new attempt later (408, 429, 5xx): GCS throttling, or
    busy or in an outage. Such answers are retried until the deadline, however many come."""
    return isinstance(exc, TransientError) and exc.status in RETRYABLE_STATUSES


class Attempts:
    """The retry decisions of one operation: after each failure, how long to wait, or give up.

    Retrying ends at the deadline (``retry.deadline`` from now, or the end of the call it is part of, if sooner: see
    :mod:`.deadline`; :attr:`deadline` may be set to another), and after ``retry.max_attempts`` failures other than
    answers that ask to try again (:func:`asks_to_try_again`): a throttled job keeps trying until the deadline, while a
    reset, a timeout or a damaged answer repeated that often is given up sooner. A ``retry_after`` attribute on the
    error (from GCS's ``Retry-After``) stretches the wait. ``on_retry``, if given, is told of every failure that will be
    retried. A write that is not ``repeatable`` (no precondition makes a repeat harmless) is not tried again unless
    ``retry.retry_unconditional_writes`` says so, but where it never reached the endpoint. With the process's
    ``throttle``, a 429 waits a full-jitter delay at the throttle's shared step instead of the request's.
    """

    def __init__(
        self,
        retry: RetryConfig,
        url: str,
        on_retry: Callable[[BaseException], None] | None = None,
        repeatable: bool = True,
        throttle: Throttle | None = None,
    ) -> None:
        self.retry, self.url, self.on_retry, self.throttle = retry, url, on_retry, throttle
        self.repeatable = repeatable or retry.retry_unconditional_writes
        self.deadline = deadline_for(retry, time.monotonic())  # with_retry sets its request's own
        self.attempt = 1
        self.counted = 0  # failures that count against max_attempts
        self.last: BaseException | None = None  # the last failure retried

    def delay_after(self, exc: BaseException) -> float:
        """Seconds to wait before the next attempt; raises (``exc``, or a ``TransientError``) to give up.

        Non-retryable errors are raised at once. When the attempts run out, a ``GCSError`` is raised as
        it is, an :class:`Unanswered` endpoint as its ``EndpointError`` (after a few seconds), and a
        network fault becomes a ``TransientError`` naming the URL; when the deadline would pass before
        the next attempt, a ``DeadlineExceededError`` naming it and the last failure.
        """
        if not is_retryable(exc):
            raise exc
        if isinstance(exc, DeadlineExceededError) and self.deadline.left() <= 0:
            # this operation's own deadline (or its call's) came during an attempt: say what failed before
            raise exc if self.last is None else self.deadline.exceeded(self.url, self.attempt, self.last) from exc
        retry = self.retry
        refused = isinstance(exc, IntegrityError) and exc.status == 400  # damaged on the way: nothing written
        if not self.repeatable and not isinstance(exc, Unanswered) and not refused:
            raise TransientError(
                f"{exc if isinstance(exc, GCSError) else f'{self.url}: {type(exc).__name__}: {exc}'}; not sent again: "
                "a write without a precondition, repeated, could replace or delete a newer object "
                "(RetryConfig(retry_unconditional_writes=True) repeats it)",
                url=self.url,
                status=getattr(exc, "status", None),
            ) from exc
        if not asks_to_try_again(exc):
            self.counted += 1
        if isinstance(exc, Unanswered):
            delay = UNANSWERED_DELAYS[min(self.attempt, len(UNANSWERED_DELAYS)) - 1]
            if (
                self.attempt > len(UNANSWERED_DELAYS)
                or self.counted >= retry.max_attempts
                or self.deadline.left() < delay
            ):
                raise exc.error from None  # one line, without the network library's chain
            return self._next(exc, delay)
        throttle = self.throttle if getattr(exc, "status", None) == 429 else None  # a 429 waits the shared step
        delay = backoff_delay(max(1, throttle.level) if throttle is not None else self.attempt, retry, _JITTER)
        hinted = getattr(exc, "retry_after", None)
        if hinted is not None:
            delay = max(delay, min(hinted, retry.max_delay))
        if self.counted >= retry.max_attempts:
            if isinstance(exc, GCSError):
                raise exc
            raise TransientError(
                f"gave up on {self.url} after {self.attempt} attempts: {type(exc).__name__}: {exc}", url=self.url
            ) from exc
        if self.deadline.left() < delay:
            raise self.deadline.exceeded(self.url, self.attempt, exc) from exc
        return self._next(exc, delay)

    def _next(self, exc: BaseException, delay: float) -> float:
        logger.debug("retrying %s in %.2fs after attempt %d failed: %r", self.url, delay, self.attempt, exc)
        if self.on_retry is not None:
            self.on_retry(exc)
        self.last = exc
        self.attempt += 1
        return delay


def reread_while_damaged(
    read: Callable[[], R], check: Callable[[R], T], retry: RetryConfig, url: str, on_retry: OnRetry = None
) -> T:
    """``check(read())``, read again after a backoff while ``check`` raises ``IntegrityError`` (bytes damaged on
    the way: GCS keeps no checksum per range, so a reader reads all of them again), as ``retry`` allows. What
    ``read`` raises is final: its requests were retried already."""
    rereads = Attempts(retry, url, on_retry=on_retry)
    while True:
        read_back = read()
        try:
            return check(read_back)
        except IntegrityError as exc:
            del read_back  # not held while the next read waits
            time.sleep(rereads.delay_after(exc))


async def reread_while_damaged_async(
    read: Callable[[], Awaitable[R]], check: Callable[[R], T], retry: RetryConfig, url: str, on_retry: OnRetry = None
) -> T:
    """:func:`reread_while_damaged` on the I/O loop."""
    rereads = Attempts(retry, url, on_retry=on_retry)
    while True:
        read_back = await read()
        try:
            return check(read_back)
        except IntegrityError as exc:
            del read_back
            await asyncio.sleep(rereads.delay_after(exc))
