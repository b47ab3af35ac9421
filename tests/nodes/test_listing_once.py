"""``ListFiles`` on 3 ranks lists once per job at each reset (each epoch), every rank handed the same objects
in the same order; a rank resuming from its own state takes the rest after it from that one listing;
``list_once=False`` lists on every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import Loader

from tests.ranks import list_requests, run_ranks
from torchdata_gcs import ClientConfig
from torchdata_gcs.nodes import ListFiles
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET, OBJECTS, WORLD = "once-nodes", 250, 3
URLS = [f"gs://{BUCKET}/items/{i:03d}.bin" for i in range(OBJECTS)]


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Any:
    gcs_emulator.seed(BUCKET, {f"items/{i:03d}.bin": b"%d" % i for i in range(OBJECTS)})
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        yield running


def _two_epochs_and_a_resume(rank: int, client: ClientConfig) -> dict[str, Any]:
    loader = Loader(ListFiles(f"gs://{BUCKET}/items/", client=client))
    epochs = [list(loader) for _ in range(2)]
    resumed = ListFiles(f"gs://{BUCKET}/items/", client=client)
    resumed.reset({"after": [0, URLS[10 * rank]]})  # each rank its own position
    return {"epochs": epochs, "resumed": list(resumed)}


def _alone(rank: int, client: ClientConfig) -> list[str]:
    return list(Loader(ListFiles(f"gs://{BUCKET}/items/", client=client, list_once=False)))


def one_listing(front: GCSFront) -> int:
    start = len(front.recorded)
    assert list(Loader(ListFiles(f"gs://{BUCKET}/items/", client=front.client_config))) == URLS
    return list_requests(front, start)[BUCKET]


def test_each_reset_is_one_listing_for_the_job(front: GCSFront, tmp_path: Path) -> None:
    pages = one_listing(front)
    start = len(front.recorded)

    outcomes = run_ranks(WORLD, tmp_path, front.endpoint, _two_epochs_and_a_resume)

    assert [outcome.get("error") for outcome in outcomes] == [None] * WORLD
    for rank, outcome in enumerate(outcomes):
        assert outcome["result"]["epochs"] == [URLS, URLS]
        assert outcome["result"]["resumed"] == URLS[10 * rank + 1 :], "the rest after this rank's own state"
    assert list_requests(front, start)[BUCKET] == 3 * pages, "one listing per reset for the whole job"


def test_list_once_false_lists_on_every_rank(front: GCSFront, tmp_path: Path) -> None:
    pages = one_listing(front)
    start = len(front.recorded)
    outcomes = run_ranks(WORLD, tmp_path, front.endpoint, _alone)
    assert [outcome.get("result") for outcome in outcomes] == [URLS] * WORLD
    assert list_requests(front, start)[BUCKET] == WORLD * pages
