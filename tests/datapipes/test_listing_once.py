"""``list_files_by_gcs`` iterated in the rank's own process (``DataLoader2`` with ``DistributedReadingService``)
lists once per job on 3 ranks, each epoch; ``list_once=False`` lists on every rank; in worker processes,
which have no process group, each replica lists alone unless given a manifest, or handed what the rank
listed."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.ranks import list_requests, run_ranks
from torchdata_gcs import ClientConfig
from torchdata_gcs.testing import Emulator, GCSFront

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import (
        DataLoader2,
        DistributedReadingService,
        MultiProcessingReadingService,
        SequentialReadingService,
    )

BUCKET, OBJECTS, WORLD = "once-pipes", 300, 3


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Any:
    gcs_emulator.seed(BUCKET, {f"items/{i:03d}.bin": b"%d" % i for i in range(OBJECTS)})
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        yield running


def _epochs(rank: int, client: ClientConfig, workers: int, **listing: Any) -> list[list[str]]:
    pipe = (
        IterableWrapper([f"gs://{BUCKET}/items/"])
        .list_files_by_gcs(client=client, page_size=100, **listing)
        .shuffle()
        .sharding_filter()
    )
    service: Any = DistributedReadingService()
    if workers:  # forked: a spawned rank would spawn its workers too, which is slow
        service = SequentialReadingService(
            service, MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")
        )
    loader = DataLoader2(pipe, reading_service=service)
    try:
        return [list(loader) for _ in range(2)]
    finally:
        loader.shutdown()


def _in_rank(rank: int, client: ClientConfig) -> list[list[str]]:
    return _epochs(rank, client, 0)


def _in_rank_alone(rank: int, client: ClientConfig) -> list[list[str]]:
    return _epochs(rank, client, 0, list_once=False)


def _in_workers(rank: int, client: ClientConfig) -> list[list[str]]:
    return _epochs(rank, client, 2)


def _in_workers_with_manifest(rank: int, client: ClientConfig) -> list[list[str]]:
    return _epochs(rank, client, 2, manifest=f"gs://{BUCKET}/listings/")


def _listed_in_rank_read_in_workers(rank: int, client: ClientConfig) -> list[list[str]]:
    # The recipe for worker processes without a manifest: list in the rank (once for the job), hand the
    # workers the listed (url, ObjectInfo) pairs.
    listed = list(
        IterableWrapper([f"gs://{BUCKET}/items/"]).list_files_by_gcs(client=client, page_size=100, with_metadata=True)
    )
    pipe = IterableWrapper(listed).shuffle().sharding_filter().load_files_by_gcs(client=client).map(_url)
    service = SequentialReadingService(
        DistributedReadingService(), MultiProcessingReadingService(num_workers=2, multiprocessing_context="fork")
    )
    loader = DataLoader2(pipe, reading_service=service)
    try:
        return [list(loader) for _ in range(2)]
    finally:
        loader.shutdown()


def _url(item: tuple[str, Any]) -> str:
    url, stream = item
    assert stream.read() == b"%d" % int(url[-7:-4]), url
    return url


def one_listing(front: GCSFront) -> int:
    start = len(front.recorded)
    list(IterableWrapper([f"gs://{BUCKET}/items/"]).list_files_by_gcs(client=front.client_config, page_size=100))
    return list_requests(front, start)[BUCKET]


@pytest.mark.parametrize(
    ("work", "listings"),
    [
        (_in_rank, 1),
        (_in_rank_alone, WORLD),
        (_in_workers, WORLD * 2),
        (_in_workers_with_manifest, None),
        (_listed_in_rank_read_in_workers, None),
    ],
    ids=["in the rank", "list_once=False", "in workers", "in workers, with a manifest", "listed in the rank"],
)
def test_listings_per_epoch(front: GCSFront, tmp_path: Path, work: Any, listings: int | None) -> None:
    pages = one_listing(front)
    assert pages >= 3
    start = len(front.recorded)
    outcomes = run_ranks(WORLD, tmp_path, front.endpoint, work)
    assert [outcome.get("error") for outcome in outcomes] == [None] * WORLD
    for epoch in (0, 1):
        shares = [outcome["result"][epoch] for outcome in outcomes]
        delivered = [url for share in shares for url in share]
        assert len(delivered) == len(set(delivered)) == OBJECTS, "every object once, on one rank"
    counted = list_requests(front, start)[BUCKET]
    if listings is None:  # listed once for the whole job (a manifest every replica reads, or the rank's list)
        assert counted == pages
    else:
        assert counted == 2 * listings * pages, f"{listings} listing(s) per epoch"
