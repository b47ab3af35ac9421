"""Where a loader's time goes: fixed-size histograms of waits, mergeable across processes, and the report
a training loop logs (per rank and DataLoader worker: waits as percentiles, requests, bytes, retries and
answers of status 429).

A histogram is a flat array of doubles, so it can live in shared memory: a DataLoader worker records its
waits into its own row, and the process that made the dataset reads every row. Buckets are logarithmic
(eight per doubling), so a percentile is exact to within an eighth below, whatever the number of waits.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Generator, Iterable, Mapping
from typing import Any, TypeVar

from torch.utils.data import get_worker_info

from .._transport.context import LoadStats
from .epoch_order import rank_and_world_size

__all__ = ["SLOTS", "WaitHistogram", "flatten", "log_report", "process_name", "stall_report", "timed"]

T = TypeVar("T")

logger = logging.getLogger("torchdata_gcs.stalls")

PER_DOUBLING = 8
LOWEST = -17  # the first bucket above the floor starts at 2**-17 s (7.6 microseconds)
HIGHEST = 10  # waits of 2**10 s (17 minutes) and more share the last bucket
BUCKETS = 2 + (HIGHEST - LOWEST) * PER_DOUBLING  # below the first doubling, the doublings, above the last
_COUNT, _SUM, _MIN, _MAX, _FIRST = range(5)
SLOTS = _FIRST + BUCKETS
"""Doubles one histogram takes: count, sum, min, max, then the bucket counts."""
PERCENTILES = (50, 95, 99)
SMALLEST = math.ldexp(1.0, LOWEST)


def _bucket(seconds: float) -> int:
    if seconds < SMALLEST:
        return 0
    mantissa, exponent = math.frexp(seconds)  # seconds = mantissa * 2**exponent, mantissa in [0.5, 1)
    if exponent > HIGHEST:
        return BUCKETS - 1
    return 1 + (exponent - LOWEST - 1) * PER_DOUBLING + int((mantissa - 0.5) * 2 * PER_DOUBLING)


def _floor(bucket: int) -> float:
    """The smallest wait bucket ``bucket`` holds."""
    if bucket == 0:
        return 0.0
    doubling, step = divmod(bucket - 1, PER_DOUBLING)
    return math.ldexp(1.0 + step / PER_DOUBLING, LOWEST + doubling)


class WaitHistogram:
    """Waits in seconds, counted in :data:`BUCKETS` logarithmic buckets over ``cells``: :data:`SLOTS`
    numbers, such as a row of a shared ctypes table (a new list by default). One process writes it.

    >>> waits = WaitHistogram()
    >>> for seconds in [0.001] * 90 + [0.25] * 9 + [2.0]:
    ...     waits.record(seconds)
    >>> waits.percentile(50), waits.percentile(95), waits.percentile(99), waits.percentile(100)
    (0.001, 0.25, 0.25, 2.0)
    """

    def __init__(self, cells: Any = None) -> None:
        self.cells: Any = [0.0] * SLOTS if cells is None else cells  # a list is the quicker to count into

    def record(self, seconds: float) -> None:
        cells = self.cells
        count = cells[_COUNT]
        if not count or seconds < cells[_MIN]:
            cells[_MIN] = seconds
        if seconds > cells[_MAX]:
            cells[_MAX] = seconds
        cells[_FIRST + _bucket(seconds)] += 1
        cells[_SUM] += seconds
        cells[_COUNT] = count + 1

    @property
    def count(self) -> int:
        return int(self.cells[_COUNT])

    @property
    def total(self) -> float:
        """The waits' sum, in seconds."""
        return float(self.cells[_SUM])

    def merge(self, other: WaitHistogram) -> None:
        """Add ``other``'s waits to these."""
        mine, theirs = self.cells, list(other.cells)
        if not theirs[_COUNT]:
            return
        if not mine[_COUNT] or theirs[_MIN] < mine[_MIN]:
            mine[_MIN] = theirs[_MIN]
        mine[_MAX] = max(mine[_MAX], theirs[_MAX])
        for index in (_COUNT, _SUM, *range(_FIRST, SLOTS)):
            mine[index] += theirs[index]

    def percentile(self, p: float) -> float:
        """The ``p``-th percentile by nearest rank (the smallest wait that ``p`` percent of waits do not
        exceed), as the floor of its bucket, kept within the smallest and largest wait seen: exact when
        the waits are bucket floors (such as powers of two), else at most an eighth below. 0 with no waits."""
        cells = list(self.cells)
        count = cells[_COUNT]
        if not count:
            return 0.0
        rank = max(1, math.ceil(p / 100 * count))
        seen = 0.0
        for bucket in range(BUCKETS):
            seen += cells[_FIRST + bucket]
            if seen >= rank:
                return min(cells[_MAX], max(cells[_MIN], _floor(bucket)))
        return cells[_MAX]

    def summary(self) -> dict[str, float]:
        """``count``, ``total``, ``p50``, ``p95``, ``p99`` and ``max``, in seconds."""
        figures = {"count": float(self.count), "total": self.total}
        figures.update({f"p{p}": self.percentile(p) for p in PERCENTILES})
        figures["max"] = float(self.cells[_MAX])
        return figures


def timed(items: Iterable[T], waits: WaitHistogram) -> Generator[T, None, None]:
    """``items``, recording into ``waits`` how long each took to come; closing this closes ``items``."""
    iterator, clock = iter(items), time.perf_counter
    try:
        while True:
            start = clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            waits.record(clock() - start)
            yield item
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def process_name() -> str:
    """How a report names this process: ``"main"``, or a DataLoader worker's id."""
    worker = get_worker_info()
    return "main" if worker is None else str(worker.id)


def _costs(stats: LoadStats) -> dict[str, int]:
    return {
        "objects": stats.objects,
        "requests": stats.requests,
        "bytes": stats.bytes,
        "retries": stats.retries,
        "throttled": stats.throttled,
        "cache_hits": stats.cache_hits,
        "cache_misses": stats.cache_misses,
        "cache_bytes": stats.cache_bytes,
    }


def stall_report(processes: Mapping[str, tuple[LoadStats, WaitHistogram]]) -> dict[str, Any]:
    """The report of one rank from each reading process's statistics and waits for its next object
    (``"main"`` for the rank's own process, the worker's id for a DataLoader worker): totals first."""
    waits, total = WaitHistogram(), LoadStats()
    workers: dict[str, Any] = {}
    for name, (stats, histogram) in processes.items():
        waits.merge(histogram)
        for field, value in _costs(stats).items():
            setattr(total, field, getattr(total, field) + value)
        workers[name] = {"object_wait_s": histogram.summary(), **_costs(stats)}
    return {"rank": rank_and_world_size()[0], "object_wait_s": waits.summary(), **_costs(total), "workers": workers}


def flatten(report: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """``report`` as flat ``name: number`` pairs, nested keys joined by ``/``, as TensorBoard's
    ``add_scalar`` and W&B's ``log`` take them.

    >>> flatten({"rank": 0, "object_wait_s": {"p50": 0.5}, "workers": {"0": {"bytes": 3}}}, "data/")
    {'data/rank': 0, 'data/object_wait_s/p50': 0.5, 'data/workers/0/bytes': 3}
    """
    flat: dict[str, float] = {}
    for key, value in report.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _line(figures: Mapping[str, Any]) -> str:
    waits = "; ".join(
        f"{name.removesuffix('_s').replace('_', ' ')} p50/p95/p99 "
        + "/".join(f"{1000 * value[f'p{p}']:.1f}" for p in PERCENTILES)
        + f" ms over {int(value['count'])}"
        for name, value in figures.items()
        if name.endswith("_wait_s")
    )
    costs = ", ".join(f"{figures[name]:,} {name}" for name in ("objects", "requests", "bytes", "retries"))
    return f"{waits}; {costs}, {figures['throttled']:,} answered 429"


def log_report(report: Mapping[str, Any]) -> None:
    """Log ``report``: one line for the rank at INFO, one per reading process at DEBUG."""
    logger.info("rank %d: %s", report["rank"], _line(report))
    if logger.isEnabledFor(logging.DEBUG):
        for name, figures in report["workers"].items():
            where = "main process" if name == "main" else f"worker {name}"
            logger.debug("rank %d %s: %s", report["rank"], where, _line(figures))
