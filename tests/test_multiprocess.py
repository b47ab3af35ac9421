"""Exactly-once delivery through shuffle().sharding_filter() in worker processes."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import ClientConfig
from torchdata_gcs.testing import Emulator

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
