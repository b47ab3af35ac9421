"""The loader through the rig's faults: every object once and bit-exact, or a typed error; never a wrong sample."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import warnings

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import (
    AccessDeniedError,
    DeadlineExceededError,
    GCSFileLoaderIterDataPipe,
    RetryConfig,
    TransferConfig,
)
from torchdata_gcs._transport.session import session_for
from torchdata_gcs._transport.throttle import Throttle
from torchdata_gcs.testing import Emulator, Fault, GCSFront

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

N_OBJECTS = 2_000
BUCKET = "loader-faults"
PATIENT = RetryConfig(max_attempts=12, initial_delay=0.01, max_delay=0.2, deadline=120)


def content(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (1 + i % 200)


@pytest.fixture(scope="module")
def dataset(gcs_emulator: Emulator) -> dict[str, bytes]:
    objects = {f"f/{i:05d}": content(i) for i in range(N_OBJECTS)}
    gcs_emulator.seed(BUCKET, objects, concurrency=32)
    return {f"gs://{BUCKET}/{name}": data for name, data in objects.items()}


def read_sample(item: tuple[str, object]) -> tuple[str, bytes]:
    url, stream = item
    return url, stream.read()  # type: ignore[attr-defined]


def run_pipeline(front: GCSFront, retry: RetryConfig, read_timeout: float = 2.0) -> list[tuple[str, bytes]]:
    client = dataclasses.replace(front.client_config, read_timeout=read_timeout)
    pipe = (
        IterableWrapper([f"gs://{BUCKET}/f/"])
        .list_files_by_gcs(client=client, retry=retry, with_metadata=True, page_size=500)
        .sharding_filter()
        .load_files_by_gcs(client=client, retry=retry)
        .map(read_sample)
    )
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        return list(loader)
    finally:
        loader.shutdown()


@pytest.mark.parametrize("kind", ["http_429", "http_503", "reset", "truncate", "stall"])
def test_two_workers_deliver_every_object_once_through_ten_percent_faults(
    gcs_emulator: Emulator, dataset: dict[str, bytes], kind: str
) -> None:
    fault = Fault(kind, rate=0.1, stall_seconds=5.0) if kind == "stall" else Fault(kind, rate=0.1)  # type: ignore[arg-type]
    with GCSFront(gcs_emulator.endpoint, faults=[fault], seed=7) as front:
        # A stall costs one read timeout: short enough to keep the test quick, long enough for a busy machine.
        delivered = run_pipeline(front, PATIENT, read_timeout=0.5 if kind == "stall" else 2.0)
        injected = front.faults_injected[kind]
    counts = collections.Counter(url for url, _ in delivered)
    assert set(counts) == set(dataset) and max(counts.values()) == 1
    assert all(data == dataset[url] for url, data in delivered)
    assert injected >= N_OBJECTS * 0.05


def test_a_deadline_exceeded_raises_a_typed_error(gcs_emulator: Emulator, dataset: dict[str, bytes]) -> None:
    hopeless = RetryConfig(initial_delay=0.05, max_delay=0.2, deadline=1.0)
    with (
        GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match="get")]) as front,
        pytest.raises(DeadlineExceededError, match=r"RetryConfig.deadline \(1 s.*last failure: GCS answered 503"),
    ):
        run_pipeline(front, hopeless)


def test_permission_denied_fails_at_once_naming_the_object(gcs_emulator: Emulator, dataset: dict[str, bytes]) -> None:
    urls = sorted(dataset)[:5]
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="range_get")]) as front:
        pipe = GCSFileLoaderIterDataPipe(urls, client=front.client_config, retry=PATIENT)
        with pytest.raises(AccessDeniedError, match=urls[0]):
            list(pipe)
        assert pipe.stats.retries == 0 and front.counts["range_get"] <= len(urls)


def test_429s_shrink_the_process_wide_limit(gcs_emulator: Emulator, dataset: dict[str, bytes]) -> None:
    urls = sorted(dataset)[:300]
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_429", rate=0.3, match="range_get")], seed=3) as front:
        pipe = GCSFileLoaderIterDataPipe(
            urls, client=front.client_config, retry=PATIENT, transfer=TransferConfig(max_in_flight=32)
        )
        assert [url for url, _ in pipe] == urls
        throttle = session_for(front.client_config).throttle
        assert pipe.stats.throttled == front.faults_injected["http_429"] > 0
        assert pipe.stats.retries >= pipe.stats.throttled
        assert throttle.limit < throttle.ceiling  # shared by every loader of this process and client


def test_throttle_halves_on_429_and_grows_back() -> None:
    async def scenario() -> None:
        throttle = Throttle(ceiling=8)
        for _ in range(8):
            await throttle.acquire()
        throttle.throttled()
        assert throttle.limit == 4
        throttle.throttled()  # the same burst: no second cut within a second
        assert throttle.limit == 4
        for _ in range(8):
            throttle.leave()
        for _ in range(4):
            await throttle.acquire()
        blocked = asyncio.ensure_future(throttle.acquire())
        await asyncio.sleep(0.01)
        assert not blocked.done()  # a fifth request waits
        throttle.leave()
        await asyncio.wait_for(blocked, 1)
        for _ in range(40):
            throttle.succeeded()
        assert throttle.limit == 8

    asyncio.run(scenario())
