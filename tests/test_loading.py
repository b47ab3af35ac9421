"""load_files_by_gcs against the embedded emulator (and a corrupting proxy in front of it)."""

from __future__ import annotations

import os
import pickle
import threading
import time

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.http_proxy import RecordingProxy
from tests.test_listing import AWKWARD_NAMES
from torchdata_gcs import (
    ClientConfig,
    GCSFileLoaderIterDataPipe,
    IntegrityError,
    InvalidURIError,
    MissingObjectWarning,
    NotFoundError,
    RetryConfig,
    TransferConfig,
    TransientError,
)
from torchdata_gcs._download import ByteBudget
from torchdata_gcs.testing import Emulator

FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


def read_all(pipe) -> list[tuple[str, bytes]]:
    return [(url, stream.read()) for url, stream in pipe]


def test_loads_every_object_bit_exact_in_input_order(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    objects = {f"o/{i:03d}": os.urandom(i * 997 % 50_000) for i in range(120)}
    gcs_emulator.seed(gcs_bucket, objects)
    urls = [f"gs://{gcs_bucket}/{name}" for name in sorted(objects, reverse=True)]
    loaded = read_all(GCSFileLoaderIterDataPipe(urls, client=client, transfer=TransferConfig(max_in_flight=8)))
    assert loaded == [(url, objects[url.split("/", 3)[3]]) for url in urls]


def test_chains_after_the_lister_with_metadata(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"m/a": b"alpha", "m/b": b"beta"})
    pipe = IterableWrapper([f"gs://{gcs_bucket}/m/"]).list_files_by_gcs(client=client, with_metadata=True)
    pipe = pipe.load_files_by_gcs(client=client)
    assert read_all(pipe) == [(f"gs://{gcs_bucket}/m/a", b"alpha"), (f"gs://{gcs_bucket}/m/b", b"beta")]
    streams = [stream for _, stream in GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/m/a"], client=client)]
    assert streams[0].seek(2) == 2 and streams[0].read() == b"pha"


def test_awkward_names_download(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {name: name.encode() * 3 for name in AWKWARD_NAMES})
    pipe = IterableWrapper([f"gs://{gcs_bucket}/"]).list_files_by_gcs(client=client).load_files_by_gcs(client=client)
    assert dict(read_all(pipe)) == {f"gs://{gcs_bucket}/{name}": name.encode() * 3 for name in AWKWARD_NAMES}


def test_missing_object_raises_naming_the_url(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"present": b"here"})
    missing = f"gs://{gcs_bucket}/absent #1"
    with pytest.raises(NotFoundError) as info:
        read_all(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/present", missing], client=client))
    assert info.value.url == missing and missing in str(info.value)


def test_missing_object_is_skipped_with_a_warning_when_asked(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"1", "c": b"3"})
    urls = [f"gs://{gcs_bucket}/{name}" for name in "abc"]
    with pytest.warns(MissingObjectWarning, match=f"gs://{gcs_bucket}/b"):
        loaded = read_all(GCSFileLoaderIterDataPipe(urls, client=client, skip_missing=True))
    assert loaded == [(urls[0], b"1"), (urls[2], b"3")]


def test_object_overwritten_after_listing_fails_loudly(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"v": b"version one"})
    listed = list(IterableWrapper([f"gs://{gcs_bucket}/v"]).list_files_by_gcs(client=client, with_metadata=True))
    gcs_emulator.upload(gcs_bucket, "v", b"version two!")
    with pytest.raises(NotFoundError, match=r"generation \d+ no longer exists") as info:
        read_all(GCSFileLoaderIterDataPipe(listed, client=client))
    assert info.value.url == f"gs://{gcs_bucket}/v"
    assert read_all(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/v"], client=client))[0][1] == b"version two!"


def test_corrupted_download_raises_integrity_error(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"payload": b"precious bytes" * 100})
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        proxy.corrupt_downloads = True
        pipe = GCSFileLoaderIterDataPipe(
            [f"gs://{gcs_bucket}/payload"], client=ClientConfig(endpoint=proxy.endpoint), retry=FAST_RETRY
        )
        with pytest.raises(IntegrityError, match="crc32c"):
            read_all(pipe)
        media_gets = [path for method, path, _ in proxy.requests if "alt=media" in path]
        assert len(media_gets) == FAST_RETRY.max_attempts  # retried, then refused to deliver bad bytes
        proxy.corrupt_downloads = False
        assert read_all(pipe) == [(f"gs://{gcs_bucket}/payload", b"precious bytes" * 100)]


def test_throttling_and_server_errors_are_retried_over_http(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"r/a": b"first", "r/b": b"second"})
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        client = ClientConfig(endpoint=proxy.endpoint)
        proxy.fail_next = [429, 503]  # the list request, then its retry
        listed = list(IterableWrapper([f"gs://{gcs_bucket}/r/"]).list_files_by_gcs(client=client, retry=FAST_RETRY))
        proxy.fail_next = [500, 429]
        pipe = GCSFileLoaderIterDataPipe(listed, client=client, retry=FAST_RETRY, transfer=TransferConfig(max_in_flight=1))
        assert read_all(pipe) == [(f"gs://{gcs_bucket}/r/a", b"first"), (f"gs://{gcs_bucket}/r/b", b"second")]
        assert len(proxy.requests) == 3 + 4  # list: 2 refused + 1; media: 2 refused + 2
        proxy.fail_next = [503] * FAST_RETRY.max_attempts
        with pytest.raises(TransientError) as info:
            read_all(GCSFileLoaderIterDataPipe(listed[:1], client=client, retry=FAST_RETRY))
        assert info.value.status == 503 and info.value.url == f"gs://{gcs_bucket}/r/a"


def test_objects_larger_than_the_buffer_still_load(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    objects = {f"big/{i}": os.urandom(300_000) for i in range(6)}
    gcs_emulator.seed(gcs_bucket, objects)
    transfer = TransferConfig(max_in_flight=4, max_buffered_bytes=100_000)
    pipe = GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/{n}" for n in sorted(objects)], client=client, transfer=transfer)
    assert [data for _, data in read_all(pipe)] == [objects[n] for n in sorted(objects)]


def test_byte_budget_bounds_what_waits_ahead_of_the_consumer() -> None:
    budget = ByteBudget(limit=100)
    budget.acquire(60, seq=0)
    budget.acquire(40, seq=1)
    blocked = threading.Event()
    done = threading.Event()

    def third() -> None:
        blocked.set()
        budget.acquire(50, seq=2)
        done.set()

    thread = threading.Thread(target=third)
    thread.start()
    blocked.wait()
    time.sleep(0.05)
    assert not done.is_set()  # 150 bytes would exceed the limit
    budget.release(60)
    budget.advance(1)
    assert done.wait(5)
    budget.acquire(500, seq=1)  # the oldest undelivered item never waits
    thread.join()


def test_early_stop_releases_worker_threads(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {f"s/{i}": os.urandom(20_000) for i in range(40)})
    before = {t for t in threading.enumerate() if t.name.startswith("torchdata-gcs-load")}
    transfer = TransferConfig(max_in_flight=4, max_buffered_bytes=30_000)
    iterator = iter(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/s/{i}" for i in range(40)], client=client, transfer=transfer))
    next(iterator)
    iterator.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = {t for t in threading.enumerate() if t.name.startswith("torchdata-gcs-load")} - before
        if not alive:
            break
        time.sleep(0.05)
    assert not alive


def test_bad_items_raise_typed_errors(client: ClientConfig) -> None:
    with pytest.raises(InvalidURIError):
        GCSFileLoaderIterDataPipe(["gs://bucket-ok/"], client=client)  # a prefix, not an object
    with pytest.raises(InvalidURIError):
        GCSFileLoaderIterDataPipe([("gs://bucket-ok/x", {"size": 1})], client=client)  # type: ignore[list-item]
    with pytest.raises(InvalidURIError):
        read_all(IterableWrapper(["http://example.com/x"]).load_files_by_gcs(client=client))


def test_pickles_and_reports_length(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"p": b"pickled"})
    pipe = GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/p"], client=client)
    assert len(pipe) == 1
    assert read_all(pickle.loads(pickle.dumps(pipe))) == [(f"gs://{gcs_bucket}/p", b"pickled")]
    with pytest.raises(TypeError):
        len(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/p"], client=client, skip_missing=True))
