"""Exactly-once delivery through shuffle().sharding_filter() in worker processes."""

from __future__ import annotations

import collections
import os
import pickle
import warnings

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe, IntegrityError, TransferConfig
from torchdata_gcs.testing import Emulator, Fault, GCSFront

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

N_OBJECTS = 300


def decode(item: tuple[str, object]) -> tuple[str, bytes]:
    url, stream = item
    return url, stream.read()  # type: ignore[attr-defined]


def build_pipe(bucket: str, client: ClientConfig):
    return (
        IterableWrapper([f"gs://{bucket}/mp/"])
        .list_files_by_gcs(client=client)
        .shuffle()
        .sharding_filter()
        .load_files_by_gcs(client=client)
        .map(decode)
    )


@pytest.fixture(scope="module")
def dataset(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    bucket = "multiprocess-data"
    objects = {f"mp/{i:04d}.bin": f"sample {i}".encode() * (i % 7 + 1) for i in range(N_OBJECTS)}
    gcs_emulator.seed(bucket, objects)
    return bucket, {f"gs://{bucket}/{name}": data for name, data in objects.items()}


def assert_exactly_once(delivered: list[tuple[str, bytes]], expected: dict[str, bytes]) -> None:
    counts = collections.Counter(url for url, _ in delivered)
    assert set(counts) == set(expected), "missing or unexpected objects"
    assert max(counts.values()) == 1, "an object was delivered more than once"
    assert all(data == expected[url] for url, data in delivered)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_dataloader2_with_two_workers(dataset, client: ClientConfig, start_method: str) -> None:
    bucket, expected = dataset
    service = MultiProcessingReadingService(num_workers=2, multiprocessing_context=start_method)
    loader = DataLoader2(build_pipe(bucket, client), reading_service=service)
    try:
        loader.seed(7)
        first_epoch = list(loader)
        loader.seed(8)
        second_epoch = list(loader)
    finally:
        loader.shutdown()
    assert_exactly_once(first_epoch, expected)
    assert_exactly_once(second_epoch, expected)
    assert [u for u, _ in first_epoch] != [u for u, _ in second_epoch]  # the shuffle reshuffles per epoch


def test_classic_dataloader_with_two_workers(dataset, client: ClientConfig) -> None:
    bucket, expected = dataset
    loader = DataLoader(build_pipe(bucket, client), batch_size=None, num_workers=2, shuffle=True)
    torch.manual_seed(3)
    assert_exactly_once(list(loader), expected)


# -- streams that cross from the workers to the main process -----------------------------------------

KiB, MiB = 1024, 1024 * 1024
SMALL_BUDGET = TransferConfig(part_size=256 * KiB, max_buffered_bytes=1 * MiB)


@pytest.fixture(scope="module")
def mixed_sizes(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    """Objects that load as bytes, as parts held in memory, and as streams larger than the byte budget."""
    bucket = "multiprocess-streams"
    sizes = [100, 300 * KiB, 3 * MiB + 5] * 4
    objects = {f"s/{i:02d}.bin": os.urandom(size) for i, size in enumerate(sizes)}
    gcs_emulator.seed(bucket, objects)
    return bucket, {f"gs://{bucket}/{name}": data for name, data in objects.items()}


@pytest.mark.timeout(120, method="thread")  # a hang in the loader's queues is not interruptible by a signal
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_streams_cross_to_the_main_process(mixed_sizes, client: ClientConfig, start_method: str) -> None:
    """The main process reads what the workers loaded: every kind of stream pickles (a hang before)."""
    bucket, expected = mixed_sizes
    pipe = (
        IterableWrapper([f"gs://{bucket}/s/"])
        .list_files_by_gcs(client=client)
        .shuffle()
        .sharding_filter()
        .load_files_by_gcs(client=client, transfer=SMALL_BUDGET)
    )
    loader = DataLoader2(
        pipe, reading_service=MultiProcessingReadingService(num_workers=2, multiprocessing_context=start_method)
    )
    try:
        delivered = [(url, stream.read()) for url, stream in loader]
    finally:
        loader.shutdown()
    assert_exactly_once(delivered, expected)


def test_a_pickled_stream_resumes_where_it_was_and_is_still_checked(mixed_sizes, gcs_front: GCSFront) -> None:
    _, expected = mixed_sizes
    client = gcs_front.client_config
    held, streamed = (
        next(url for url, data in expected.items() if len(data) == size) for size in (300 * KiB, 3 * MiB + 5)
    )
    for url in (held, streamed):
        ((_, stream),) = list(GCSFileLoaderIterDataPipe([url], client=client, transfer=SMALL_BUDGET))
        head = stream.read(200 * KiB)
        copy = pickle.loads(pickle.dumps(stream))
        assert head + copy.read() == expected[url]
        assert head + stream.readline() + stream.read() == expected[url]  # the original reads on, too
    ((_, stream),) = list(GCSFileLoaderIterDataPipe([streamed], client=client, transfer=SMALL_BUDGET))
    stream.read(200 * KiB)
    copy = pickle.loads(pickle.dumps(stream))
    gcs_front.set_faults([Fault("corrupt", match="range_get")])  # the rest arrives damaged
    with pytest.raises(IntegrityError):
        copy.read()
