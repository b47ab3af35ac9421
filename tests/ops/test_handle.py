"""The one handle a front end builds: settings, transfer, retry and stats, a fresh context per iteration."""

from __future__ import annotations

import pickle

from torchdata_gcs import LoadStats, RetryConfig, TransferConfig
from torchdata_gcs._engines.download import load_in_order
from torchdata_gcs._ops.client import Client
from torchdata_gcs.testing import Emulator

FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


def test_each_iteration_gets_a_fresh_context_counting_into_the_handles_stats(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    objects = {f"o{i}": bytes([i]) * (i + 1) for i in range(5)}
    gcs_emulator.seed(gcs_bucket, objects)
    stats = LoadStats()
    transfer = TransferConfig(max_in_flight=2, max_buffered_bytes=1024, part_size=256 * 1024)
    gcs = Client(gcs_emulator.client_config, FAST_RETRY, transfer=transfer, stats=stats)
    first, second = gcs.context(), gcs.context()
    assert first.budget is not second.budget and first.slots is not second.slots  # per iteration
    assert (first.budget.limit, first.part_size, first.retry, first.stats) == (1024, 256 * 1024, FAST_RETRY, stats)
    items = [(f"gs://{gcs_bucket}/{name}", None) for name in objects]
    loaded = [(url, bytes(data)) for url, data in load_in_order(items, gcs, skip_missing=False)]  # type: ignore[arg-type]
    assert loaded == [(f"gs://{gcs_bucket}/{name}", data) for name, data in objects.items()]
    assert (stats.requests, stats.objects, stats.bytes) == (5, 5, sum(map(len, objects.values())))
    assert gcs.head(gcs_bucket, "o0", "generation") is not None
    assert stats.requests == 5  # a single verb is not an iteration's request


def test_a_handle_pickles_as_its_settings_and_reaches_the_endpoint_after(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"alpha"})
    gcs = Client(gcs_emulator.client_config, FAST_RETRY, transfer=TransferConfig(max_in_flight=3))
    copy = pickle.loads(pickle.dumps(gcs))
    assert (copy.config, copy.retry, copy.transfer) == (gcs.config, gcs.retry, gcs.transfer)
    assert copy.read(gcs_bucket, "a") == b"alpha"
    counted = copy.replace(stats=LoadStats())
    assert (counted.config, counted.retry, counted.transfer) == (gcs.config, gcs.retry, gcs.transfer)
    assert counted.stats is not copy.stats and counted.replace(transfer=TransferConfig()).stats is counted.stats
