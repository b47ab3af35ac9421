"""Retry policy: which failures are retried, how long the waits are, when it gives up."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchdata_gcs import (
    ClientConfig,
    DeadlineExceededError,
    EndpointError,
    IntegrityError,
    NotFoundError,
    RetryConfig,
    TransferConfig,
    TransientError,
)
from torchdata_gcs._transport.context import LoadStats, new_context, with_retry
from torchdata_gcs._transport.http import Unanswered
from torchdata_gcs._transport.loop import run
from torchdata_gcs._transport.retry import UNANSWERED_DELAYS, backoff_delay, is_retryable

FAST = RetryConfig(max_attempts=4, deadline=10, initial_delay=0.001, max_delay=0.002)


@given(
    attempt=st.integers(1, 50),
    initial=st.floats(0, 5),
    extra=st.floats(0, 60),
    multiplier=st.floats(1, 4),
    seed=st.integers(0, 2**32),
)
def test_backoff_stays_within_the_exponential_ceiling(attempt, initial, extra, multiplier, seed) -> None:
    retry = RetryConfig(initial_delay=initial, max_delay=initial + extra, multiplier=multiplier)
    delay = backoff_delay(attempt, retry, random.Random(seed))
    assert 0 <= delay <= min(retry.max_delay, initial * multiplier ** (attempt - 1)) + 1e-9


def _flaky(failures: list[BaseException], result: str = "ok"):
    calls = []

    async def attempt() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return result

    return attempt, calls


def call_with_retry(attempt, retry: RetryConfig, *, url: str) -> str:
    """``attempt`` sent as every request is: retried under a request context, on the I/O loop."""
    stats = LoadStats()
    context = new_context(ClientConfig(endpoint="http://127.0.0.1:9"), TransferConfig(), retry, stats)
    try:
        return run(with_retry(context, url, attempt))
    finally:
        assert stats.retries == stats.requests - 1


@pytest.mark.parametrize(
    "failure",
    [
        TransientError("busy", status=503),
        aiohttp.ClientConnectionError("reset"),
        aiohttp.ClientPayloadError("cut"),
        asyncio.TimeoutError(),
        IntegrityError("crc"),
    ],
)
def test_transient_failures_are_retried(failure: BaseException) -> None:
    attempt, calls = _flaky([failure, failure])
    assert call_with_retry(attempt, FAST, url="gs://b/x") == "ok"
    assert len(calls) == 3


def test_permanent_failures_are_not_retried() -> None:
    attempt, calls = _flaky([NotFoundError("gone", url="gs://b/x")])
    with pytest.raises(NotFoundError):
        call_with_retry(attempt, FAST, url="gs://b/x")
    assert len(calls) == 1
    assert not is_retryable(ValueError("bug"))


def test_network_faults_become_transient_errors_when_retries_run_out() -> None:
    attempt, calls = _flaky([aiohttp.ServerDisconnectedError()] * 10)
    with pytest.raises(TransientError) as info:
        call_with_retry(attempt, FAST, url="gs://b/x")
    assert len(calls) == FAST.max_attempts
    assert info.value.url == "gs://b/x" and "4 attempts" in str(info.value)


def test_integrity_errors_keep_their_type_when_retries_run_out() -> None:
    attempt, _ = _flaky([IntegrityError("crc", url="gs://b/x")] * 10)
    with pytest.raises(IntegrityError):
        call_with_retry(attempt, FAST, url="gs://b/x")


def test_retry_after_stretches_the_wait_and_the_deadline_stops_early() -> None:
    retry = RetryConfig(max_attempts=100, deadline=0.5, initial_delay=0.001, max_delay=5)
    attempt, calls = _flaky([TransientError("busy", status=429, retry_after=1.0)] * 100)
    with pytest.raises(TransientError):
        call_with_retry(attempt, retry, url="gs://b/x")
    assert len(calls) == 1  # the hinted 1 s wait would pass the 0.5 s deadline


def test_the_deadline_counts_from_the_first_attempt() -> None:
    """The first attempt's own time counts against the deadline, though the retry state is made after it fails."""
    retry = RetryConfig(max_attempts=100, deadline=0.3, initial_delay=0.001, max_delay=0.002)
    calls: list[int] = []

    async def slow_failure() -> str:
        calls.append(1)
        await asyncio.sleep(0.4)
        raise TransientError("busy", status=503)

    with pytest.raises(TransientError):
        call_with_retry(slow_failure, retry, url="gs://b/x")
    assert len(calls) == 1  # 0.4 s spent: a second attempt would start past the 0.3 s deadline


def test_an_endpoint_error_is_final_and_an_endpoint_not_up_yet_gets_a_few_seconds() -> None:
    untrusted = EndpointError("cannot trust https://x", url="https://x")
    attempt, calls = _flaky([untrusted])
    with pytest.raises(EndpointError):
        call_with_retry(attempt, FAST, url="gs://b/x")
    assert len(calls) == 1 and isinstance(untrusted, ConnectionError) and not is_retryable(untrusted)

    unreachable = EndpointError("cannot reach http://x", url="http://x")
    patient = RetryConfig(max_attempts=100, deadline=60, initial_delay=0.001, max_delay=0.002)
    attempt, calls = _flaky([Unanswered(unreachable)] * 10)
    started = time.monotonic()
    with pytest.raises(EndpointError) as info:
        call_with_retry(attempt, patient, url="gs://b/x")
    assert time.monotonic() - started >= sum(UNANSWERED_DELAYS)  # its own waits, not the configuration's
    assert len(calls) == len(UNANSWERED_DELAYS) + 1
    assert info.value is unreachable and info.value.__cause__ is None and info.value.__suppress_context__


def test_answers_that_ask_to_try_again_do_not_use_up_the_attempts() -> None:
    """429 and 5xx answers (throttling, an outage) are retried until the deadline, however many come;
    failures without such an answer still count against ``max_attempts``."""
    asking = [TransientError("slow down", status=429)] * 5 + [TransientError("unavailable", status=503)] * 5
    attempt, calls = _flaky([*asking, aiohttp.ServerDisconnectedError()] * 3)
    assert call_with_retry(attempt, FAST, url="gs://b/x") == "ok"
    assert len(calls) == 34  # 30 answers and 3 resets failed: 3 < 4 attempts counted

    attempt, calls = _flaky([*asking, aiohttp.ServerDisconnectedError()] * 4)
    with pytest.raises(TransientError, match="4 resets|44 attempts"):
        call_with_retry(attempt, FAST, url="gs://b/x")
    assert len(calls) == 44


def test_a_throttle_that_outlasts_the_deadline_says_so() -> None:
    retry = RetryConfig(max_attempts=2, deadline=0.3, initial_delay=0.01, max_delay=0.02)
    attempt, calls = _flaky([TransientError("GCS answered 429 (gs://b/x): slow down", status=429)] * 1000)
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError) as info:
        call_with_retry(attempt, retry, url="gs://b/x")
    assert time.monotonic() - started < 3  # 0.3 s, generously
    assert len(calls) > retry.max_attempts
    assert info.value.status == 429 and info.value.url == "gs://b/x"
    assert "RetryConfig.deadline (0.3 s" in str(info.value) and "GCS answered 429" in str(info.value)
