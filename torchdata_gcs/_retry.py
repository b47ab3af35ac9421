"""What is retryable and how long to wait: jittered exponential backoff under a deadline."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import google.auth.exceptions
import requests
import urllib3.exceptions

from .config import RetryConfig
from .errors import GCSError, IntegrityError, TransientError

logger = logging.getLogger(__name__)

T = TypeVar("T")

_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.ReadTimeoutError,
    google.auth.exceptions.TransportError,  # the token endpoint could not be reached
    ConnectionError,
    TimeoutError,
)


def is_retryable(exc: BaseException) -> bool:
    """True for failures a new attempt may cure: transient statuses, network faults, bad bytes."""
    return isinstance(exc, (TransientError, IntegrityError, *_NETWORK_ERRORS))


_JITTER = random.SystemRandom()
"""Jitter from the OS: no per-call seeding, and worker processes forked alike still draw apart."""


def backoff_delay(attempt: int, retry: RetryConfig, rng: random.Random) -> float:
    """Full-jitter delay before retry number ``attempt`` (1 for the first retry)."""
    ceiling = min(retry.max_delay, retry.initial_delay * retry.multiplier ** (attempt - 1))
    return rng.uniform(0, ceiling)


def call_with_retry(
    attempt_once: Callable[[], T],
    retry: RetryConfig,
    *,
    url: str,
) -> T:
    """Run ``attempt_once`` until it succeeds, fails for good, or retries run out.

    A ``retry_after`` attribute on the error (from GCS's ``Retry-After``) stretches the wait.
    Non-retryable errors propagate at once. When retries run out, a ``GCSError`` propagates as it
    is and a network fault becomes a ``TransientError`` naming ``url``.
    """
    start = time.monotonic()
    attempt = 1
    while True:
        try:
            return attempt_once()
        except BaseException as exc:
            if not is_retryable(exc):
                raise
            delay = backoff_delay(attempt, retry, _JITTER)
            hinted = getattr(exc, "retry_after", None)
            if hinted is not None:
                delay = max(delay, min(hinted, retry.max_delay))
            out_of_time = time.monotonic() - start + delay > retry.deadline
            if attempt >= retry.max_attempts or out_of_time:
                if isinstance(exc, GCSError):
                    raise
                raise TransientError(
                    f"gave up on {url} after {attempt} attempts: {type(exc).__name__}: {exc}", url=url
                ) from exc
            logger.debug("retrying %s in %.2fs after attempt %d failed: %r", url, delay, attempt, exc)
            time.sleep(delay)
            attempt += 1
