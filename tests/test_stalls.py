"""Data-stall figures from a real DataLoader with two workers over a slow, throttling front: every worker's
wait for its next object and the loop's wait for each batch, requests, retries and 429s, logged only
when asked."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import pytest
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.delivery import assert_exactly_once, read
from torchdata_gcs import GCSFileLoaderIterDataPipe, GCSIterableDataset, GCSMapDataset, RetryConfig
from torchdata_gcs.stalls import StallWatch
from torchdata_gcs.testing import Emulator, Fault, GCSFront

N_OBJECTS = 16
LATENCY = 0.05
THROTTLED = 3
RETRY = RetryConfig(initial_delay=0.01, max_delay=0.02)


@pytest.fixture(scope="module")
def dataset(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    bucket = "stalls-data"
    objects = {f"s/{i:02d}.bin": f"object {i};".encode() * (i + 1) for i in range(N_OBJECTS)}
    gcs_emulator.seed(bucket, objects)
    return bucket, {f"gs://{bucket}/{name}": data for name, data in objects.items()}


@pytest.fixture
def slow_front(gcs_emulator: Emulator):
    """Every request answered ``LATENCY`` late; the first ``THROTTLED`` media reads answered 429."""
    with GCSFront(gcs_emulator.endpoint, latency=LATENCY) as front:
        yield front


def read_pair(pair: tuple[str, Any]) -> tuple[str, bytes]:
    return read(*pair)


def throttle(front: GCSFront) -> None:
    front.set_faults([Fault("http_429", match="alt=media", times=THROTTLED)])  # media reads only


def test_two_workers_report_their_waits_requests_and_429s(dataset, slow_front: GCSFront, caplog) -> None:
    bucket, expected = dataset
    ds = GCSMapDataset(f"gs://{bucket}/s/", transform=read, client=slow_front.client_config, retry=RETRY)
    throttle(slow_front)
    loader = StallWatch(DataLoader(ds, batch_size=2, num_workers=2, collate_fn=list))
    with caplog.at_level(logging.DEBUG):
        items = [item for batch in loader for item in batch]
    assert_exactly_once(items, expected)
    assert [record for record in caplog.records if record.name == "torchdata_gcs.stalls"] == [], "logged unasked"

    report = loader.report()
    assert report == json.loads(json.dumps(report))
    workers = report["workers"]
    assert sorted(workers) == ["0", "1"], "each worker's own figures, none from the main process"
    assert [workers[w]["objects"] for w in "01"] == [N_OBJECTS // 2] * 2
    assert report["objects"] == N_OBJECTS and report["bytes"] == sum(map(len, expected.values()))
    assert report["throttled"] == report["retries"] == THROTTLED == sum(workers[w]["throttled"] for w in "01")
    assert report["requests"] == N_OBJECTS + THROTTLED == sum(workers[w]["requests"] for w in "01")
    for worker in workers.values():
        waits = worker["object_wait_s"]
        assert waits["count"] == N_OBJECTS // 2
        # Each batch's first object waits for its answer, at least LATENCY late; the second came with it.
        assert waits["max"] >= LATENCY and waits["p95"] >= LATENCY * 8 / 9 and waits["total"] >= 4 * LATENCY
    assert report["object_wait_s"]["count"] == N_OBJECTS
    batches = report["batch_wait_s"]
    assert batches["count"] == N_OBJECTS // 2 and batches["max"] >= LATENCY
    assert 0 < batches["p50"] <= batches["p95"] <= batches["p99"] <= batches["max"]
    flat = loader.scalars()
    assert flat["data/workers/1/throttled"] == workers["1"]["throttled"]
    assert flat["data/batch_wait_s/p99"] == batches["p99"]


def test_logging_every_interval_gives_a_line_per_rank_and_one_per_worker(dataset, slow_front, caplog) -> None:
    bucket, _ = dataset
    ds = GCSIterableDataset(f"gs://{bucket}/s/", transform=read, client=slow_front.client_config, retry=RETRY)
    throttle(slow_front)
    loader = StallWatch(DataLoader(ds, batch_size=2, num_workers=2), log_every=LATENCY / 10)
    with caplog.at_level(logging.DEBUG, logger="torchdata_gcs.stalls"):
        for _ in loader:
            time.sleep(LATENCY / 5)  # a training step: each next batch is asked for after the interval
    ranks = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(ranks) == N_OBJECTS // 2, "one line at each batch, the interval having passed"
    line = re.compile(
        r"rank 0: batch wait p50/p95/p99 [\d.]+/[\d.]+/[\d.]+ ms over \d+; object wait p50/p95/p99 "
        r"[\d.]+/[\d.]+/[\d.]+ ms over \d+; \d+ objects, [\d,]+ requests, [\d,]+ bytes, \d+ retries, \d+ answered 429"
    )
    assert all(line.fullmatch(message) for message in ranks), ranks
    workers = {m.split(":")[0] for r in caplog.records if r.levelno == logging.DEBUG for m in [r.getMessage()]}
    assert workers == {"rank 0 worker 0", "rank 0 worker 1"}
    assert loader.report()["throttled"] == THROTTLED


def test_without_workers_the_main_process_reports_and_a_copy_starts_afresh(dataset, client) -> None:
    bucket, expected = dataset
    ds = GCSMapDataset(f"gs://{bucket}/s/", transform=read, client=client)
    assert ds.stall_stats()["workers"] == {}
    loader = StallWatch(DataLoader(ds, batch_size=4, collate_fn=list))
    assert len(loader) == N_OBJECTS // 4 and loader.dataset is ds
    for epoch in (1, 2):
        assert_exactly_once([item for batch in loader for item in batch], expected)
        report = loader.report()
        assert list(report["workers"]) == ["main"]
        assert report["objects"] == report["requests"] == epoch * N_OBJECTS
        assert report["object_wait_s"]["count"] == epoch * N_OBJECTS
        assert report["batch_wait_s"]["count"] == epoch * N_OBJECTS // 4


def test_datapipes_report_forked_workers(dataset, slow_front: GCSFront) -> None:
    bucket, expected = dataset
    pipe = IterableWrapper(sorted(expected)).sharding_filter()
    pipe = GCSFileLoaderIterDataPipe(pipe, client=slow_front.client_config, retry=RETRY)
    throttle(slow_front)
    loader = StallWatch(DataLoader(pipe.map(read_pair), batch_size=None, num_workers=2), source=pipe)
    assert_exactly_once(list(loader), expected)
    report = loader.report()
    assert {name: figures["objects"] for name, figures in report["workers"].items()} == {"0": 8, "1": 8}
    assert report["throttled"] == THROTTLED and report["object_wait_s"]["max"] >= LATENCY


def test_a_dataloader2_is_watched_through_its_own_copy_of_the_graph(dataset, client) -> None:
    """DataLoader2 reads a copy of the graph it is given: the watch finds the copy's reading DataPipe by
    itself, and refuses one of the original (whose figures stay at zero) instead of reporting nothing."""
    dataloader2 = pytest.importorskip("torchdata.dataloader2", reason="DataLoader2 needs torchdata 0.9")
    bucket, expected = dataset
    pipe = GCSFileLoaderIterDataPipe(IterableWrapper(sorted(expected)), client=client)
    loader = dataloader2.DataLoader2(pipe.map(read_pair))
    try:
        watch = StallWatch(loader)
        assert_exactly_once(list(watch), expected)
        report = watch.report()
        assert list(report["workers"]) == ["main"]
        assert report["objects"] == report["requests"] == report["object_wait_s"]["count"] == N_OBJECTS
        assert pipe.stall_stats()["objects"] == 0, "the original graph is not the one read"
        with pytest.raises(ValueError, match="leave source out"):
            StallWatch(loader, source=pipe)
    finally:
        loader.shutdown()


def test_bad_settings_are_refused() -> None:
    for log_every in (0, -1.0, float("inf"), "10"):
        with pytest.raises(ValueError, match="log_every"):
            StallWatch([], log_every=log_every)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stall_stats"):
        StallWatch([], source=object())
    assert StallWatch([1, 2]).report()["workers"] == {}


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.9's StatefulDataLoader on torch 2.13
def test_the_watch_passes_state_dict_through_and_a_resumed_loader_reads_the_rest(dataset, client) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    bucket, expected = dataset

    def watched() -> StallWatch:
        ds = GCSIterableDataset(f"gs://{bucket}/s/", transform=read, client=client)
        return StallWatch(StatefulDataLoader(ds, batch_size=2, num_workers=2, collate_fn=list))

    loader = watched()
    iterator = iter(loader)
    before = [item for _ in range(3) for item in next(iterator)]
    state = loader.state_dict()
    del iterator
    fresh = watched()
    fresh.load_state_dict(state)
    after = [item for batch in fresh for item in batch]
    assert_exactly_once(before + after, expected)
    assert loader.report()["batch_wait_s"]["count"] == 3
    assert fresh.report()["batch_wait_s"]["count"] == (N_OBJECTS - 6) // 2
