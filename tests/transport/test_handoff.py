"""The I/O loop's primitives for many requests at once: the slots that bound a loader's requests in
flight, and the handoff that starts coroutines on the loop in batches."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading

import pytest

from torchdata_gcs._transport.loop import Handoff, io_loop, run
from torchdata_gcs._transport.slots import Slots


def test_slots_bound_the_requests_in_flight_and_serve_in_order() -> None:
    async def scenario() -> tuple[int, list[int]]:
        slots, busy, most, order = Slots(3), 0, 0, []

        async def request(n: int) -> None:
            nonlocal busy, most
            async with slots:
                order.append(n)
                busy += 1
                most = max(most, busy)
                await asyncio.sleep(random.random() / 1000)
                busy -= 1

        await asyncio.gather(*(request(n) for n in range(200)))
        return most, order

    most, order = asyncio.run(scenario())
    assert most == 3
    assert order == list(range(200))  # first come, first served


def test_a_cancelled_waiter_loses_no_slot() -> None:
    async def scenario() -> bool:
        slots = Slots(1)
        await slots.acquire()
        waiting = asyncio.ensure_future(slots.acquire())
        granted = asyncio.ensure_future(slots.acquire())
        await asyncio.sleep(0)
        waiting.cancel()  # cancelled while it waits: the slot goes to the next waiter
        slots.release()
        await asyncio.wait_for(granted, 1)
        # A waiter handed the slot and cancelled before it ran passes the slot on.
        late = asyncio.ensure_future(slots.acquire())
        after = asyncio.ensure_future(slots.acquire())
        await asyncio.sleep(0)
        slots.release()
        late.cancel()
        await asyncio.wait_for(after, 1)
        return late.cancelled()

    assert asyncio.run(scenario())


def test_a_handoff_runs_its_calls_then_its_coroutines_at_flush() -> None:
    handoff, events = Handoff(), []

    async def job(n: int) -> int:
        events.append(f"job {n}")
        if n == 2:
            raise ValueError("two")
        return n * 10

    futures = [handoff.submit(job(n)) for n in range(3)]
    handoff.call(events.append, "call")
    assert len(handoff) == 3 and not events  # nothing runs before the flush
    handoff.flush()
    assert futures[0].result(5) == 0 and futures[1].result(5) == 10
    with pytest.raises(ValueError, match="two"):
        futures[2].result(5)
    assert events == ["call", "job 0", "job 1", "job 2"]
    assert len(handoff) == 0


def test_cancelling_a_handed_over_future_cancels_its_coroutine() -> None:
    handoff = Handoff()
    started, stopped = threading.Event(), threading.Event()

    async def endless() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    never_started_ran = []

    async def never_started() -> None:
        never_started_ran.append(1)

    running = handoff.submit(endless())
    handoff.flush()
    assert started.wait(5)
    assert running.cancel()
    assert stopped.wait(5)
    cancelled_early = handoff.submit(never_started())
    cancelled_early.cancel()
    handoff.flush()  # closed without running (and without a never-awaited warning)
    run(asyncio.sleep(0.01))
    assert not never_started_ran and cancelled_early.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        running.result(0)


def test_a_handoff_works_from_many_threads_at_once() -> None:
    def worker(k: int) -> list[int]:
        handoff = Handoff()

        async def double(n: int) -> int:
            await asyncio.sleep(0)
            return 2 * n

        futures = [handoff.submit(double(k * 1000 + n)) for n in range(100)]
        handoff.flush()
        return [f.result(10) for f in futures]

    with concurrent.futures.ThreadPoolExecutor(4) as threads:
        results = list(threads.map(worker, range(4)))
    assert results == [[2 * (k * 1000 + n) for n in range(100)] for k in range(4)]
    assert io_loop().is_running()
