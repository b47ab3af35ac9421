"""GCSFront over real HTTP: forwarding, counting, latency, bandwidth, every fault kind, streaming, the loader."""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from urllib.parse import quote, urlsplit

import pytest
import requests
import urllib3
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.http_proxy import RecordingProxy
from torchdata_gcs import GCSFileLoaderIterDataPipe, RetryConfig, TransferConfig
from torchdata_gcs.testing import REQUEST_KINDS, Emulator, Fault, GCSFront
from torchdata_gcs.testing._request_kinds import request_kind

MiB = 1024 * 1024
RETRY = RetryConfig(initial_delay=0.01, max_delay=0.05, max_attempts=10)


@pytest.fixture
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    with GCSFront(gcs_emulator.endpoint) as running:
        yield running


def media_url(endpoint: str, bucket: str, name: str) -> str:
    return f"{endpoint}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media"


def object_url(endpoint: str, bucket: str, name: str) -> str:
    return f"{endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"


def connect(front: GCSFront, timeout: float = 10.0) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(urlsplit(front.endpoint).netloc, timeout=timeout)


def target(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def test_forwards_every_method_with_the_headers_clients_need(
    gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront
) -> None:
    name, data = "dir/a b#1+ü.bin", os.urandom(70_000)
    gcs_emulator.seed(gcs_bucket, {name: data})
    with requests.Session() as http:
        direct = http.get(media_url(gcs_emulator.endpoint, gcs_bucket, name), timeout=10)
        via = http.get(media_url(front.endpoint, gcs_bucket, name), timeout=10)
        assert via.status_code == 200 and via.content == data
        for header in ("Content-Length", "Content-Type", "X-Goog-Generation", "Etag"):
            assert via.headers[header] == direct.headers[header]
        # the same hashes, each on a line of its own as GCS sends them (md5 first)
        assert via.raw.headers.getlist("X-Goog-Hash") == sorted(direct.headers["X-Goog-Hash"].split(","), reverse=True)
        ranged = http.get(media_url(front.endpoint, gcs_bucket, name), headers={"Range": "bytes=10-19"}, timeout=10)
        assert (ranged.status_code, ranged.headers["Content-Range"], ranged.content) == (
            206,
            f"bytes 10-19/{len(data)}",
            data[10:20],
        )
        head = http.head(media_url(front.endpoint, gcs_bucket, name), timeout=10)
        assert (head.status_code, head.headers["Content-Length"], head.content) == (200, str(len(data)), b"")
        missing = http.get(object_url(front.endpoint, gcs_bucket, "absent"), timeout=10)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
        patched = http.patch(object_url(front.endpoint, gcs_bucket, name), json={"metadata": {"k": "v"}}, timeout=10)
        assert patched.ok and http.get(object_url(front.endpoint, gcs_bucket, name), timeout=10).json()["metadata"] == {
            "k": "v"
        }
        # A resumable upload: the session URL the emulator hands out points back at the front.
        started = http.post(
            f"{front.endpoint}/upload/storage/v1/b/{gcs_bucket}/o",
            params={"uploadType": "resumable", "name": "resumed"},
            json={},
            timeout=10,
        )
        assert started.ok and started.headers["Location"].startswith(front.endpoint + "/")
        assert http.put(started.headers["Location"], data=b"resumed bytes", timeout=10).ok
    assert gcs_emulator.read(gcs_bucket, "resumed") == b"resumed bytes"


def test_paths_are_forwarded_byte_exact(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"a/b~c d": b"x"})  # found: no 404, which the front would look into upstream
    sent = f"/storage/v1/b/{gcs_bucket}/o/a%2fb%7Ec%20d?fields=name&x=%e2%82%ac"
    with RecordingProxy(gcs_emulator.endpoint) as recorder, GCSFront(recorder.endpoint) as front:
        connection = connect(front)
        connection.request("GET", sent)
        connection.getresponse().read()
        connection.close()
    assert [path for _, path, _ in recorder.requests] == [sent]


def test_counts_requests_by_kind(gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront) -> None:
    base, b = front.endpoint, gcs_bucket
    with requests.Session() as http:
        for name, data in (("a", b"first "), ("b", b"second")):
            upload = http.post(
                f"{base}/upload/storage/v1/b/{b}/o", params={"uploadType": "media", "name": name}, data=data, timeout=10
            )
            assert upload.ok
        answers = [
            http.get(f"{base}/storage/v1/b/{b}/o", timeout=10),  # list
            http.get(media_url(base, b, "a"), timeout=10),  # get
            http.get(object_url(base, b, "a") + "?alt=media", timeout=10),  # get, JSON path
            http.get(media_url(base, b, "a"), headers={"Range": "bytes=0-2"}, timeout=10),  # range_get
            http.get(object_url(base, b, "a"), timeout=10),  # metadata
            http.get(f"{base}/storage/v1/b/{b}", timeout=10),  # metadata, of the bucket
            http.head(media_url(base, b, "a"), timeout=10),  # metadata
            http.post(
                object_url(base, b, "ab") + "/compose",
                json={
                    "sourceObjects": [{"name": "a"}, {"name": "b"}],
                    "destination": {"contentType": "application/octet-stream"},
                },
                timeout=10,
            ),
            http.delete(object_url(base, b, "b"), timeout=10),
            http.get(f"{base}/storage/v1/b?project=p", timeout=10),  # other: the bucket list
        ]
    assert all(answer.ok for answer in answers)
    assert front.counts == Counter(
        {"upload": 2, "list": 1, "get": 2, "range_get": 1, "metadata": 3, "compose": 1, "delete": 1, "other": 1}
    )
    assert set(front.counts) <= set(REQUEST_KINDS)
    assert gcs_emulator.read(b, "ab") == b"first second"
    front.reset_counts()
    assert front.counts == Counter() and front.faults_injected == Counter()


@pytest.mark.parametrize(
    ("method", "path", "has_range", "kind"),
    [
        ("PUT", "/bkt/big.bin?partNumber=3&uploadId=xyz", False, "upload"),
        ("POST", "/bkt/big.bin?uploads", False, "upload"),
        ("POST", "/bkt/big.bin?uploadId=xyz", False, "upload"),
        ("PUT", "/upload/storage/v1/b/bkt/o?uploadType=resumable&upload_id=1", False, "upload"),
        ("GET", "/bkt/dir/obj", True, "range_get"),
        ("GET", "/bkt?list-type=2&prefix=dir/", False, "list"),
        ("GET", "/storage/v1/b/bkt/o?prefix=x&pageToken=t", False, "list"),
        ("POST", "/storage/v1/b/bkt/o/src/rewriteTo/b/bkt/o/dst", False, "other"),
    ],
)
def test_request_kinds_of_other_api_shapes(method: str, path: str, has_range: bool, kind: str) -> None:
    assert request_kind(method, path, has_range) == kind


@pytest.mark.parametrize("kind", ["http_429", "http_503"])
@pytest.mark.parametrize("retry_after", [None, 2])
def test_http_faults_answer_like_gcs(
    gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront, kind: str, retry_after: int | None
) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"x"})
    front.set_faults([Fault(kind, match="metadata", times=1, retry_after=retry_after)])  # type: ignore[arg-type]
    status = int(kind[-3:])
    connection = connect(front)
    connection.request("GET", target(object_url(front.endpoint, gcs_bucket, "x")))
    refused = connection.getresponse()
    assert refused.status == status and refused.getheader("Retry-After") == (None if retry_after is None else "2")
    assert b'"code": %d' % status in refused.read()
    socket_before = connection.sock
    connection.request("GET", target(object_url(front.endpoint, gcs_bucket, "x")))  # same connection, kept alive
    answered = connection.getresponse()
    assert answered.status == 200 and answered.read() and connection.sock is socket_before
    connection.close()
    assert front.faults_injected == Counter({kind: 1}) and front.counts == Counter({"metadata": 2})


def test_reset_reaches_the_client_as_a_connection_reset(
    gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront
) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"payload"})
    front.set_faults([Fault("reset", match="get")])
    connection = connect(front)
    connection.request("GET", target(media_url(front.endpoint, gcs_bucket, "x")))
    with pytest.raises(ConnectionResetError):
        connection.getresponse()
    connection.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(media_url(front.endpoint, gcs_bucket, "x"), timeout=10)
    assert requests.get(object_url(front.endpoint, gcs_bucket, "x"), timeout=10).ok  # other kinds still pass
    assert front.faults_injected == Counter({"reset": 2})


def test_truncate_sends_the_real_head_and_part_of_the_body(
    gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront
) -> None:
    data = os.urandom(100_000)
    gcs_emulator.seed(gcs_bucket, {"x": data})
    front.set_faults([Fault("truncate", match="get")])
    connection = connect(front)
    connection.request("GET", target(media_url(front.endpoint, gcs_bucket, "x")))
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Length") == str(len(data))
    assert "crc32c=" in response.getheader("X-Goog-Hash", "")
    with pytest.raises(http.client.IncompleteRead) as info:
        response.read()
    assert info.value.partial == data[: len(data) // 2]
    connection.close()
    with (
        urllib3.PoolManager(retries=False) as pool,
        pytest.raises(urllib3.exceptions.ProtocolError, match="IncompleteRead"),
    ):
        pool.request("GET", media_url(front.endpoint, gcs_bucket, "x"))


def test_stall_outlasts_the_client_timeout(gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"x"})
    front.set_faults([Fault("stall", match="metadata", times=1, stall_seconds=1.0)])
    started = time.monotonic()
    with pytest.raises(requests.ReadTimeout):
        requests.get(object_url(front.endpoint, gcs_bucket, "x"), timeout=(5, 0.3))
    assert time.monotonic() - started >= 0.3
    connection = connect(front, timeout=5)  # a client that waits longer sees the connection closed
    front.set_faults([Fault("stall", match="metadata", times=1, stall_seconds=0.2)])
    connection.request("GET", target(object_url(front.endpoint, gcs_bucket, "x")))
    with pytest.raises(http.client.RemoteDisconnected):
        connection.getresponse()
    connection.close()
    assert requests.get(object_url(front.endpoint, gcs_bucket, "x"), timeout=5).ok
    assert front.faults_injected == Counter({"stall": 2})


def test_rate_is_statistical_and_repeats_with_the_seed(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"x"})
    runs = []
    for _ in range(2):
        with (
            GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", rate=0.3)], seed=7) as front,
            urllib3.PoolManager(retries=False) as pool,
        ):
            statuses = [pool.request("GET", object_url(front.endpoint, gcs_bucket, "x")).status for _ in range(200)]
            assert front.faults_injected["http_503"] == statuses.count(503)
        runs.append(statuses)
    assert 30 <= runs[0].count(503) <= 90 and set(runs[0]) == {200, 503}
    assert runs[0] == runs[1]


def test_match_and_times_restrict_where_faults_land(gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront) -> None:
    gcs_emulator.seed(gcs_bucket, {"victim": b"v", "bystander": b"b", "doomed": b"d"})
    front.set_faults(
        [Fault("http_503", match=r"^GET /storage/v1/b/[^/]+/o/victim$", times=2), Fault("reset", match="delete")]
    )
    with requests.Session() as http:
        assert [
            http.get(object_url(front.endpoint, gcs_bucket, "bystander"), timeout=5).status_code for _ in range(3)
        ] == [200] * 3
        assert [
            http.get(object_url(front.endpoint, gcs_bucket, "victim"), timeout=5).status_code for _ in range(3)
        ] == [503, 503, 200]
        assert http.get(media_url(front.endpoint, gcs_bucket, "victim"), timeout=5).content == b"v"
        with pytest.raises(requests.ConnectionError):
            http.delete(object_url(front.endpoint, gcs_bucket, "doomed"), timeout=5)
        front.set_faults([Fault("http_429", match="get", times=1)])  # replaced, with a fresh allowance
        assert http.delete(object_url(front.endpoint, gcs_bucket, "doomed"), timeout=5).ok
        assert [http.get(media_url(front.endpoint, gcs_bucket, "victim"), timeout=5).status_code for _ in range(2)] == [
            429,
            200,
        ]
    assert front.faults_injected == Counter({"http_503": 2, "reset": 1, "http_429": 1})


def test_latency_delays_every_answer_faults_included(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"x"})
    with (
        GCSFront(gcs_emulator.endpoint, latency=0.05, faults=[Fault("http_503", match="list")]) as front,
        requests.Session() as http,
    ):
        for url in [object_url(front.endpoint, gcs_bucket, "x")] * 3 + [
            f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o"
        ]:
            started = time.monotonic()
            http.get(url, timeout=5)
            assert time.monotonic() - started >= 0.05
        front.latency = 0.1  # adjustable while running
        started = time.monotonic()
        assert http.get(object_url(front.endpoint, gcs_bucket, "x"), timeout=5).ok
        assert time.monotonic() - started >= 0.1


def test_bandwidth_caps_each_download_and_upload(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = os.urandom(1_000_000)
    gcs_emulator.seed(gcs_bucket, {"x": data})
    with GCSFront(gcs_emulator.endpoint, bandwidth=2_000_000) as front:
        started = time.monotonic()
        assert requests.get(media_url(front.endpoint, gcs_bucket, "x"), timeout=10).content == data
        assert time.monotonic() - started >= 0.9 * len(data) / 2_000_000
        started = time.monotonic()
        upload = f"{front.endpoint}/upload/storage/v1/b/{gcs_bucket}/o"
        answer = requests.post(upload, params={"uploadType": "media", "name": "y"}, data=data, timeout=10)
        assert answer.status_code == 200 and time.monotonic() - started >= 0.9 * len(data) / 2_000_000
    assert gcs_emulator.read(gcs_bucket, "y") == data


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def peak_rss_growth(work: Callable[[], None]) -> int:
    """Run ``work``; return how far this process's resident memory rose above its start meanwhile.

    The front serves in this process, so a body it held whole would show here.
    """
    baseline = peak = _rss()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return max(peak, _rss()) - baseline


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
def test_streams_large_bodies_both_ways_without_buffering_them(
    gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront
) -> None:
    data = os.urandom(64 * MiB)
    view = memoryview(data)
    digest = hashlib.sha256(data).hexdigest()

    def pieces() -> Iterator[bytes]:  # a chunked upload
        for start in range(0, len(data), MiB):
            yield bytes(view[start : start + MiB])

    upload = f"{front.endpoint}/upload/storage/v1/b/{gcs_bucket}/o"

    def round_trips() -> None:
        with requests.Session() as http:
            chunked = http.post(upload, params={"uploadType": "media", "name": "chunked"}, data=pieces(), timeout=60)
            sized = http.post(upload, params={"uploadType": "media", "name": "sized"}, data=data, timeout=60)
            assert chunked.ok and sized.ok
            for name in ("chunked", "sized"):
                received = hashlib.sha256()
                with http.get(media_url(front.endpoint, gcs_bucket, name), stream=True, timeout=60) as response:
                    for piece in response.iter_content(MiB):
                        received.update(piece)
                assert received.hexdigest() == digest

    growth = peak_rss_growth(round_trips)
    for name in ("chunked", "sized"):
        gcs_emulator.delete(gcs_bucket, name)
    assert growth < 24 * MiB, f"grew by {growth / MiB:.1f} MiB while moving 4 x 64 MiB"


@pytest.mark.parametrize(
    "faults",
    [
        [Fault("http_503", rate=0.1), Fault("reset", rate=0.1)],
        [
            Fault("truncate", rate=0.1, match="range_get"),
            Fault("http_429", rate=0.1, retry_after=0),
            Fault("stall", rate=0.02, stall_seconds=1),
        ],
    ],
    ids=["503-and-resets", "cuts-429s-and-stalls"],
)
def test_the_loader_delivers_every_object_through_faults(
    gcs_emulator: Emulator, gcs_bucket: str, faults: list[Fault]
) -> None:
    objects = {f"f/{i:03d}": os.urandom(1 + i * 7919 % 60_000) for i in range(80)}
    gcs_emulator.seed(gcs_bucket, objects)
    with GCSFront(gcs_emulator.endpoint, faults=faults, seed=1) as front:
        client = dataclasses.replace(front.client_config, read_timeout=0.5)
        transfer = TransferConfig(max_in_flight=8)
        urls = list(IterableWrapper([f"gs://{gcs_bucket}/f/"]).list_files_by_gcs(client=client, retry=RETRY))
        loaded = [
            (url, stream.read())
            for url, stream in GCSFileLoaderIterDataPipe(urls, client=client, retry=RETRY, transfer=transfer)
        ]
        assert loaded == [(f"gs://{gcs_bucket}/{name}", objects[name]) for name in sorted(objects)]
        assert front.counts["range_get"] > len(objects)  # some were retried
        assert all(front.faults_injected[fault.kind] > 0 for fault in faults if fault.rate >= 0.1)


def test_start_and_stop_are_idempotent_and_stop_closes_everything(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"x"})
    front = GCSFront(gcs_emulator.endpoint, faults=[Fault("stall", match="list", stall_seconds=60)])
    with pytest.raises(RuntimeError, match="not running"):
        _ = front.client_config
    assert front.start() is front.start()
    endpoint = front.endpoint
    outcome: list[BaseException] = []

    def stalled() -> None:
        try:
            requests.get(f"{endpoint}/storage/v1/b/{gcs_bucket}/o", timeout=30)
        except requests.RequestException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=stalled)
    try:
        idle = connect(front)  # a kept-alive connection, idle
        idle.request("GET", target(object_url(endpoint, gcs_bucket, "x")))
        assert idle.getresponse().read()
        thread.start()
        deadline = time.monotonic() + 10
        while not front.faults_injected["stall"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert front.faults_injected["stall"] == 1
    finally:
        front.stop()
        front.stop()
    thread.join(timeout=20)
    assert not thread.is_alive() and isinstance(outcome[0], requests.ConnectionError)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        idle.request("GET", target(object_url(endpoint, gcs_bucket, "x")))
        idle.getresponse()
    idle.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(object_url(endpoint, gcs_bucket, "x"), timeout=5)
    with front:  # starts again, on a new port
        assert requests.get(object_url(front.endpoint, gcs_bucket, "x"), timeout=5).ok


def test_stops_when_the_block_raises(gcs_emulator: Emulator) -> None:
    with pytest.raises(RuntimeError, match="boom"), GCSFront(gcs_emulator.endpoint) as front:
        endpoint = front.endpoint
        assert requests.get(f"{endpoint}/storage/v1/b?project=p", timeout=5).ok
        raise RuntimeError("boom")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{endpoint}/storage/v1/b?project=p", timeout=5)


def test_bad_arguments_raise_value_error(gcs_emulator: Emulator) -> None:
    for bad in (
        {"kind": "http_500"},
        {"kind": "reset", "rate": 1.5},
        {"kind": "reset", "times": 0},
        {"kind": "reset", "retry_after": 1},
        {"kind": "http_429", "retry_after": -1},
        {"kind": "stall", "stall_seconds": 0},
        {"kind": "reset", "match": "GET /o/(unclosed"},
    ):
        with pytest.raises(ValueError):
            Fault(**bad)  # type: ignore[arg-type]
    for settings in ({"latency": -0.1}, {"bandwidth": 0}):
        with pytest.raises(ValueError):
            GCSFront(gcs_emulator.endpoint, **settings)  # type: ignore[arg-type]
    for upstream in ("https://storage.googleapis.com", "127.0.0.1:4443", "http://127.0.0.1:1/prefix"):
        with pytest.raises(ValueError):
            GCSFront(upstream)
    with pytest.raises(ValueError):
        GCSFront(gcs_emulator.endpoint).set_faults(["reset"])  # type: ignore[list-item]


def test_list_pages_are_capped_like_gcs(gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront) -> None:
    gcs_emulator.seed(gcs_bucket, {f"k/{i:04d}": b"" for i in range(1003)})
    url = f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o"
    for params in ({}, {"maxResults": "5000"}, {"prefix": "k/"}):
        page = requests.get(url, params=params, timeout=30).json()
        assert len(page["items"]) == 1000 and page["nextPageToken"]
    assert len(requests.get(url, params={"maxResults": "3"}, timeout=30).json()["items"]) == 3
    assert len(requests.get(f"{gcs_emulator.endpoint}/storage/v1/b/{gcs_bucket}/o", timeout=30).json()["items"]) == 1003


def test_compose_sources_are_checked_as_gcs_checks_them(
    gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront
) -> None:
    base, b = front.endpoint, gcs_bucket
    gcs_emulator.seed(b, {"a": b"first ", "b": b"second"})
    with requests.Session() as http:
        live = {name: int(http.get(object_url(base, b, name), timeout=10).json()["generation"]) for name in "ab"}

        def compose(destination: str, *sources: dict) -> requests.Response:
            body = {"sourceObjects": list(sources), "destination": {"contentType": "application/octet-stream"}}
            return http.post(object_url(base, b, destination) + "/compose", json=body, timeout=10)

        pinned = [
            {"name": n, "generation": live[n], "objectPreconditions": {"ifGenerationMatch": live[n]}} for n in "ab"
        ]
        assert compose("ab", *pinned).ok
        assert gcs_emulator.read(b, "ab") == b"first second"
        stale = compose("stale", {"name": "a", "objectPreconditions": {"ifGenerationMatch": live["a"] + 1}}, pinned[1])
        assert stale.status_code == 412
        old = compose("old", {"name": "a", "generation": live["a"] - 1}, pinned[1])
        assert old.status_code == 404
        missing = compose("missing", pinned[0], {"name": "absent"})
        assert missing.status_code == 404 and "absent" in missing.json()["error"]["message"]
        names = {item["name"] for item in http.get(f"{base}/storage/v1/b/{b}/o", timeout=10).json().get("items", [])}
    assert names == {"a", "b", "ab"}  # a refused compose writes nothing
    bare = requests.post(
        object_url(gcs_emulator.endpoint, b, "x") + "/compose", json={"sourceObjects": [{"name": "absent"}]}, timeout=10
    )
    assert bare.status_code >= 500  # why the front checks: the emulator answers a missing source with 500


def test_compose_of_sources_in_different_storage_classes_is_refused(
    gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront
) -> None:
    """GCS composes only sources of one storage class (its answer: 400), into a composite of that class;
    the emulator composes any, into a Standard one, and keeps the class an object was uploaded with."""
    gcs_emulator.seed(gcs_bucket, {"hot": b"hot "})
    gcs_emulator.seed(gcs_bucket, {"cold": b"cold ", "colder": b"colder"}, storage_class="NEARLINE")
    with requests.Session() as http:
        classes = {
            n: http.get(object_url(front.endpoint, gcs_bucket, n), timeout=10).json()["storageClass"]
            for n in ("hot", "cold")
        }
        assert classes == {"hot": "STANDARD", "cold": "NEARLINE"}

        def compose(endpoint: str, destination: str, *sources: str) -> requests.Response:
            body = {"sourceObjects": [{"name": name} for name in sources]}
            return http.post(object_url(endpoint, gcs_bucket, destination) + "/compose", json=body, timeout=10)

        mixed = compose(front.endpoint, "mixed", "hot", "cold")
        assert mixed.status_code == 400
        assert mixed.json()["error"]["message"] == "All of the source objects must have the same storage class."
        both_cold = compose(front.endpoint, "both-cold", "cold", "colder")
        assert both_cold.ok and both_cold.json()["storageClass"] == "NEARLINE"  # a composite has its sources' class
        assert (
            http.get(object_url(front.endpoint, gcs_bucket, "both-cold"), timeout=10).json()["storageClass"]
            == "NEARLINE"
        )
        assert gcs_emulator.read(gcs_bucket, "both-cold") == b"cold colder"
        assert "mixed" not in gcs_emulator.names(gcs_bucket)  # a refused compose writes nothing
        assert compose(gcs_emulator.endpoint, "mixed", "hot", "cold").ok  # why the front checks


def test_404s_carry_gcs_own_bodies(gcs_emulator: Emulator, gcs_bucket: str, front: GCSFront) -> None:
    """GCS names a missing bucket apart from a missing object, in the JSON API's error document, in a
    media read's text and in the XML API's error codes; the emulator answers "Not Found" to all."""
    gcs_emulator.seed(gcs_bucket, {"here": b"1"})
    absent = f"{gcs_bucket}-absent"
    no_bucket = "The specified bucket does not exist."

    def json_message(response: requests.Response) -> str:
        assert response.status_code == 404 and response.headers["Content-Type"].startswith("application/json")
        error = response.json()["error"]
        assert error["code"] == 404 and error["errors"] == [
            {"message": error["message"], "domain": "global", "reason": "notFound"}
        ]
        return str(error["message"])

    def media_text(response: requests.Response) -> str:
        assert response.status_code == 404 and response.headers["Content-Type"].startswith("text/html")
        return response.text

    compose = {"sourceObjects": [{"name": "here"}]}
    with requests.Session() as http:
        base = front.endpoint
        assert json_message(http.get(f"{base}/storage/v1/b/{absent}/o", timeout=10)) == no_bucket
        assert json_message(http.get(f"{base}/storage/v1/b/{absent}", timeout=10)) == no_bucket
        assert json_message(http.get(object_url(base, absent, "a/b"), timeout=10)) == no_bucket
        assert (
            json_message(http.get(object_url(base, gcs_bucket, "a/b"), timeout=10))
            == f"No such object: {gcs_bucket}/a/b"
        )
        assert (
            json_message(http.delete(object_url(base, gcs_bucket, "a"), timeout=10))
            == f"No such object: {gcs_bucket}/a"
        )
        upload = f"{base}/upload/storage/v1/b/{absent}/o?uploadType=media&name=x"
        assert json_message(http.post(upload, data=b"x", timeout=10)) == no_bucket
        assert (
            json_message(http.post(object_url(base, absent, "c") + "/compose", json=compose, timeout=10)) == no_bucket
        )
        assert (
            media_text(http.get(media_url(base, gcs_bucket, "a/b"), timeout=10)) == f"No such object: {gcs_bucket}/a/b"
        )
        assert media_text(http.get(media_url(base, absent, "a"), timeout=10)) == no_bucket
        xml = http.post(f"{base}/{absent}/x?uploads", timeout=10)
        assert xml.status_code == 404 and "<Code>NoSuchBucket</Code>" in xml.text
        bare = http.get(object_url(gcs_emulator.endpoint, absent, "a"), timeout=10)
        assert bare.status_code == 404 and bare.json()["error"]["message"] == "Not Found"  # why the front rewrites


def test_bucket_calls_are_answered_as_gcs_answers_them(front: GCSFront, gcs_emulator: Emulator) -> None:
    base = f"{front.endpoint}/storage/v1/b"
    for answer in (requests.get(base, timeout=10), requests.post(base, json={"name": "no-project"}, timeout=10)):
        assert answer.status_code == 400 and answer.json()["error"]["message"] == "Required parameter: project"
    listed = requests.get(f"{base}?project=p", timeout=10).json().get("items", [])
    assert "no-project" not in {bucket["name"] for bucket in listed}
    gcs_emulator.create_bucket("front-full-bucket")
    gcs_emulator.upload("front-full-bucket", "a", b"a")
    refused = requests.delete(f"{base}/front-full-bucket", timeout=10)
    assert refused.status_code == 409 and "not empty" in refused.json()["error"]["message"]
    assert gcs_emulator.names("front-full-bucket") == ["a"]
    requests.delete(f"{base}/front-full-bucket/o/a", timeout=10).raise_for_status()
    requests.delete(f"{base}/front-full-bucket", timeout=10).raise_for_status()
    assert requests.get(f"{base}/front-full-bucket", timeout=10).status_code == 404
