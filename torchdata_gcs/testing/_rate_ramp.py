"""GCS's per-bucket request-rate ramp, scaled down by parameters, for the test front.

GCS's request-rate guidelines give a bucket an initial capacity of about 1,000 object writes
(uploads, updates, deletes) and 5,000 object reads (listing, data, metadata) per second, which it
raises by spreading the load over more servers when load nears it, taking minutes to do so; a client
should ramp up no faster than doubling its rate over 20 minutes, and a bucket growing faster meets
"temporary limits": higher latency and error rates, 429 among them. :class:`RateRamp` keeps a limit
per bucket for reads and one for writes that starts at a given rate and doubles after each
``period`` seconds of load near it; a request over the limit is answered 429 with GCS's
``usageLimits``/``rateLimitExceeded`` error (the XML API: ``SlowDown``).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

__all__ = ["READS", "RateRamp", "WRITES", "bucket_of", "rate_limited"]

READS = ("get", "range_get", "metadata", "list")  # GCS's "object read requests"
WRITES = ("upload", "compose", "delete", "metadata")  # "object write requests" (a metadata PATCH among them)


def bucket_of(target: str) -> str | None:
    """The bucket a JSON or XML API object request (``/path?query``) is about, or ``None``.

    Examples:
        >>> bucket_of("/download/storage/v1/b/bkt/o/a%2Fb?alt=media"), bucket_of("/bkt/a/b?uploads")
        ('bkt', 'bkt')
        >>> bucket_of("/storage/v1/b?project=p") is None
        True
    """
    parts = target.partition("?")[0].split("/")
    if parts[1:4] == ["storage", "v1", "b"]:
        return unquote(parts[4]) if len(parts) > 4 and parts[4] else None
    if parts[1:5] in (["download", "storage", "v1", "b"], ["upload", "storage", "v1", "b"]):
        return unquote(parts[5]) if len(parts) > 5 and parts[5] else None
    if parts[1] in ("storage", "download", "upload", "batch", ""):
        return None
    return unquote(parts[1])  # the XML API, path-style


def rate_limited(bucket: str, xml: bool) -> tuple[str, bytes]:
    """The content type and body of GCS's 429 for a request over the bucket's rate.

    JSON: GCS's error document with the ``usageLimits`` domain and ``rateLimitExceeded`` reason it sends
    for its rate limits; XML: the ``SlowDown`` error it sends there.
    """
    if xml:
        body = "<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
        body += "<Message>Please reduce your request rate.</Message></Error>"
        return "application/xml; charset=UTF-8", body.encode()
    message = f"The rate of requests to the bucket {bucket} exceeds the rate limit. Please reduce your request rate."
    error = {"message": message, "domain": "usageLimits", "reason": "rateLimitExceeded"}
    document = {"error": {"code": 429, "message": message, "errors": [error]}}
    return "application/json; charset=UTF-8", json.dumps(document).encode()


@dataclass
class _Lane:
    """One bucket's limit for reads or for writes: a token bucket whose rate doubles under load."""

    rate: float
    tokens: float
    checked: float
    window: float  # start of the current one-second window
    offered: int = 0  # requests in it, refused ones included
    loaded: float = 0.0  # seconds spent near the limit since it last doubled
    steps: list[tuple[float, float]] = field(default_factory=list)  # (since, rate)


class RateRamp:
    """Per-bucket request-rate limits that ramp as GCS's do (see the module's docstring).

    Args:
        reads: object reads per second a bucket starts with (GCS: about 5,000).
        writes: object writes per second a bucket starts with (GCS: about 1,000).
        period: seconds of load near the limit after which it doubles (GCS: about 1,200, 20 minutes).
        near: the share of the limit a second's requests (refused ones included) must reach to count
            as load near it.
        burst: seconds of the rate that may come at once (the token bucket's depth).

    Examples:
        >>> ramp = RateRamp(reads=10, writes=2, period=60, burst=1.0)
        >>> [ramp.admit("b", write=False) for _ in range(11)].count(True)
        10
        >>> ramp.admit("b", write=True), ramp.refused
        (True, Counter({('b', 'read'): 1}))
    """

    def __init__(
        self,
        reads: float = 5000.0,
        writes: float = 1000.0,
        period: float = 1200.0,
        *,
        near: float = 0.5,
        burst: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (reads > 0 and writes > 0 and period > 0 and 0 < near <= 1 and burst > 0):
            raise ValueError(
                f"reads, writes, period and burst must be > 0 and near within (0, 1]; got reads={reads}, "
                f"writes={writes}, period={period}, near={near}, burst={burst}"
            )
        self.reads, self.writes, self.period, self.near, self.burst = reads, writes, period, near, burst
        self._clock = clock
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._lock = threading.Lock()
        self.admitted: Counter[tuple[str, str]] = Counter()
        self.refused: Counter[tuple[str, str]] = Counter()

    def admit(self, bucket: str, write: bool) -> bool:
        """Count one object request to ``bucket``; whether it is within the bucket's limit."""
        key = (bucket, "write" if write else "read")
        now = self._clock()
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                rate = self.writes if write else self.reads
                lane = self._lanes[key] = _Lane(rate, rate * self.burst, now, now, steps=[(now, rate)])
            self._roll(lane, now)
            lane.offered += 1
            lane.tokens = min(lane.rate * self.burst, lane.tokens + (now - lane.checked) * lane.rate)
            lane.checked = now
            if lane.tokens < 1:
                self.refused[key] += 1
                return False
            lane.tokens -= 1
            self.admitted[key] += 1
            return True

    def _roll(self, lane: _Lane, now: float) -> None:
        """Close the one-second window if it is over: one more second near the limit if it was loaded."""
        if now - lane.window < 1.0:
            return
        if lane.offered >= self.near * lane.rate:
            lane.loaded += 1.0
            if lane.loaded >= self.period:
                lane.loaded -= self.period
                lane.rate *= 2
                lane.steps.append((lane.window + 1.0, lane.rate))
        lane.window, lane.offered = now, 0

    def rate(self, bucket: str, write: bool = False) -> float:
        """The limit in force now for ``bucket``'s reads (or writes), requests per second."""
        with self._lock:
            lane = self._lanes.get((bucket, "write" if write else "read"))
            return lane.rate if lane is not None else (self.writes if write else self.reads)

    def allowed(self, bucket: str, start: float, end: float, write: bool = False) -> float:
        """How many requests the limit allowed from ``start`` to ``end`` (the clock's seconds): its rate
        integrated over that time, as it stepped up."""
        with self._lock:
            lane = self._lanes.get((bucket, "write" if write else "read"))
            steps = list(lane.steps) if lane is not None else [(start, self.writes if write else self.reads)]
        total = 0.0
        for index, (since, rate) in enumerate(steps):
            until = steps[index + 1][0] if index + 1 < len(steps) else end
            lo, hi = max(since, start), min(until, end)
            if index == 0:
                lo = start  # before its first request the bucket already had its starting rate
            if hi > lo:
                total += (hi - lo) * rate
        return total
