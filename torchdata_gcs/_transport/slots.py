"""A loader's limit on its requests in flight: a first-come-first-served semaphore whose acquire and
release cost the same however many requests wait.

asyncio's ``Semaphore`` on Python 3.11 looks at every waiter on each acquire (and removes a woken
waiter by search), and a loader keeps about as many requests waiting for a slot as it has slots: at
128 slots that was a tenth of the I/O loop's time per small object.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Slots"]


class Slots:
    """``count`` slots, handed out in the order they were asked for; lives on the I/O loop.

    >>> async def demo() -> list[int]:
    ...     slots, order = Slots(1), []
    ...     async def request(n: int) -> None:
    ...         async with slots:
    ...             order.append(n)
    ...             await asyncio.sleep(0)
    ...     await asyncio.gather(*(request(n) for n in range(3)))
    ...     return order
    >>> asyncio.run(demo())
    [0, 1, 2]
    """

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        """Take a slot if one is free and nobody waits for one: :meth:`acquire` without a coroutine, for the
        many requests that never wait."""
        if self._free and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        if self.take():
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # handed a slot, then cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        """Hand the slot to the longest waiter still waiting, else free it."""
        while self._waiters:
            granted = self._waiters.popleft()
            if not granted.done():  # a cancelled waiter's future is done
                granted.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()
