"""GCSIterableDataset splits each epoch as DistributedSampler does: on 3 ranks (gloo, each stepping in
lockstep as DDP does), 19 or 20 objects, 0, 2 or 3 workers, every rank reads the same number of items,
the rank and world size read when the epoch starts; ``set_epoch`` reaches persistent workers."""

from __future__ import annotations

import collections
import datetime
import faulthandler
import math
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, get_worker_info

from torchdata_gcs import ClientConfig, GCSIterableDataset
from torchdata_gcs.testing import Emulator

WORLD = 3
SIZES = (19, 20)
WORKERS = (0, 2, 3)
STEP_TIMEOUT = datetime.timedelta(seconds=30)
"""How long a rank waits in a collective for the others (gloo's timeout), as DDP would."""
STALL_DUMP_SECONDS = 20.0
"""A rank that gets no further for this long prints every thread's stack to stderr (shown if the test
fails), so a rank that lags is found, not only the ranks its lag made wait."""
WORKER_TIMEOUT = 25.0
"""How long a rank waits for a batch from its forked workers: a lagging worker fails its own rank, named."""


def worker_and_url(url: str, stream) -> tuple[int, str]:
    worker = get_worker_info()
    return (-1 if worker is None else worker.id), url


@pytest.fixture(scope="module")
def buckets(gcs_emulator: Emulator) -> dict[int, list[str]]:
    urls = {}
    for size in SIZES:
        bucket = f"shares-{size}"
        gcs_emulator.seed(bucket, {f"{i:02d}.bin": b"x" for i in range(size)})
        urls[size] = [f"gs://{bucket}/{i:02d}.bin" for i in range(size)]
    return urls


def run_rank(rank: int, folder: str, endpoint: str) -> None:
    client = ClientConfig(endpoint=endpoint)
    # Made before the process group exists: the shares are read when each epoch starts.
    datasets = {
        (size, drop_last): GCSIterableDataset(
            f"gs://shares-{size}/", transform=worker_and_url, client=client, shuffle=True, seed=4, drop_last=drop_last
        )
        for size in SIZES
        for drop_last in (False, True)
    }
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=WORLD, timeout=STEP_TIMEOUT
    )
    results = {}
    faulthandler.dump_traceback_later(STALL_DUMP_SECONDS)  # restarted at every step; never in forked workers
    try:
        for (size, drop_last), ds in datasets.items():
            for workers in WORKERS:
                for epoch in (0, 1):
                    ds.set_epoch(epoch)
                    items = []
                    context = "fork" if workers else None  # a spawned rank would spawn its workers too: slow
                    loader = DataLoader(
                        ds,
                        batch_size=2,
                        num_workers=workers,
                        collate_fn=list,
                        multiprocessing_context=context,
                        timeout=WORKER_TIMEOUT if workers else 0,
                    )
                    for batch in loader:
                        items += batch
                        dist.all_reduce(torch.ones(1))  # a DDP step: a rank with a batch more would wait for ever
                        faulthandler.dump_traceback_later(STALL_DUMP_SECONDS)
                    results[size, drop_last, workers, epoch] = items
        # Spawned persistent workers: the rank comes from the parent's process group, each epoch's
        # order from set_epoch in the parent.
        ds = datasets[19, False]
        loader = DataLoader(
            ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="spawn"
        )
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            results["persistent", epoch] = list(loader)
            dist.all_reduce(torch.ones(1))
            faulthandler.dump_traceback_later(STALL_DUMP_SECONDS)
    finally:
        faulthandler.cancel_dump_traceback_later()
        dist.destroy_process_group()
    Path(folder, f"rank-{rank}.pkl").write_bytes(pickle.dumps(results))


def test_every_rank_reads_the_same_number_of_items(buckets, client: ClientConfig, tmp_path: Path) -> None:
    mp.spawn(run_rank, args=(str(tmp_path), client.endpoint), nprocs=WORLD)
    ranks = [pickle.loads((tmp_path / f"rank-{rank}.pkl").read_bytes()) for rank in range(WORLD)]
    for size in SIZES:
        for drop_last in (False, True):
            per_rank = size // WORLD if drop_last else math.ceil(size / WORLD)
            for workers in WORKERS:
                orders = []
                for epoch in (0, 1):
                    shares = [ranks[rank][size, drop_last, workers, epoch] for rank in range(WORLD)]
                    assert [len(share) for share in shares] == [per_rank] * WORLD, (size, drop_last, workers)
                    urls = [url for share in shares for _, url in share]
                    if drop_last:  # the tail that would leave ranks unequal is dropped, nothing read twice
                        assert len(set(urls)) == len(urls) == per_rank * WORLD
                    else:  # every object read, the order padded by repeating from its start
                        assert set(urls) == set(buckets[size]) and len(urls) == per_rank * WORLD
                    for share in shares:  # the workers of a rank differ by at most one item
                        counts = collections.Counter(worker for worker, _ in share)
                        assert max(counts.values()) - min(counts.values()) <= 1
                        assert len(counts) == max(workers, 1)
                    orders.append(urls)
                assert orders[0] != orders[1], "each epoch has its own order"
    persistent = [[[url for _, url in ranks[rank]["persistent", epoch]] for rank in range(WORLD)] for epoch in (0, 1)]
    for epoch in (0, 1):
        assert [len(share) for share in persistent[epoch]] == [7] * WORLD
        assert {url for share in persistent[epoch] for url in share} == set(buckets[19])
    assert persistent[0] != persistent[1], "set_epoch reached the persistent workers"
    assert [sorted(share) for share in persistent[0]] == [
        sorted(url for _, url in ranks[rank][19, False, 2, 0]) for rank in range(WORLD)
    ], "the same shares as forked workers'"


def test_set_epoch_reaches_persistent_workers(buckets, client: ClientConfig) -> None:
    ds = GCSIterableDataset("gs://shares-20/", transform=worker_and_url, client=client, shuffle=True, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    orders = []
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        orders.append([url for _, url in loader])
    assert len({tuple(order) for order in orders}) == 3
    assert all(sorted(order) == buckets[20] for order in orders)
    ds.set_epoch(1)
    assert [url for _, url in DataLoader(ds, batch_size=None, num_workers=2)] == orders[1]


def test_rank_and_world_size_come_from_the_environment_when_the_epoch_starts(
    buckets, client: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = GCSIterableDataset("gs://shares-19/", transform=worker_and_url, client=client)
    shares = []
    for rank in range(WORLD):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(WORLD))
        shares.append([url for _, url in ds])
    assert [len(share) for share in shares] == [7, 7, 7]
    assert shares[1][-1] == buckets[19][0], "padded by repeating from the start"
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match="RANK must be in 0..WORLD_SIZE-1"):
        list(ds)
