"""The process's answer to 429: a pace every request keeps, one backoff step for all, no death while it makes
progress; against the front's per-bucket request-rate ramp, in one process and in several."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.children import run_child
from torchdata_gcs import GCSFileLoaderIterDataPipe, RetryConfig, TransferConfig, TransientError
from torchdata_gcs._transport import throttle as throttle_module
from torchdata_gcs._transport.retry import Attempts
from torchdata_gcs._transport.throttle import CUT_INTERVAL, Throttle
from torchdata_gcs.testing import Emulator, GCSFront, RateRamp

RETRY = RetryConfig(initial_delay=0.1, max_delay=5.0)
THROTTLED = TransientError("GCS answered 429", url="gs://b/o", status=429)


def test_a_429_paces_every_request_of_the_process() -> None:
    async def scenario() -> list[float]:
        throttle = Throttle()
        for _ in range(40):  # 40 successes in about a tenth of a second: the bucket granted that much
            await throttle.acquire()
            throttle.leave()
            throttle.succeeded()
            await asyncio.sleep(0.0025)
        throttle.throttled()
        starts = []
        for _ in range(12):
            await throttle.acquire()
            starts.append(time.monotonic())
            throttle.leave()
        return starts

    starts = asyncio.run(scenario())
    # without a pace these would all start at once; at one the process slows down as a whole
    assert starts[-1] - starts[0] >= 11 * 0.5 / 400


def test_retries_go_before_new_requests_waiting_for_the_pace() -> None:
    async def scenario() -> list[str]:
        throttle = Throttle()
        throttle.succeeded()
        throttle.throttled(time.monotonic())  # a pace of a few requests a second
        order: list[str] = []

        async def one(name: str, retry: bool) -> None:
            await throttle.acquire(retry=retry)
            order.append(name)
            throttle.leave()

        await asyncio.gather(one("new-1", False), one("new-2", False), one("retry", True))
        return order

    assert asyncio.run(scenario()).index("retry") <= 1  # the first may already have had its turn


def test_answers_to_requests_sent_before_a_cut_cut_nothing_more() -> None:
    async def scenario() -> None:
        throttle = Throttle()
        for _ in range(50):
            throttle.succeeded()
        sent = time.monotonic()
        throttle.throttled(sent)
        first = throttle.pace
        assert first is not None and throttle.level == 1
        throttle.throttled(sent)  # the same burst
        assert throttle.pace == first and throttle.level == 1
        await asyncio.sleep(CUT_INTERVAL)
        throttle.throttled(sent)  # a late answer to a request sent before the cut
        assert throttle.pace == first and throttle.level == 1
        throttle.throttled(time.monotonic())  # a request sent after the cut, refused too: the pace was too fast
        assert throttle.pace is not None and throttle.pace < first and throttle.level == 2
        throttle.succeeded()
        assert throttle.level == 0

    asyncio.run(scenario())


def test_a_pace_met_long_after_its_cut_grows_in_proportion() -> None:
    throttle = Throttle()
    throttle.pace, throttle._last_cut = 1000.0, time.monotonic() - 10.0  # a cut long ago
    for _ in range(1000):  # a second's successes at the pace
        throttle.succeeded()
    assert throttle.pace is not None and throttle.pace >= 1090.0  # a tenth more, not 10 requests/s more


def test_a_pace_met_just_after_its_cut_grows_by_a_constant() -> None:
    throttle = Throttle()
    throttle.pace, throttle._last_cut = 1000.0, time.monotonic()  # just cut
    for _ in range(1000):
        throttle.succeeded()
    assert throttle.pace is not None and 1005.0 <= throttle.pace <= 1015.0


def test_a_429_waits_by_the_process_s_step_with_full_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle_module, "CUT_INTERVAL", 0.0)  # cuts one after another, without waiting

    async def scenario() -> None:
        throttle = Throttle()
        throttle.succeeded()
        throttle.throttled(time.monotonic())
        late = Attempts(RETRY, "gs://b/o", throttle=throttle)
        late.attempt = 9  # a request retried often: alone it would wait up to max_delay
        delays = [late.delay_after(THROTTLED) for _ in range(30)]
        assert all(0 <= d <= RETRY.initial_delay for d in delays)  # the process's step is 1: it just succeeded
        assert len({round(d, 6) for d in delays}) > 20  # drawn, not one fixed wait shared by every request
        for _ in range(3):
            throttle.throttled(time.monotonic() + 1)  # cuts with no success between: the step grows for all
        fresh = Attempts(RETRY, "gs://b/other", throttle=throttle)
        assert max(fresh.delay_after(THROTTLED) for _ in range(200)) > RETRY.initial_delay * 4

    asyncio.run(scenario())


def test_one_process_reads_everything_with_few_429s(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {f"s/{i:04d}": i.to_bytes(4, "big") * 50 for i in range(800)}
    gcs_emulator.seed(gcs_bucket, objects, concurrency=32)
    urls = [f"gs://{gcs_bucket}/{name}" for name in objects]
    ramp = RateRamp(reads=150, writes=30, period=1000)
    # a deadline far shorter than the read: throttled requests wait longer than it, while others succeed
    retry = RetryConfig(initial_delay=0.05, max_delay=1.0, deadline=1.5)
    with GCSFront(gcs_emulator.endpoint, rate_ramp=ramp) as front:
        pipe = GCSFileLoaderIterDataPipe(
            urls, client=front.client_config, retry=retry, transfer=TransferConfig(max_in_flight=64)
        )
        read = {url: stream.read() for url, stream in pipe}
    assert read == {f"gs://{gcs_bucket}/{name}": data for name, data in objects.items()}
    refused, admitted = ramp.refused[(gcs_bucket, "read")], ramp.admitted[(gcs_bucket, "read")]
    assert refused > 0 and pipe.stats.throttled == refused
    assert refused / (refused + admitted) <= 0.3


READER = """
import json, sys, time
from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe, RetryConfig, TransferConfig
spec = json.loads(sys.stdin.read())
pipe = GCSFileLoaderIterDataPipe(
    spec["urls"], client=ClientConfig(endpoint=spec["endpoint"]),
    retry=RetryConfig(initial_delay=0.05, max_delay=1.0, deadline=spec["deadline"]),
    transfer=TransferConfig(max_in_flight=64),
)
read, error = {}, None
try:
    for url, stream in pipe:
        read[url] = stream.read().hex()
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"read": read, "error": error, "throttled": pipe.stats.throttled}))
"""


@pytest.mark.parametrize("processes", [3])
def test_processes_sharing_a_bucket_all_finish_with_few_429s(
    gcs_emulator: Emulator, gcs_bucket: str, processes: int
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    objects = {f"m/{i:04d}": i.to_bytes(4, "big") * 25 for i in range(900)}
    gcs_emulator.seed(gcs_bucket, objects, concurrency=32)
    urls = sorted(f"gs://{gcs_bucket}/{name}" for name in objects)
    ramp = RateRamp(reads=150, writes=30, period=1000)
    with GCSFront(gcs_emulator.endpoint, rate_ramp=ramp) as front:
        specs = [{"urls": urls[k::processes], "endpoint": front.endpoint, "deadline": 1.5} for k in range(processes)]
        with ThreadPoolExecutor(processes) as pool:
            results = list(pool.map(lambda spec: run_child(READER, spec, timeout=120), specs))
    assert [r["error"] for r in results] == [None] * processes
    read = {url: bytes.fromhex(data) for r in results for url, data in r["read"].items()}
    assert read == {f"gs://{gcs_bucket}/{name}": data for name, data in objects.items()}
    refused, admitted = ramp.refused[(gcs_bucket, "read")], ramp.admitted[(gcs_bucket, "read")]
    assert sum(r["throttled"] for r in results) == refused > 0
    assert refused / (refused + admitted) <= 0.3
