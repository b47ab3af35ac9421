"""The wait histogram: exact percentiles on bucket floors, within an eighth below on any wait, mergeable,
fixed in size; the report flattened and logged."""

from __future__ import annotations

import json
import logging
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchdata_gcs import LoadStats
from torchdata_gcs._engines.stalls import SLOTS, WaitHistogram, flatten, log_report, stall_report

FLOORS = [math.ldexp(1 + step / 8, exponent) for exponent in range(-17, 10) for step in range(8)]
"""Every bucket's smallest wait, from 2**-17 s up to the last doubling below 2**10 s."""


def nearest_rank(waits: list[float], p: float) -> float:
    ordered = sorted(waits)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def histogram_of(waits: list[float]) -> WaitHistogram:
    histogram = WaitHistogram()
    for seconds in waits:
        histogram.record(seconds)
    return histogram


def test_known_waits_give_exact_percentiles() -> None:
    waits = [0.5] * 50 + [1.0] * 45 + [3.0] * 4 + [12.0]
    histogram = histogram_of(waits[::-1])
    assert [histogram.percentile(p) for p in (1, 50, 51, 95, 96, 99, 100)] == [0.5, 0.5, 1.0, 1.0, 3.0, 3.0, 12.0]
    assert histogram.summary() == {
        "count": 100.0,
        "total": 50 * 0.5 + 45 * 1.0 + 4 * 3.0 + 12.0,
        "p50": 0.5,
        "p95": 1.0,
        "p99": 3.0,
        "max": 12.0,
    }


def test_no_waits_give_zeros_and_one_wait_gives_itself() -> None:
    assert WaitHistogram().summary() == {"count": 0.0, "total": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    for seconds in (0.0, 1e-9, 0.0123, 5000.0):  # the floor's bucket, a middle one, the ceiling's bucket
        assert histogram_of([seconds]).summary()["p50"] == seconds


@given(st.lists(st.sampled_from(FLOORS), min_size=1, max_size=300), st.floats(0.1, 100))
def test_percentiles_of_bucket_floors_are_exact(waits: list[float], p: float) -> None:
    assert histogram_of(waits).percentile(p) == nearest_rank(waits, p)


@given(st.lists(st.floats(2**-17, 1000), min_size=1, max_size=300), st.floats(0.1, 100))
def test_any_percentile_is_at_most_an_eighth_below_the_exact_one(waits: list[float], p: float) -> None:
    exact = nearest_rank(waits, p)
    assert exact * 8 / 9 <= histogram_of(waits).percentile(p) <= exact


@given(st.lists(st.floats(0, 3000), max_size=100), st.lists(st.floats(0, 3000), max_size=100))
def test_merged_histograms_are_the_histogram_of_both(first: list[float], second: list[float]) -> None:
    merged = histogram_of(first)
    merged.merge(histogram_of(second))
    both = histogram_of(first + second)
    assert list(merged.cells)[:2] == pytest.approx(list(both.cells)[:2])  # count, total (sums in another order)
    assert list(merged.cells)[2:] == list(both.cells)[2:]  # min, max, every bucket


def test_the_histogram_keeps_its_size_whatever_it_counts() -> None:
    histogram = histogram_of([i / 1000 for i in range(100_000)])
    assert len(histogram.cells) == SLOTS < 250
    assert histogram.count == 100_000


def test_the_report_sums_the_processes_and_flattens_into_numbers() -> None:
    first, second = histogram_of([0.25, 0.5]), histogram_of([2.0])
    report = stall_report(
        {
            "0": (LoadStats(requests=3, bytes=10, retries=1, throttled=1, objects=2), first),
            "1": (LoadStats(requests=1, bytes=5, objects=1), second),
        }
    )
    assert report == json.loads(json.dumps(report))
    assert (report["rank"], report["requests"], report["bytes"], report["retries"], report["throttled"]) == (
        0,
        4,
        15,
        1,
        1,
    )
    assert report["object_wait_s"]["count"] == 3 and report["object_wait_s"]["max"] == 2.0
    assert report["workers"]["1"]["object_wait_s"]["p50"] == 2.0
    flat = flatten(report, "data/")
    assert flat["data/workers/0/throttled"] == 1 and flat["data/object_wait_s/p99"] == 2.0
    assert all(isinstance(value, (int, float)) for value in flat.values())


def test_the_report_is_logged_one_line_per_rank_and_one_per_process_at_debug(caplog) -> None:
    report = stall_report({"main": (LoadStats(requests=7, objects=7, throttled=2), histogram_of([0.125] * 7))})
    with caplog.at_level(logging.INFO, logger="torchdata_gcs.stalls"):
        log_report(report)
    assert [record.getMessage() for record in caplog.records] == [
        "rank 0: object wait p50/p95/p99 125.0/125.0/125.0 ms over 7; 7 objects, 7 requests, 0 bytes, 0 retries, "
        "2 answered 429"
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="torchdata_gcs.stalls"):
        log_report(report)
    assert [record.levelno for record in caplog.records] == [logging.INFO, logging.DEBUG]
    assert caplog.records[1].getMessage().startswith("rank 0 main process: object wait p50/p95/p99 125.0/")
