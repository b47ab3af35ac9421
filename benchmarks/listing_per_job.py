"""Making a ``GCSMapDataset`` on every rank of a job: listed once for the job (``list_once=True``, the
default with a process group) against once per rank (``list_once=False``).

Ranks are processes forked from this one (torch imported first), in one gloo process group over a file
store. A round times, on every rank, from a barrier to the dataset made, and takes the slowest rank; the
two modes alternate round by round, and the list requests the front received are counted per round.
The bucket's objects are served from a snapshot by a ``GCSFront`` that adds ``--latency-ms`` to each
request (fake-gcs-server re-reads the whole bucket for every list page).

Run: ``.venv/bin/python -m benchmarks.listing_per_job [--ranks 8] [--objects 20000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from torchdata_gcs import ClientConfig, GCSMapDataset
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET = "bench-list-per-job"


def rank_main(rank: int, world: int, folder: str, endpoint: str, once: bool) -> None:
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world, timeout=timeout)
    dist.barrier()
    started = time.perf_counter()
    dataset = GCSMapDataset(f"gs://{BUCKET}/", client=ClientConfig(endpoint=endpoint), list_once=once)
    seconds = time.perf_counter() - started
    Path(folder, f"rank-{rank}.json").write_text(json.dumps({"seconds": seconds, "objects": len(dataset)}))
    dist.barrier()
    dist.destroy_process_group()


def one_round(world: int, endpoint: str, once: bool) -> tuple[float, int]:
    """The slowest rank's seconds to make the dataset, and the objects it holds."""
    with tempfile.TemporaryDirectory() as folder:
        context = multiprocessing.get_context("fork")
        ranks = [context.Process(target=rank_main, args=(r, world, folder, endpoint, once)) for r in range(world)]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(600)
        assert all(process.exitcode == 0 for process in ranks), [process.exitcode for process in ranks]
        results = [json.loads(Path(folder, f"rank-{r}.json").read_text()) for r in range(world)]
    assert len({result["objects"] for result in results}) == 1
    return max(result["seconds"] for result in results), results[0]["objects"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    with Emulator(backend="filesystem") as emulator:
        emulator.create_bucket(BUCKET)
        emulator.seed(BUCKET, {f"{i:07d}.jpg": b"" for i in range(args.objects)}, concurrency=64)
        with GCSFront(emulator.endpoint, latency=args.latency_ms / 1000) as front:
            front.index_listings(BUCKET)
            seconds: dict[bool, list[float]] = {True: [], False: []}
            requests: dict[bool, list[int]] = {True: [], False: []}
            for _ in range(args.rounds):
                for once in (True, False):
                    front.reset_counts()
                    took, objects = one_round(args.ranks, front.endpoint, once)
                    assert objects == args.objects
                    seconds[once].append(took)
                    requests[once].append(front.counts["list"])
    median = {once: statistics.median(values) for once, values in seconds.items()}
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "objects": args.objects,
                "latency_ms": args.latency_ms,
                "seconds_list_once": seconds[True],
                "seconds_per_rank": seconds[False],
                "list_requests_list_once": requests[True],
                "list_requests_per_rank": requests[False],
                "median_list_once": median[True],
                "median_per_rank": median[False],
                "per_rank_over_once": median[False] / median[True],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
