"""A process-wide limit on requests in flight that halves on HTTP 429 and grows back as requests succeed.

GCS answers 429 when a bucket or an object is read faster than it can scale. Retrying every
request after its own backoff keeps the pressure on; here every loader of the process shares one
limit (additive increase, multiplicative decrease), so the whole process slows down together.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["Throttle"]

CEILING = 4096
"""The limit when nothing has been throttled: per-loader limits (``max_in_flight``) bind first."""


class Throttle:
    """Admits requests while fewer than ``limit`` are in flight; lives on the I/O loop."""

    def __init__(self, ceiling: int = CEILING) -> None:
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.in_flight = 0
        self._waiting = 0
        self._last_cut = 0.0
        self._free = asyncio.Condition()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()

    async def acquire(self) -> None:
        if self.in_flight >= self.limit:
            self._waiting += 1
            try:
                async with self._free:
                    await self._free.wait_for(lambda: self.in_flight < self.limit)
            finally:
                self._waiting -= 1
        self.in_flight += 1

    async def release(self) -> None:
        self.in_flight -= 1
        if self._waiting:
            async with self._free:
                self._free.notify()

    def throttled(self) -> None:
        """A request got 429: halve the limit (at most once per second, so one burst counts once)."""
        now = time.monotonic()
        if now - self._last_cut >= 1.0:
            self._last_cut = now
            self.limit = max(1.0, min(self.limit, self.in_flight) / 2)

    def succeeded(self) -> None:
        """A request succeeded: grow the limit by one per ``limit`` successes."""
        if self.limit < self.ceiling:
            self.limit = min(float(self.ceiling), self.limit + 1 / self.limit)
