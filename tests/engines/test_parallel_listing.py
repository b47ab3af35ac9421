"""Parallel key-range listing: same names as a sequential listing, in order, within 1.5x its requests."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdata_gcs import (
    AccessDeniedError,
    DeadlineExceededError,
    GCSFileListerIterDataPipe,
    NotFoundError,
    RetryConfig,
)
from torchdata_gcs._engines.parallel_listing import KeySpace, split_point
from torchdata_gcs.testing import Emulator, Fault, GCSFront

CHARS = [" ", "/", "0", "9", "a", "b", "z", "~", "é", "日", "😀", "\U0010fffd"]  # sorted; both ends of the range
SUFFIXES = st.text(st.sampled_from(CHARS), min_size=1, max_size=8)
FAST_RETRY = RetryConfig(initial_delay=0.01, max_delay=0.05)


def space_of(names: list[str]) -> KeySpace:
    """The key space of exactly the characters ``names`` have at each position."""
    width = max(map(len, names)) + 1
    return KeySpace(["".join(sorted({name[i] for name in names if i < len(name)})) for i in range(width)])


@given(names=st.lists(st.text(st.sampled_from(CHARS), max_size=6), min_size=2, max_size=20, unique=True))
def test_key_space_preserves_name_order(names: list[str]) -> None:
    space = space_of(names)
    assert sorted(names, key=space.value) == sorted(names)
    assert all(space.name(space.value(name)) == name for name in names)


@given(
    pair=st.lists(st.text(st.sampled_from(CHARS), max_size=5), min_size=2, max_size=2, unique=True).map(sorted),
    unbounded=st.booleans(),
    stride=st.integers(0, 10**6),
)
def test_split_points_fall_strictly_inside_the_range(pair: list[str], unbounded: bool, stride: int) -> None:
    low, high = pair[0], None if unbounded else pair[1]
    space = KeySpace(["".join(CHARS)] * 6)
    middle = split_point(low, high, space, stride)
    if middle is not None:
        assert low < middle and (high is None or middle < high)


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    with GCSFront(gcs_emulator.endpoint) as running:
        yield running


def sequential_pages(count: int, page_size: int) -> int:
    return max(1, -(-count // page_size))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    suffixes=st.lists(SUFFIXES, max_size=60, unique=True),
    shared=st.sampled_from(["", "x" * 40 + "/", "日本/"]),
    page_size=st.integers(2, 7),
    concurrency=st.integers(1, 6),
)
def test_parallel_listing_equals_a_sequential_one(
    gcs_emulator: Emulator, front: GCSFront, suffixes: list[str], shared: str, page_size: int, concurrency: int
) -> None:
    bucket = f"par-{uuid.uuid4().hex[:12]}"
    names = sorted({shared + suffix for suffix in suffixes} | {"outside-" + suffix for suffix in suffixes[:3]})
    gcs_emulator.seed(bucket, {name: b"" for name in names})
    front.index_listings(bucket)
    url = f"gs://{bucket}/{shared}"
    front.reset_counts()
    lister = GCSFileListerIterDataPipe(
        url, client=front.client_config, page_size=page_size, concurrency=concurrency, allow_empty=True
    )
    listed = list(lister)
    expected = [f"gs://{bucket}/{name}" for name in names if name.startswith(shared) and not name.endswith("/")]
    assert listed == expected
    assert lister.stats.requests == front.counts["list"]
    assert lister.stats.requests <= 1.5 * sequential_pages(lister.stats.objects, page_size)


@pytest.fixture(scope="module")
def sized_prefixes() -> Iterator[tuple[Emulator, GCSFront]]:
    """Prefixes holding 0, 1, 999, 1,000 and 1,001 objects, in an emulator of their own."""
    with Emulator(backend="filesystem") as emulator:
        objects = {f"n{count}/{i:05d}": b"" for count in (1, 999, 1000, 1001) for i in range(count)}
        emulator.seed("sized-prefixes", objects, concurrency=32)
        with GCSFront(emulator.endpoint) as running:
            running.index_listings("sized-prefixes")
            yield emulator, running


@pytest.mark.parametrize("count", [0, 1, 999, 1000, 1001])
def test_prefix_sizes_around_a_page(sized_prefixes: tuple[Emulator, GCSFront], count: int) -> None:
    _, running = sized_prefixes
    running.reset_counts()
    lister = GCSFileListerIterDataPipe(
        f"gs://sized-prefixes/n{count}/", client=running.client_config, concurrency=8, allow_empty=True
    )
    listed = list(lister)
    assert listed == [f"gs://sized-prefixes/n{count}/{i:05d}" for i in range(count)]
    assert running.counts["list"] == lister.stats.requests <= 1.5 * sequential_pages(count, 1000)


def test_throttled_pages_are_retried(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"t/{i:03d}": b"" for i in range(60)})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_429", rate=0.3, match="list")]) as throttled:
        lister = GCSFileListerIterDataPipe(
            f"gs://{gcs_bucket}/t/", client=throttled.client_config, page_size=5, concurrency=4, retry=FAST_RETRY
        )
        assert list(lister) == [f"gs://{gcs_bucket}/t/{i:03d}" for i in range(60)]
        assert throttled.faults_injected["http_429"] > 0


def test_missing_bucket_and_early_stop(front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    with pytest.raises(NotFoundError):
        list(GCSFileListerIterDataPipe("gs://no-such-bucket-par/", client=front.client_config, concurrency=4))
    gcs_emulator.seed(gcs_bucket, {f"s/{i:03d}": b"" for i in range(50)})
    before = {t for t in threading.enumerate() if t.name == "torchdata-gcs-list"}
    iterator = iter(
        GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/s/", client=front.client_config, page_size=2, concurrency=4)
    )
    assert next(iterator) == f"gs://{gcs_bucket}/s/000"
    iterator.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and {t for t in threading.enumerate() if t.name == "torchdata-gcs-list"} - before:
        time.sleep(0.05)
    assert not {t for t in threading.enumerate() if t.name == "torchdata-gcs-list"} - before


def test_a_hanging_list_request_is_retried_then_given_up(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"h/{i:03d}": b"" for i in range(30)})
    expected = [f"gs://{gcs_bucket}/h/{i:03d}" for i in range(30)]
    hangs = Fault("stall", match="list", times=2, stall_seconds=5)
    with GCSFront(gcs_emulator.endpoint, faults=[hangs]) as front:
        client = dataclasses.replace(front.client_config, read_timeout=0.3)
        lister = GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/h/", client=client, page_size=10, retry=FAST_RETRY)
        assert list(lister) == expected
        assert front.faults_injected["stall"] == 2
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("stall", match="list", stall_seconds=5)]) as front:
        client = dataclasses.replace(front.client_config, read_timeout=0.3)
        give_up = RetryConfig(initial_delay=0.01, max_delay=0.05, deadline=1.0)
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError, match=r"RetryConfig.deadline \(1 s"):
            list(GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/h/", client=client, retry=give_up))
        assert time.monotonic() - started < 3


def test_permission_denied_is_not_retried(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"p/x": b""})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="list")]) as front:
        with pytest.raises(AccessDeniedError):
            list(GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/p/", client=front.client_config, retry=FAST_RETRY))
        assert front.counts["list"] == 1


def name_sets() -> dict[str, list[str]]:
    """Names of different shapes under ``d/``: numbered, hashed, skewed toward one sub-prefix, mixed, few."""
    hashed = [hashlib.sha1(str(i).encode()).hexdigest()[:12] for i in range(400)]
    return {
        "numbered": [f"d/{i:06d}.jpg" for i in range(400)],
        "hashed": [f"d/{h}" for h in hashed],
        "skewed": [f"d/a/{i:05d}" for i in range(360)] + [f"d/{c}/{i}" for c in "bcdefghij" for i in range(3)],
        "mixed": [f"d/{kind}/{h}" for kind, h in zip(["img", "txt", "a-b", "Z"] * 100, hashed, strict=True)],
        "few": [f"d/{i}" for i in range(7)],
    }


@pytest.fixture(scope="module")
def shaped(gcs_emulator: Emulator) -> Iterator[tuple[GCSFront, dict[str, str]]]:
    """Each name set of :func:`name_sets` in a bucket of its own (beside a few names outside ``d/``),
    behind a front that records every request (so it passes lists to the emulator: no snapshot) and answers
    each after 50 ms, so that requests go in rounds as they do to GCS."""
    buckets = {}
    with GCSFront(gcs_emulator.endpoint, record=True, latency=0.05) as running:
        for kind, names in name_sets().items():
            bucket = buckets[kind] = f"shape-{kind}-{uuid.uuid4().hex[:8]}"
            gcs_emulator.seed(bucket, {name: b"" for name in [*names, "c", "e/1", "d"]}, concurrency=32)
        yield running, buckets


def list_requests(front: GCSFront, since: int = 0) -> list[dict[str, list[str]]]:
    """The queries of the list requests ``front`` received (after its first ``since`` requests), in order."""
    return [
        parse_qs(urlsplit(request.target).query)
        for request in front.recorded[since:]
        if request.method == "GET" and urlsplit(request.target).path.endswith("/o")
    ]


@pytest.mark.parametrize("kind", list(name_sets()))
def test_shapes_of_names_listed_once_in_order_within_the_bound(
    shaped: tuple[GCSFront, dict[str, str]], kind: str
) -> None:
    running, buckets = shaped
    names, bucket, page_size = name_sets()[kind], buckets[kind], 10
    since = len(running.recorded)
    lister = GCSFileListerIterDataPipe(
        f"gs://{bucket}/d/", client=running.client_config, page_size=page_size, concurrency=16
    )
    assert list(lister) == [f"gs://{bucket}/{name}" for name in sorted(names)]
    queries = list_requests(running, since)
    assert len(queries) == lister.stats.requests <= 1.5 * sequential_pages(len(names), page_size)
    # The first split is guessed from the first page and goes out beside the first range's second page,
    # not after its fourth: one of the first three requests starts a range of its own.
    split_early = any("pageToken" not in query and query["startOffset"] != ["d/"] for query in queries[:3])
    assert split_early == (len(names) > page_size)


def test_each_listing_of_a_pipe_keeps_its_own_request_budget(
    gcs_emulator: Emulator, shaped: tuple[GCSFront, dict[str, str]]
) -> None:
    running, _ = shaped
    bucket = f"budget-{uuid.uuid4().hex[:8]}"
    names = [f"big/{i:04d}" for i in range(300)] + [f"small/{i:04d}" for i in range(12)]
    gcs_emulator.seed(bucket, {name: b"" for name in names}, concurrency=32)
    since = len(running.recorded)
    urls = [f"gs://{bucket}/big/", f"gs://{bucket}/small/"]
    lister = GCSFileListerIterDataPipe(urls, client=running.client_config, page_size=4, concurrency=16)
    assert list(lister) == [f"gs://{bucket}/{name}" for name in names]
    small = [query for query in list_requests(running, since) if query["prefix"] == ["small/"]]
    # What the first listing earned is not spent on the second: 3 pages' worth of names, 4 requests at most.
    assert len(small) <= 1.5 * sequential_pages(12, 4)


def test_names_at_the_split_points_and_unusual_names_are_listed_once(
    gcs_emulator: Emulator, shaped: tuple[GCSFront, dict[str, str]]
) -> None:
    """Ranges meet at split points (``endOffset`` of one, ``startOffset`` of the next): a name equal to one
    belongs to the upper range alone. Over every digit string of up to 3 digits each split is such a name;
    then names that mix other scripts, the highest code point, ``~`` (after every ASCII letter and digit)
    and names below other names into numbered ones."""
    running, _ = shaped
    digits = sorted({f"{i:03d}"[:length] for i in range(1000) for length in (1, 2, 3)})
    suffixes = ["", "~", "/x", "/x/~", " b", "é", "日本/語", "😀", "\U0010fffd"]
    mixed = [f"{i:03d}{suffix}" for i in range(0, 600, 10) for suffix in suffixes]
    for names in (digits, mixed):
        bucket = f"cuts-{uuid.uuid4().hex[:8]}"
        gcs_emulator.seed(bucket, {f"d/{name}": b"" for name in names} | {"c": b"", "e": b""}, concurrency=32)
        since = len(running.recorded)
        url = f"gs://{bucket}/d/"
        lister = GCSFileListerIterDataPipe(url, client=running.client_config, page_size=10, concurrency=16)
        assert list(lister) == [url + name for name in sorted(names)]
        queries = list_requests(running, since)
        starts = {query["startOffset"][0][2:] for query in queries if "pageToken" not in query} - {""}
        assert starts and (names is mixed or starts <= set(names)), sorted(starts)
        assert len(queries) == lister.stats.requests <= 1.5 * sequential_pages(len(names), 10)
