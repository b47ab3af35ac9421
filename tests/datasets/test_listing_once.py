"""One listing per job: on 32 ranks (processes forked from this one, gloo over a file store) the datasets
send one listing's list requests for the whole job, and every rank holds the same objects in the same
order; ``list_once=False`` lists on every rank. On 3 ranks: a listing that fails on rank 0 fails on
every rank with the same error (an interrupt there as a ``ListingError``), what rank 0 skipped is
counted on every rank, ranks asking for different listings all raise, ranks whose peers never come
raise within the process group's timeout, a manifest takes the place of listing together, and a
dataset made in a DataLoader worker lists alone."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from tests.ranks import DEADLINE, list_requests, run_ranks
from torchdata_gcs import ClientConfig, GCSIterableDataset, GCSMapDataset
from torchdata_gcs.errors import ListingError, MissingObjectWarning, NotFoundError
from torchdata_gcs.testing import Emulator, Fault, GCSFront

OBJECTS = 300


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Any:
    for bucket in ("once-a", "once-b"):
        gcs_emulator.seed(bucket, {f"items/{i:03d}.bin": b"%d" % i for i in range(OBJECTS)})
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        yield running


def _on_32_ranks(rank: int, client: ClientConfig) -> dict[str, Any]:
    shared = GCSMapDataset("gs://once-a/items/", client=client)
    alone = GCSIterableDataset("gs://once-b/items/", client=client, list_once=False)
    return {
        "shared": [(url, info.generation, info.crc32c) for url, info in shared.objects],
        "alone": [url for url, _ in alone.objects],
    }


def test_32_ranks_list_once(front: GCSFront, tmp_path: Path) -> None:
    start = len(front.recorded)
    GCSMapDataset("gs://once-a/items/", client=ClientConfig(endpoint=front.endpoint))
    one_listing = list_requests(front, start)["once-a"]
    assert one_listing >= 1
    start = len(front.recorded)

    outcomes = run_ranks(32, tmp_path, front.endpoint, _on_32_ranks)

    assert [outcome.get("error") for outcome in outcomes] == [None] * 32
    results = [outcome["result"] for outcome in outcomes]
    assert len(results[0]["shared"]) == OBJECTS
    assert [result["shared"] for result in results] == [results[0]["shared"]] * 32, "the same objects, in order"
    assert [url for url, _, _ in results[0]["shared"]] == [f"gs://once-a/items/{i:03d}.bin" for i in range(OBJECTS)]
    counted = list_requests(front, start)
    assert counted["once-a"] == one_listing, "one listing for the whole job"
    assert counted["once-b"] == 32 * one_listing, "list_once=False lists on every rank"
    assert [result["alone"] for result in results] == [[f"gs://once-b/items/{i:03d}.bin" for i in range(OBJECTS)]] * 32


def _empty_prefix(rank: int, client: ClientConfig) -> None:
    GCSMapDataset("gs://once-a/nothing/", client=client)


def _mismatched(rank: int, client: ClientConfig) -> None:
    GCSMapDataset("gs://once-a/items/", masks="*.bin" if rank == 2 else "", client=client)


def _interrupted_on_rank_0(rank: int, client: ClientConfig) -> str:
    if rank == 0:  # Ctrl-C while the listing waits on a list request that stalls
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        GCSMapDataset("gs://once-b/items/", client=client)
    except KeyboardInterrupt:
        return "interrupted"
    return "listed"


def _one_missing(rank: int, client: ClientConfig) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        urls = ["gs://once-a/items/007.bin", "gs://once-a/gone.bin"]
        dataset = GCSIterableDataset(urls, client=client, skip_missing=True)
    return {
        "urls": [url for url, _ in dataset.objects],
        "missing": dataset.stats.missing,
        "warned": sum(issubclass(warning.category, MissingObjectWarning) for warning in caught),
    }


def _manifest_on_rank_0_alone(rank: int, client: ClientConfig) -> int | None:
    made = None
    if rank == 0:  # the others wait at a barrier meanwhile
        made = len(GCSMapDataset("gs://once-a/items/", client=client, manifest="gs://once-a/listings/"))
    dist.barrier()
    return made


class _MadeInWorkers(IterableDataset):
    def __init__(self, client: ClientConfig) -> None:
        self.client = client

    def __iter__(self) -> Iterator[int]:
        yield len(GCSMapDataset("gs://once-a/items/", client=self.client))


def _in_forked_workers(rank: int, client: ClientConfig) -> list[int]:
    # Forked workers inherit the rank's process-group state, but may not use it: each lists alone.
    loader = DataLoader(_MadeInWorkers(client), batch_size=None, num_workers=2, multiprocessing_context="fork")
    return list(loader)


def _warned(rank: int, client: ClientConfig) -> list[str]:
    warned: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("torchdata_gcs").addHandler(handler)
    GCSMapDataset("gs://once-b/items/", client=client)
    return warned


def _rank_0_never_lists_again(rank: int, client: ClientConfig) -> dict[str, Any]:
    GCSMapDataset("gs://once-a/items/", client=client)  # the listing's group is made; the job then meets once
    return _rank_0_never_lists(rank, client)


def _rank_0_never_lists(rank: int, client: ClientConfig) -> dict[str, Any]:
    if rank == 0:
        time.sleep(5)  # past the others' timeout, then leaves
        return {}
    warned: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("torchdata_gcs").addHandler(handler)
    try:
        GCSMapDataset("gs://once-b/items/", client=client)
    except ListingError as exc:
        return {"error": str(exc), "warned": warned}
    return {"warned": warned}


def test_a_failed_listing_fails_on_every_rank_with_rank_0s_error(front: GCSFront, tmp_path: Path) -> None:
    start = len(front.recorded)
    outcomes = run_ranks(3, tmp_path, front.endpoint, _empty_prefix)
    errors = [outcome["error"][:2] for outcome in outcomes]
    assert errors[0][0] == NotFoundError.__name__ and "gs://once-a/nothing/" in errors[0][1]
    assert errors == [errors[0]] * 3, "the same error on every rank"
    assert list_requests(front, start)["once-a"] == 1, "listed on rank 0 only"


def test_an_interrupt_on_rank_0_reaches_every_rank(front: GCSFront, tmp_path: Path) -> None:
    front.set_faults([Fault("stall", match="list", stall_seconds=20)])
    try:
        outcomes = run_ranks(3, tmp_path, front.endpoint, _interrupted_on_rank_0)
    finally:
        front.set_faults([])
    assert outcomes[0] == {"result": "interrupted"}
    for outcome in outcomes[1:]:
        name, message, _ = outcome["error"]
        assert name == ListingError.__name__ and "interrupted on rank 0 (KeyboardInterrupt)" in message


def test_ranks_waiting_for_a_slow_listing_say_so_and_get_it(front: GCSFront, tmp_path: Path) -> None:
    front.set_faults([Fault("stall", match="list", stall_seconds=4, times=1)])  # the first list request stalls
    try:
        outcomes = run_ranks(3, tmp_path, front.endpoint, _warned, timeout=6.0)
    finally:
        front.set_faults([])
    assert outcomes[0] == {"result": []}
    for rank, outcome in enumerate(outcomes[1:], start=1):
        assert outcome["result"] == [
            f"rank {rank} has waited 3 s to hear the listing with the job's other ranks (list_once): rank 0 is"
            " listing, and must finish within the timeout"
        ]


def test_every_rank_counts_what_rank_0_skipped(front: GCSFront, tmp_path: Path) -> None:
    outcomes = run_ranks(3, tmp_path, front.endpoint, _one_missing)
    expected = {"urls": ["gs://once-a/items/007.bin"], "missing": 1}
    assert [outcome.get("result") for outcome in outcomes] == [
        {**expected, "warned": 1},
        {**expected, "warned": 0},
        {**expected, "warned": 0},
    ], "counted on every rank, warned on rank 0, which listed"


def test_ranks_asking_for_different_listings_all_raise(front: GCSFront, tmp_path: Path) -> None:
    start = len(front.recorded)
    outcomes = run_ranks(3, tmp_path, front.endpoint, _mismatched)
    errors = [outcome["error"] for outcome in outcomes]
    assert [error[0] for error in errors] == [ListingError.__name__] * 3
    assert all("rank(s) [2] asked for another" in error[1] for error in errors)
    assert list_requests(front, start)["once-a"] == 0, "nothing listed, nothing handed out"


def test_a_manifest_takes_the_place_of_the_ranks_listing_together(front: GCSFront, tmp_path: Path) -> None:
    outcomes = run_ranks(3, tmp_path, front.endpoint, _manifest_on_rank_0_alone, timeout=5.0)
    assert [outcome.get("result") for outcome in outcomes] == [OBJECTS, None, None], outcomes[0].get("error")


def test_a_dataset_made_in_a_forked_worker_lists_alone(front: GCSFront, tmp_path: Path) -> None:
    start = len(front.recorded)
    outcomes = run_ranks(3, tmp_path, front.endpoint, _in_forked_workers, timeout=5.0)
    assert [outcome.get("result") for outcome in outcomes] == [[OBJECTS, OBJECTS]] * 3
    assert list_requests(front, start)["once-a"] == 6


@pytest.mark.parametrize(
    ("work", "waiting_to"),
    [(_rank_0_never_lists, "make the listing's process group"), (_rank_0_never_lists_again, "compare what they list")],
    ids=["first listing", "a later listing"],
)
def test_ranks_whose_peers_never_come_raise_within_the_timeout(
    front: GCSFront, tmp_path: Path, work: Any, waiting_to: str
) -> None:
    started = time.monotonic()
    outcomes = run_ranks(3, tmp_path, front.endpoint, work, timeout=3.0)
    assert outcomes[0] == {"result": {}}
    for rank, outcome in enumerate(outcomes[1:], start=1):
        message = outcome["result"]["error"]
        assert f"rank {rank} could not {waiting_to} with the job's other ranks within the process group's" in message
        assert "timeout (3 s)" in message and "list_once=False" in message
        assert outcome["result"]["warned"] == [
            f"rank {rank} has waited 1.5 s to {waiting_to} with the job's other ranks (list_once): every rank must"
            " list at the same point; a listing on some ranks alone needs list_once=False"
        ], "a warning while it waited, before the timeout"
    assert time.monotonic() - started < DEADLINE
