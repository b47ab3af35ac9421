"""GCSIterableDataset's resume proves it resumes the same listing in the same order, or refuses with a
ResumeError that says what changed; malformed states are refused and change nothing."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest

from tests.delivery import read
from torchdata_gcs import ClientConfig, GCSIterableDataset, ResumeError
from torchdata_gcs.testing import Emulator

N = 30


@pytest.fixture
def bucket(gcs_emulator: Emulator) -> str:
    name = f"resume-{uuid.uuid4().hex[:12]}"
    gcs_emulator.seed(name, {f"ds/{i:03d}.bin": f"item {i}".encode() for i in range(N)})
    return name


def half_read(bucket: str, client: ClientConfig, **settings: Any) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """The state of a shuffled dataset after 10 of its items, and those items."""
    ds = GCSIterableDataset(f"gs://{bucket}/ds/", transform=read, client=client, shuffle=True, seed=5, **settings)
    iterator = iter(ds)
    before = [next(iterator) for _ in range(10)]
    return ds.state_dict(), before


def dataset(bucket: str, client: ClientConfig, **settings: Any) -> GCSIterableDataset:
    return GCSIterableDataset(f"gs://{bucket}/ds/", transform=read, client=client, **{"shuffle": True, **settings})


def refused(ds: GCSIterableDataset, state: object, *words: str) -> ResumeError:
    """``state`` is refused with all of ``words`` said, and ``ds`` is left as it was."""
    before = (ds.epoch, ds.seed, ds._resume)
    with pytest.raises(ResumeError) as raised:
        ds.load_state_dict(state)  # type: ignore[arg-type]
    assert all(word in str(raised.value) for word in words), str(raised.value)
    assert (ds.epoch, ds.seed, ds._resume) == before
    return raised.value


def test_rewritten_objects_resume_and_added_removed_or_renamed_ones_are_refused_saying_so(
    bucket: str, gcs_emulator: Emulator, client: ClientConfig
) -> None:
    state, before = half_read(bucket, client)
    gcs_emulator.seed(bucket, {"ds/003.bin": b"rewritten"})  # a new generation keeps its place in the order
    fresh = dataset(bucket, client)
    fresh.load_state_dict(state)
    after = list(fresh)
    assert len(after) == N - 10
    assert sorted(url for url, _ in before + after) == [f"gs://{bucket}/ds/{i:03d}.bin" for i in range(N)]

    gcs_emulator.seed(bucket, {f"ds/new-{i}.bin": b"new" for i in range(3)})
    error = refused(dataset(bucket, client), state, f"a listing of {N} objects", f"this dataset lists {N + 3}")
    assert "skip or repeat" in str(error) and "'done': 0" in str(error)
    assert isinstance(error, ValueError)

    for name in ("ds/000.bin", "ds/001.bin", "ds/002.bin"):
        gcs_emulator.delete(bucket, name)
    renamed = dataset(bucket, client)
    assert len(renamed.objects) == N
    refused(renamed, state, "as many, but not the same names in the same order")


def test_another_order_is_refused_saying_what_differs(bucket: str, client: ClientConfig) -> None:
    state, _ = half_read(bucket, client)
    refused(dataset(bucket, client, shuffle=False), state, "shuffle True then, False now")
    refused(dataset(bucket, client, drop_last=True), state, "drop_last False then, True now")
    elsewhere = {**state, "order": {**state["order"], "world_size": 2, "rank": 1}}
    refused(dataset(bucket, client), elsewhere, "rank 1 then, 0 now", "world_size 2 then, 1 now")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"done": -5}, ["'done' must be an integer >= 0, got -5"]),
        ({"done": "3"}, ["'done' must be an integer >= 0, got '3'"]),
        ({"done": 2.5}, ["got 2.5"]),
        ({"done": True}, ["got True"]),
        ({"epoch": -1}, ["'epoch' must be an integer >= 0"]),
        ({"epoch": None}, ["'epoch' must be an integer >= 0, got None"]),
        ({"seed": "5"}, ["'seed' must be an integer, got '5'"]),
        ({"done": N + 1}, [f"done {N + 1}, but the epoch holds {N} items here"]),
        ({"listing": {"objects": N, "sha256": "not a digest"}}, ["'sha256' must be 64 hex digits"]),
        ({"listing": {"objects": -1, "sha256": "0" * 64}}, ["'objects' must be an integer >= 0, got -1"]),
        ({"listing": [N]}, ["'listing' and 'order' must be dicts"]),
    ],
)
def test_malformed_states_are_refused_and_change_nothing(
    bucket: str, client: ClientConfig, change: dict[str, Any], words: list[str]
) -> None:
    state, _ = half_read(bucket, client)
    refused(dataset(bucket, client), {**state, **change}, *words)


def test_what_is_not_a_state_is_refused(bucket: str, client: ClientConfig) -> None:
    refused(dataset(bucket, client), [1, 2, 3], "expected a dict from state_dict(), got list")
    refused(dataset(bucket, client), {"seed": 0, "done": 1}, "'epoch' must be an integer >= 0, got None")


def test_a_state_without_a_fingerprint_resumes_only_from_the_start(bucket: str, client: ClientConfig) -> None:
    old = {"epoch": 2, "seed": 5, "done": 10}  # what earlier versions saved
    refused(dataset(bucket, client), old, "holds no fingerprint", "{'epoch': 2, 'seed': 5, 'done': 0}")
    ds = dataset(bucket, client)
    ds.load_state_dict({**old, "done": 0})  # nothing read yet: nothing to skip or repeat
    assert (ds.epoch, ds.seed) == (2, 5) and len(list(ds)) == N


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.9's StatefulDataLoader on torch 2.13
def test_a_stateful_dataloader_over_a_changed_listing_refuses_to_resume(
    bucket: str, gcs_emulator: Emulator, client: ClientConfig
) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes'", category=UserWarning)
        from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(dataset(bucket, client), batch_size=2, num_workers=2, collate_fn=list)
    iterator = iter(loader)
    [next(iterator) for _ in range(4)]
    state = loader.state_dict()
    del iterator, loader
    gcs_emulator.seed(bucket, {f"ds/new-{i}.bin": b"new" for i in range(10)})
    fresh = StatefulDataLoader(dataset(bucket, client), batch_size=2, num_workers=2, collate_fn=list)
    fresh.load_state_dict(state)
    with pytest.raises(ResumeError, match=f"a listing of {N} objects; this dataset lists {N + 10}"):
        next(iter(fresh))
