"""The HAProxy latency front: adds the configured delay, keeps requests concurrent, passes bytes intact."""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from torchdata_gcs import GCSFileLoaderIterDataPipe
from torchdata_gcs.testing import Emulator, GCSFront, LatencyFront

needs_haproxy = pytest.mark.haproxy
"""Skipped where HAProxy with Lua is missing, failed there instead under TORCHDATA_GCS_REQUIRE_HAPROXY (the
checkout's conftest.py)."""


def _get_seconds(session: requests.Session, url: str) -> float:
    started = time.perf_counter()
    session.get(url, timeout=10).raise_for_status()
    return time.perf_counter() - started


@needs_haproxy
def test_each_request_waits_at_least_the_latency(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"payload"})
    with LatencyFront(gcs_emulator.endpoint, latency=0.05) as front:
        session = requests.Session()
        url = f"{front.endpoint}/download/storage/v1/b/{gcs_bucket}/o/x?alt=media"
        delayed = [_get_seconds(session, url) for _ in range(5)]
    direct = requests.Session()
    bare = [
        _get_seconds(direct, f"{gcs_emulator.endpoint}/download/storage/v1/b/{gcs_bucket}/o/x?alt=media")
        for _ in range(5)
    ]
    assert min(delayed) >= 0.05
    assert statistics.median(bare) < 0.05  # the delay comes from the front, not the emulator


@needs_haproxy
def test_requests_wait_concurrently(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"payload"})
    with LatencyFront(gcs_emulator.endpoint, latency=0.2) as front:
        url = f"{front.endpoint}/download/storage/v1/b/{gcs_bucket}/o/x?alt=media"
        started = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            bodies = list(pool.map(lambda _: requests.get(url, timeout=10).content, range(16)))
        elapsed = time.perf_counter() - started
    assert bodies == [b"payload"] * 16
    assert elapsed < 16 * 0.2 / 2  # serial waiting would take 3.2 s


@needs_haproxy
def test_bytes_stream_through_intact(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {f"blob/{i}": os.urandom(size) for i, size in enumerate([0, 1, 65_536, 8 * 1024 * 1024])}
    gcs_emulator.seed(gcs_bucket, objects)
    with LatencyFront(gcs_emulator.endpoint, latency=0.0) as front:
        urls = [f"gs://{gcs_bucket}/{name}" for name in objects]
        loaded = {url: stream.read() for url, stream in GCSFileLoaderIterDataPipe(urls, client=front.client_config)}
    assert loaded == {f"gs://{gcs_bucket}/{name}": data for name, data in objects.items()}


@needs_haproxy
def test_list_pages_are_capped_like_gcs(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"k/{i:04d}": b"" for i in range(1005)})
    with LatencyFront(gcs_emulator.endpoint, latency=0.0) as front:
        url = f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o"
        for params in ({}, {"maxResults": "5000"}, {"prefix": "k/", "maxResults": "1000"}):
            page = requests.get(url, params=params, timeout=30).json()
            assert len(page["items"]) == 1000 and page["nextPageToken"]
        assert len(requests.get(url, params={"maxResults": "7"}, timeout=30).json()["items"]) == 7
    bare = requests.get(f"{gcs_emulator.endpoint}/storage/v1/b/{gcs_bucket}/o", timeout=30).json()
    assert len(bare["items"]) == 1005  # the emulator alone does not cap


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError):
        LatencyFront("https://storage.googleapis.com")
    with pytest.raises(ValueError):
        LatencyFront("http://127.0.0.1:1", latency=-1)


@needs_haproxy
def test_it_starts_in_front_of_a_gcs_front(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """The benchmarks put it before a ``GCSFront``, which answers a bucket listing without a project
    as GCS does (400): the readiness check must ask as GCS requires."""
    gcs_emulator.seed(gcs_bucket, {"x": b"payload"})
    with GCSFront(gcs_emulator.endpoint) as gcs_front, LatencyFront(gcs_front.endpoint, latency=0.01) as front:
        answer = requests.get(f"{front.endpoint}/download/storage/v1/b/{gcs_bucket}/o/x?alt=media", timeout=10)
        assert answer.content == b"payload"


@needs_haproxy
def test_tls_front_serves_https_that_a_trusting_client_reads_whole(
    gcs_emulator: Emulator, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTPS, as GCS serves it: a client that trusts the front's certificate reads large and small objects
    bit-exact (ranged reads included); one that does not is refused."""
    objects = {"large.bin": os.urandom(24 * 1024 * 1024), "small.bin": os.urandom(1000)}
    gcs_emulator.seed(gcs_bucket, objects)
    with LatencyFront(gcs_emulator.endpoint, latency=0, tls=True) as front:
        assert front.endpoint.startswith("https://")
        target = f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o/small.bin"
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(target, verify=True, timeout=10)
        assert requests.get(target, verify=front.ca_file, timeout=10).json()["size"] == "1000"
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", front.ca_file)
        urls = [f"gs://{gcs_bucket}/{name}" for name in objects]
        pipe = GCSFileLoaderIterDataPipe(urls, client=front.client_config)
        assert {url.rsplit("/", 1)[1]: stream.read() for url, stream in pipe} == objects
