"""Two ranks (gloo) of two worker processes each: the bucket is listed once, each object read once."""

from __future__ import annotations

import collections
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import ClientConfig
from torchdata_gcs.testing import Emulator, GCSFront
from torchdata_gcs.testing._process import free_port

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import (
        DataLoader2,
        DistributedReadingService,
        MultiProcessingReadingService,
        SequentialReadingService,
    )

WORLD_SIZE, WORKERS = 2, 2
N_OBJECTS = 1_200  # a multiple of WORLD_SIZE * WORKERS: DistributedReadingService stops all ranks at the shortest


def read_sample(item: tuple[str, object]) -> str:
    url, stream = item
    data = stream.read()  # type: ignore[attr-defined]
    assert data == url.rsplit("/", 1)[1].encode(), f"wrong bytes for {url}"
    return url


def run_rank(rank: int, port: int, bucket: str, client: ClientConfig, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        pipe = (
            IterableWrapper([f"gs://{bucket}/samples/"])
            .list_files_by_gcs(client=client, manifest=f"gs://{bucket}/listings/", page_size=100)
            .shuffle()
            .sharding_filter()
            .load_files_by_gcs(client=client)
            .map(read_sample)
        )
        service = SequentialReadingService(
            DistributedReadingService(), MultiProcessingReadingService(num_workers=WORKERS)
        )
        loader = DataLoader2(pipe, reading_service=service)
        try:
            (out / f"rank{rank}.txt").write_text("\n".join(loader))
        finally:
            loader.shutdown()
    finally:
        dist.destroy_process_group()


def test_two_ranks_of_two_workers_list_once_and_read_each_object_once(gcs_emulator: Emulator, tmp_path: Path) -> None:
    bucket = "distributed-data"
    names = [f"samples/{i:05d}" for i in range(N_OBJECTS)]
    gcs_emulator.seed(bucket, {name: name.rsplit("/", 1)[1].encode() for name in names}, concurrency=32)
    with GCSFront(gcs_emulator.endpoint) as front:
        mp.start_processes(
            run_rank,
            args=(free_port(), bucket, front.client_config, tmp_path),
            nprocs=WORLD_SIZE,
            join=True,
            start_method="spawn",
        )
        list_calls = front.counts["list"]
    delivered = [url for rank in range(WORLD_SIZE) for url in (tmp_path / f"rank{rank}.txt").read_text().split("\n")]
    counts = collections.Counter(delivered)
    assert set(counts) == {f"gs://{bucket}/{name}" for name in names}
    assert max(counts.values()) == 1
    pages = N_OBJECTS // 100  # one listing, not one per replica (4 replicas would make 4 x 12 calls)
    assert pages <= list_calls <= 1.5 * pages


UNEVEN_WORLD = 3


def run_uneven_rank(rank: int, port: int, bucket: str, client: ClientConfig, out: Path) -> None:
    """One epoch of 19 or 20 objects per DataLoader2 set-up, each item a DDP-like step (an all-reduce)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=UNEVEN_WORLD)
    results = {}
    try:
        for size in (19, 20):
            for workers in (0, 2, 3):
                pipe = (
                    IterableWrapper([f"gs://{bucket}/n{size}/"])
                    .list_files_by_gcs(client=client)
                    .shuffle()
                    .sharding_filter()
                    .load_files_by_gcs(client=client)
                    .map(read_sample)
                )
                services = [DistributedReadingService()]
                if workers:
                    # forked: a spawned rank would spawn its workers too, which is slow
                    services.append(MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork"))
                loader = DataLoader2(pipe, reading_service=SequentialReadingService(*services))
                try:
                    results[size, workers] = []
                    for url in loader:
                        results[size, workers].append(url)
                        dist.all_reduce(torch.ones(1))
                finally:
                    loader.shutdown()
            # torch's DataLoader shards the same graph across ranks but evens nothing out: no all-reduce here
            results[size, "DataLoader"] = list(TorchDataLoader(pipe, batch_size=None))
    finally:
        dist.destroy_process_group()
    (out / f"uneven-{rank}.pkl").write_bytes(pickle.dumps(results))


def test_three_ranks_of_uneven_shares_stop_together_at_the_shortest(gcs_emulator: Emulator, tmp_path: Path) -> None:
    """DistributedReadingService ends every rank's epoch when the first rank runs out (its full-sync
    step), so no rank waits in an all-reduce: with 19 or 20 objects on 3 ranks each rank reads 6 and
    the rest of the epoch (1 or 2 objects) is not read. torch's DataLoader deals the same graph
    7/6/6 and evens nothing out (under DDP the rank with 7 would wait for ever)."""
    bucket = "uneven-data"
    names = {f"n{size}/{i:02d}": f"{i:02d}".encode() for size in (19, 20) for i in range(size)}
    gcs_emulator.seed(bucket, names)
    mp.start_processes(
        run_uneven_rank,
        args=(free_port(), bucket, gcs_emulator.client_config, tmp_path),
        nprocs=UNEVEN_WORLD,
        join=True,
        start_method="spawn",
    )
    ranks = [pickle.loads((tmp_path / f"uneven-{rank}.pkl").read_bytes()) for rank in range(UNEVEN_WORLD)]
    for size in (19, 20):
        for workers in (0, 2, 3):
            shares = [ranks[rank][size, workers] for rank in range(UNEVEN_WORLD)]
            assert [len(share) for share in shares] == [size // UNEVEN_WORLD] * UNEVEN_WORLD, (size, workers)
            read = [url for share in shares for url in share]
            assert len(set(read)) == len(read), "nothing is read twice"
            assert set(read) < {f"gs://{bucket}/{name}" for name in names if name.startswith(f"n{size}/")}
        unequal = [len(ranks[rank][size, "DataLoader"]) for rank in range(UNEVEN_WORLD)]
        assert unequal == ([7, 6, 6] if size == 19 else [7, 7, 6])
