"""Listed once per job (a manifest shared by replicas) and resumable without holes or duplicates."""

from __future__ import annotations

import gzip
import json
import pickle
import threading
import time
import uuid
import warnings
from collections.abc import Iterator

import pytest
import requests

from torchdata_gcs import (
    AccessDeniedError,
    ClientConfig,
    GCSFileListerIterDataPipe,
    IntegrityError,
    RetryConfig,
)
from torchdata_gcs._engines import shared_listing
from torchdata_gcs._engines.shared_listing import SharedListing
from torchdata_gcs._ops.client import Client
from torchdata_gcs.testing import Emulator, Fault, GCSFront

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

FAST_RETRY = RetryConfig(initial_delay=0.01, max_delay=0.05, max_attempts=3)
N_OBJECTS = 2_500


@pytest.fixture
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    with GCSFront(gcs_emulator.endpoint) as running:
        yield running


@pytest.fixture(scope="module")
def objects(gcs_emulator: Emulator) -> list[str]:
    bucket = "shared-listing-data"
    names = [f"data/{i:05d}.bin" for i in range(N_OBJECTS)]
    gcs_emulator.seed(bucket, {name: name.encode() for name in names}, concurrency=32)
    return [f"gs://{bucket}/{name}" for name in names]


@pytest.fixture
def dataset(objects: list[str]) -> tuple[str, list[str], str]:
    """The bucket, its objects, and a manifest folder for this test alone."""
    return "shared-listing-data", objects, f"listings-{uuid.uuid4().hex[:8]}/"


def manifest_objects(emulator: Emulator, bucket: str, folder: str) -> list[str]:
    answer = requests.get(f"{emulator.endpoint}/storage/v1/b/{bucket}/o", params={"prefix": folder}, timeout=10)
    return sorted(item["name"] for item in answer.json().get("items", []))


def wait_for_manifest(emulator: Emulator, bucket: str, folder: str) -> None:
    deadline = time.monotonic() + 30
    while not any(name.endswith(".jsonl.gz") for name in manifest_objects(emulator, bucket, folder)):
        assert time.monotonic() < deadline, "the manifest was never published"
        time.sleep(0.05)


def lister(bucket: str, folder: str, client: ClientConfig, **settings: object) -> GCSFileListerIterDataPipe:
    return GCSFileListerIterDataPipe(
        f"gs://{bucket}/data/", client=client, manifest=f"gs://{bucket}/{folder}", retry=FAST_RETRY, **settings
    )


def test_replicas_starting_together_list_once(gcs_emulator: Emulator, front: GCSFront, dataset) -> None:
    bucket, expected, folder = dataset
    results: list[list[str]] = [[] for _ in range(6)]
    pipes = [lister(bucket, folder, front.client_config, with_metadata=True, page_size=500) for _ in results]
    barrier = threading.Barrier(len(results))

    def replica(slot: int) -> None:
        barrier.wait()
        results[slot] = [url for url, _ in pipes[slot]]

    threads = [threading.Thread(target=replica, args=(slot,)) for slot in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(result == expected for result in results)
    listed = [pipe.stats.requests for pipe in pipes]
    assert sorted(listed)[:-1] == [0] * 5, "more than one replica listed"
    assert front.counts["list"] == max(listed) <= 1.5 * 5  # 2,500 names in pages of 500
    assert [name.rsplit(".", 2)[-2:] for name in manifest_objects(gcs_emulator, bucket, folder)] == [["jsonl", "gz"]]

    front.reset_counts()  # a later replica (a restarted worker) reads the manifest: no list call
    assert list(lister(bucket, folder, front.client_config)) == expected
    assert front.counts["list"] == 0 and front.counts["get"] == 1


def test_other_inputs_or_masks_list_anew(gcs_emulator: Emulator, front: GCSFront, dataset) -> None:
    bucket, expected, folder = dataset
    assert list(lister(bucket, folder, front.client_config)) == expected
    masked = list(lister(bucket, folder, front.client_config, masks="*7.bin"))
    assert masked == [url for url in expected if url.endswith("7.bin")]
    assert len(manifest_objects(gcs_emulator, bucket, folder)) == 2


def published_lines(emulator: Emulator, bucket: str, folder: str) -> tuple[str, list[str]]:
    """The name of the one manifest in ``folder`` and its lines (header first)."""
    (name,) = manifest_objects(emulator, bucket, folder)
    return name, gzip.decompress(emulator.read(bucket, name)).decode().splitlines()


def rewritten(lines: list[str], entries: list[list[object]]) -> bytes:
    """A well-formed manifest of ``lines``' header (its count fixed) holding ``entries``."""
    header = {**json.loads(lines[0]), "objects": len(entries)}
    return gzip.compress("\n".join([json.dumps(header)] + [json.dumps(entry) for entry in entries]).encode())


def forged(case: str, bucket: str, lines: list[str]) -> bytes:
    """The manifest rewritten by someone else who may write its folder."""
    entries = [json.loads(line) for line in lines[1:]]
    first = entries[0]
    if case == "another-bucket":
        return rewritten(lines, [[0, "gs://other-bucket/secret/x", *first[2:]], *entries])
    if case == "outside-the-prefix":
        return rewritten(lines, [*entries, [0, f"gs://{bucket}/secret/x", *first[2:]]])
    if case == "not-kept-by-the-mask":
        return rewritten(lines, [*entries[:-1], [0, f"gs://{bucket}/data/99999.txt", *first[2:]]])
    if case == "another-input":
        return rewritten(lines, [[1, *first[1:]], *entries[1:]])
    if case == "repeated":
        return rewritten(lines, [first, *entries])
    if case == "out-of-order":
        return rewritten(lines, [entries[1], entries[0], *entries[2:]])
    if case == "one-entry-lost":
        return gzip.compress("\n".join(lines[:-1]).encode())
    if case == "another-listing":
        foreign = json.dumps({**json.loads(lines[0]), "inputs": [f"gs://{bucket}/other/"]})
        return gzip.compress("\n".join([foreign, *lines[1:]]).encode())
    if case == "not-gzip":
        return b"<html>not a manifest</html>"
    if case == "truncated-gzip":
        return gzip.compress("\n".join(lines).encode())[:-100]
    if case == "gzip-bomb":
        return gzip.compress(lines[0].encode() + b"\n" + b" " * 50_000_000)
    if case == "not-json":
        return gzip.compress(b"{this is not json\n[0]")
    if case == "header-not-an-object":
        return gzip.compress(b"[1, 2]")
    if case == "entry-not-a-list":
        return rewritten(lines, [{"url": first[1]}])
    if case == "index-not-a-number":
        return rewritten(lines, [[True, *first[1:]], *entries[1:]])
    if case == "negative-size":
        return rewritten(lines, [[*first[:2], -1, *first[3:]], *entries[1:]])
    raise AssertionError(case)


FORGERIES = [
    "another-bucket",
    "outside-the-prefix",
    "not-kept-by-the-mask",
    "another-input",
    "repeated",
    "out-of-order",
    "one-entry-lost",
    "another-listing",
    "not-gzip",
    "truncated-gzip",
    "gzip-bomb",
    "not-json",
    "header-not-an-object",
    "entry-not-a-list",
    "index-not-a-number",
    "negative-size",
]


@pytest.mark.parametrize("case", FORGERIES)
def test_a_manifest_rewritten_by_another_is_refused_with_a_typed_error(
    gcs_emulator: Emulator, front: GCSFront, dataset, case: str
) -> None:
    """Whoever may write the folder may write the manifest: it never hands out an object its input would
    not list (another bucket's, say), and junk raises ``IntegrityError`` naming it at once, before any
    item, whatever replica reads it; the manifest is left for the user to look at, and no lock stays."""
    bucket, expected, folder = dataset
    assert list(lister(bucket, folder, front.client_config, masks="*.bin")) == expected
    name, lines = published_lines(gcs_emulator, bucket, folder)
    junk = forged(case, bucket, lines)
    gcs_emulator.upload(bucket, name, junk)
    for _ in range(2):  # a replica that reads it, then one that would list after it
        started = time.monotonic()
        with pytest.raises(IntegrityError, match=rf"manifest gs://{bucket}/{name} .*delete it") as raised:
            next(iter(lister(bucket, folder, front.client_config, masks="*.bin")))
        assert time.monotonic() - started < 30
        assert raised.value.url == f"gs://{bucket}/{name}"
    assert manifest_objects(gcs_emulator, bucket, folder) == [name]  # no lock left behind
    assert gcs_emulator.read(bucket, name) == junk


def test_a_failed_listing_publishes_nothing_and_frees_the_lock(gcs_emulator: Emulator, dataset) -> None:
    bucket, expected, folder = dataset
    with (
        GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="list")]) as denied,
        pytest.raises(AccessDeniedError),
    ):
        list(lister(bucket, folder, denied.client_config))
    assert manifest_objects(gcs_emulator, bucket, folder) == []
    assert list(lister(bucket, folder, gcs_emulator.client_config)) == expected


def test_the_lister_publishes_even_when_its_consumer_stops(gcs_emulator: Emulator, front: GCSFront, dataset) -> None:
    bucket, expected, folder = dataset
    iterator = iter(lister(bucket, folder, front.client_config, page_size=100))
    assert next(iterator) == expected[0]
    del iterator
    wait_for_manifest(gcs_emulator, bucket, folder)
    front.reset_counts()
    assert list(lister(bucket, folder, front.client_config)) == expected
    assert front.counts["list"] == 0


@pytest.mark.parametrize("refused", [False, True], ids=["taken-over", "taken-over-after-a-412"])
def test_a_lock_left_by_a_dead_replica_is_taken_over(
    gcs_emulator: Emulator, dataset, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """GCS answers the pinned delete of a stale lock 412 when its holder renewed it in between: the
    replica then keeps waiting, and takes the lock over once it goes stale again."""
    bucket, expected, folder = dataset
    monkeypatch.setattr(shared_listing, "LEASE", 0.3)
    shared = SharedListing(
        Client(gcs_emulator.client_config, FAST_RETRY),
        f"gs://{bucket}/{folder}",
        [f"gs://{bucket}/data/"],
        [""],
        lambda index, url: True,
    )
    gcs_emulator.upload(bucket, shared.lock_name, b"a replica that was killed")
    faults = [Fault("http_412", match=r"^DELETE .*\.lock", times=1)] if refused else []
    with GCSFront(gcs_emulator.endpoint, faults=faults) as front:
        started = time.monotonic()
        assert list(lister(bucket, folder, front.client_config)) == expected
        assert time.monotonic() - started >= 0.3 * (2 if refused else 1)
        assert front.faults_injected["http_412"] == refused
        assert front.counts["delete"] == 2 + refused  # (refused,) taken over, released
    assert manifest_objects(gcs_emulator, bucket, folder) == [shared.manifest_name]


@pytest.mark.parametrize("shared", [False, True])
def test_resumes_after_the_last_object_yielded(gcs_emulator: Emulator, front: GCSFront, dataset, shared: bool) -> None:
    bucket, expected, folder = dataset
    settings = {"page_size": 100}
    make = (
        (lambda: lister(bucket, folder, front.client_config, **settings))
        if shared
        else (lambda: GCSFileListerIterDataPipe(f"gs://{bucket}/data/", client=front.client_config, **settings))
    )
    first = make()
    iterator = iter(first)
    head = [next(iterator) for _ in range(1_234)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del iterator
    if shared:
        wait_for_manifest(gcs_emulator, bucket, folder)  # the first lister goes on listing to publish it
    front.reset_counts()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected
    if shared:
        assert front.counts["list"] == 0
    else:  # only the rest is listed: pages from object 1,234 on
        assert front.counts["list"] <= 1.5 * (N_OBJECTS - 1_234) / 100 + 1
    assert list(resumed) == expected  # the next epoch starts from the beginning


def test_resume_across_inputs_and_a_fresh_copy_starts_over(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"{part}/{i}": b"" for part in "abc" for i in range(5)})
    inputs = [f"gs://{gcs_bucket}/{part}/" for part in "cab"]
    expected = [f"gs://{gcs_bucket}/{part}/{i}" for part in "cab" for i in range(5)]
    pipe = GCSFileListerIterDataPipe(inputs, client=gcs_emulator.client_config)
    iterator = iter(pipe)
    head = [next(iterator) for _ in range(7)]
    copy = pickle.loads(pickle.dumps(pipe))
    resumed = GCSFileListerIterDataPipe(inputs, client=gcs_emulator.client_config)
    resumed.load_state_dict(pipe.state_dict())
    assert head + list(resumed) == expected
    assert list(copy) == expected


def test_dataloader2_restored_from_its_state_replays_the_epoch_without_listing(
    gcs_emulator: Emulator, front: GCSFront, dataset
) -> None:
    bucket, expected, folder = dataset
    pipe = lister(bucket, folder, front.client_config).sharding_filter()
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2))
    try:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(100)]
        state = loader.state_dict()
        for _ in iterator:  # finish the epoch: shutting DataLoader2 down mid-epoch can hang in torchdata 0.9
            pass
    finally:
        loader.shutdown()
    wait_for_manifest(gcs_emulator, bucket, folder)  # the listing worker publishes in the background
    front.reset_counts()
    restored = DataLoader2.from_state(state, MultiProcessingReadingService(num_workers=2))
    try:
        replayed = list(restored)
    finally:
        restored.shutdown()
    assert replayed[:100] == head and sorted(replayed) == expected
    assert front.counts["list"] == 0
