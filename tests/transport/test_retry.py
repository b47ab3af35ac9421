"""Retry policy: which failures are retried, how long the waits are, when it gives up."""

from __future__ import annotations

import random

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from torchdata_gcs import IntegrityError, NotFoundError, RetryConfig, TransientError
from torchdata_gcs._transport.retry import backoff_delay, call_with_retry, is_retryable

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

    def attempt() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return result

    return attempt, calls


@pytest.mark.parametrize(
    "failure",
    [
        TransientError("busy", status=503),
        requests.ConnectionError("reset"),
        requests.exceptions.ChunkedEncodingError("cut"),
        requests.Timeout("slow"),
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
    attempt, calls = _flaky([requests.ConnectionError("reset")] * 10)
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
