"""GCSFront with GCS's per-bucket request-rate ramp: 429 as GCS words it, per bucket, reads apart from writes,
and a limit that doubles under sustained load."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from torchdata_gcs.testing import Emulator, GCSFront, RateRamp


@pytest.fixture
def seeded(gcs_emulator: Emulator, gcs_bucket: str) -> str:
    gcs_emulator.seed(gcs_bucket, {f"o/{i}": b"x" * 100 for i in range(5)})
    return gcs_bucket


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def media(front: GCSFront, bucket: str, name: str = "o/0") -> str:
    return f"{front.endpoint}/download/storage/v1/b/{bucket}/o/{name.replace('/', '%2F')}?alt=media"


def test_reads_over_the_rate_get_gcs_s_429(gcs_emulator: Emulator, seeded: str, http: requests.Session) -> None:
    ramp = RateRamp(reads=5, writes=5, period=1000, burst=1.0)
    with GCSFront(gcs_emulator.endpoint, rate_ramp=ramp) as front:
        answers = [http.get(media(front, seeded), timeout=10) for _ in range(8)]
        assert [a.status_code for a in answers[:5]] == [200] * 5 and all(a.content == b"x" * 100 for a in answers[:5])
        refused = [a for a in answers if a.status_code == 429]
        assert len(refused) >= 2
        error = refused[0].json()["error"]
        assert error["code"] == 429 and seeded in error["message"]
        assert error["errors"][0]["reason"] == "rateLimitExceeded" and error["errors"][0]["domain"] == "usageLimits"
        xml = http.get(f"{front.endpoint}/{seeded}/o/0", timeout=10)
        assert xml.status_code == 429 and b"<Code>SlowDown</Code>" in xml.content
        assert xml.headers["Content-Type"].startswith("application/xml")
        assert ramp.refused[(seeded, "read")] == len(refused) + 1


def test_buckets_reads_and_writes_have_limits_of_their_own(
    gcs_emulator: Emulator, seeded: str, http: requests.Session
) -> None:
    other = f"{seeded}-b"
    gcs_emulator.seed(other, {"o/0": b"y"})
    ramp = RateRamp(reads=3, writes=2, period=1000, burst=1.0)
    with GCSFront(gcs_emulator.endpoint, rate_ramp=ramp) as front:
        assert [http.get(media(front, seeded), timeout=10).status_code for _ in range(4)] == [200] * 3 + [429]
        assert http.get(media(front, other), timeout=10).status_code == 200  # another bucket: its own limit
        upload = f"{front.endpoint}/upload/storage/v1/b/{seeded}/o?uploadType=media&name=w/%s&ifGenerationMatch=0"
        statuses = [http.post(upload % i, data=b"w", timeout=10).status_code for i in range(3)]
        assert statuses == [200, 200, 429]  # writes: their own, lower limit, not spent by the reads
        assert front.counts["upload"] == 3 and gcs_emulator.names(seeded).count("w/2") == 0


def test_the_limit_doubles_after_a_period_of_load_near_it(
    gcs_emulator: Emulator, seeded: str, http: requests.Session
) -> None:
    ramp = RateRamp(reads=20, writes=5, period=2, burst=1.0)
    with GCSFront(gcs_emulator.endpoint, rate_ramp=ramp) as front:
        start = time.monotonic()
        assert ramp.rate(seeded) == 20
        while ramp.rate(seeded) == 20 and time.monotonic() - start < 20:
            http.get(media(front, seeded), timeout=10)  # as fast as it goes: above 20 a second here
        assert ramp.rate(seeded) == 40
        assert time.monotonic() - start >= 2.0  # not before a period of load
        assert ramp.allowed(seeded, start, time.monotonic()) > 20 * (time.monotonic() - start)
    idle = RateRamp(reads=20, writes=5, period=2, burst=1.0)
    with GCSFront(gcs_emulator.endpoint, rate_ramp=idle) as front:
        for _ in range(8):  # a request every half second: a load far below the limit
            http.get(media(front, seeded), timeout=10)
            time.sleep(0.5)
        assert idle.rate(seeded) == 20
