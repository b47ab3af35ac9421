"""The parallel listing runs as tasks on the I/O loop: callers there await it with no thread in between, and a
blocking consumer that stops (closes its iterator, or Ctrl-C while it waits) leaves nothing of it running."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.interrupts import ctrl_c_after
from torchdata_gcs import RetryConfig
from torchdata_gcs._engines.parallel_listing import list_prefix_parallel
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.loop import run
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

OBJECTS = 400


@pytest.fixture
def seeded(gcs_emulator: Emulator, gcs_bucket: str) -> str:
    gcs_emulator.seed(gcs_bucket, {f"many/{i:04d}": b"" for i in range(OBJECTS)}, concurrency=16)
    return gcs_bucket


def _listing_threads() -> set[threading.Thread]:
    """Threads other than the I/O loop's that the library or ``asyncio.to_thread`` starts."""
    return {t for t in threading.enumerate() if t.name == "torchdata-gcs-list" or t.name.startswith("asyncio_")}


async def _listers() -> int:
    """Listing tasks on the I/O loop."""
    return sum(task.get_coro().__qualname__.startswith("_Listing.") for task in asyncio.all_tasks())  # type: ignore[union-attr]


def _nothing_lists_within(seconds: float, threads_before: set[threading.Thread]) -> bool:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        if not run(_listers()) and not _listing_threads() - threads_before:
            return True
        time.sleep(0.05)
    return False


def test_find_lists_on_the_io_loop_without_threads(gcs_emulator: Emulator, seeded: str) -> None:
    """Many pages, slowly: a thread that lists (or hands the listing off the loop) would be seen meanwhile."""
    before = _listing_threads()
    with GCSFront(gcs_emulator.endpoint, latency=0.02, page_size=10) as front:
        fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
        seen: set[threading.Thread] = set()
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seen.update(_listing_threads())
                time.sleep(0.002)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            found = fs.find(f"{seeded}/many/")
        finally:
            done.set()
            watcher.join()
        assert found == [f"{seeded}/many/{i:04d}" for i in range(OBJECTS)]
        assert front.counts["list"] >= OBJECTS // 10
        assert not seen - before, f"threads listed: {sorted(t.name for t in seen - before)}"


def test_a_consumer_that_stops_early_leaves_no_listing_running(gcs_emulator: Emulator, seeded: str) -> None:
    before = _listing_threads()
    with GCSFront(gcs_emulator.endpoint, latency=0.1) as front:
        client = Client(front.client_config, RetryConfig(deadline=120))
        batches = list_prefix_parallel(client, seeded, "many/", page_size=5, concurrency=4)
        assert [item["name"] for item in next(batches)][:1] == ["many/0000"]
        time.sleep(1)  # pages keep coming back and ranges are split meanwhile
        front.latency = 60  # what is sent from now on is in flight when the consumer stops
        time.sleep(0.5)
        assert run(_listers()) or _listing_threads() - before, "the listing ended before the consumer stopped"
        batches.close()
        assert _nothing_lists_within(5, before), "the listing kept running after its consumer stopped"
        sent = front.counts["list"]
        time.sleep(0.5)
        assert front.counts["list"] == sent


def test_ctrl_c_while_waiting_for_a_batch_stops_the_listing(gcs_emulator: Emulator, seeded: str) -> None:
    before = _listing_threads()
    with GCSFront(gcs_emulator.endpoint, latency=60) as front:
        client = Client(front.client_config, RetryConfig(deadline=120))
        batches = list_prefix_parallel(client, seeded, "many/", page_size=5, concurrency=4)
        with ctrl_c_after(0.5):
            next(batches)
        assert _nothing_lists_within(5, before), "the listing kept running after Ctrl-C"
        assert front.counts["list"] == 1
