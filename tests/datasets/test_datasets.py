"""GCSMapDataset and GCSIterableDataset in torch's DataLoader: exactly once, bit-exact, one request per item."""

from __future__ import annotations

import functools
import pickle
import warnings
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, DistributedSampler

from tests.delivery import assert_exactly_once, read
from torchdata_gcs import (
    ClientConfig,
    GCSIterableDataset,
    GCSMapDataset,
    InvalidURIError,
    MissingObjectWarning,
    NotFoundError,
)
from torchdata_gcs.testing import Emulator, GCSFront

N_OBJECTS = 60


def pair(url: str, stream):
    return url, stream


def len_of(stream, scale: int) -> int:
    return scale * len(stream.read())


@pytest.fixture(scope="module")
def dataset(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    bucket = "datasets-data"
    objects = {f"ds/{i:03d}.bin": f"sample {i};".encode() * (i % 9 + 1) for i in range(N_OBJECTS)}
    gcs_emulator.seed(bucket, objects)
    return bucket, {f"gs://{bucket}/{name}": data for name, data in objects.items()}


def test_map_dataset_reads_each_item_in_one_request(dataset, gcs_emulator: Emulator) -> None:
    bucket, expected = dataset
    with GCSFront(gcs_emulator.endpoint) as front:
        ds = GCSMapDataset(f"gs://{bucket}/ds/", transform=read, client=front.client_config)
        listed = dict(front.counts)
        assert len(ds) == N_OBJECTS and listed == {"list": 1}
        assert ds[7] == (f"gs://{bucket}/ds/007.bin", expected[f"gs://{bucket}/ds/007.bin"])
        loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=list)
        delivered = [item for batch in loader for item in batch]
        reads = front.counts["get"]
    assert_exactly_once(delivered, expected)
    assert reads == N_OBJECTS + 1, "one media GET per item, no metadata requests"


def test_map_dataset_under_a_distributed_sampler(dataset, client) -> None:
    bucket, expected = dataset
    ds = GCSMapDataset(f"gs://{bucket}/ds/", transform=read, client=client)
    delivered = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        delivered += [
            item for batch in DataLoader(ds, batch_size=5, sampler=sampler, collate_fn=list) for item in batch
        ]
    assert_exactly_once(delivered, expected)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_items_go_through_default_collate(dataset, client, num_workers: int) -> None:
    """``(url, bytes)``: a DataLoader with a batch size and no collate_fn batches them as they are."""
    bucket, expected = dataset
    for ds in (
        GCSMapDataset(f"gs://{bucket}/ds/", client=client),
        GCSIterableDataset(f"gs://{bucket}/ds/", client=client),
    ):
        batches = list(DataLoader(ds, batch_size=7, num_workers=num_workers))
        assert all(len(urls) == len(datas) for urls, datas in batches)
        assert_exactly_once([item for urls, datas in batches for item in zip(urls, datas, strict=True)], expected)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streams_cross_worker_processes(dataset, client, num_workers: int) -> None:
    """A transform may hand the stream itself on: it is read in the main process after crossing from a worker."""
    bucket, expected = dataset
    for ds in (
        GCSMapDataset(f"gs://{bucket}/ds/", transform=pair, client=client),
        GCSIterableDataset(f"gs://{bucket}/ds/", transform=pair, client=client),
    ):
        loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
        assert_exactly_once([(url, stream.read()) for url, stream in loader], expected)


def test_a_transform_of_one_argument_gets_the_stream(dataset, client) -> None:
    bucket, expected = dataset
    ds = GCSMapDataset(f"gs://{bucket}/ds/", transform=lambda stream: (stream.name, stream.read()), client=client)
    assert ds[3] == (f"gs://{bucket}/ds/003.bin", expected[f"gs://{bucket}/ds/003.bin"])
    ds = GCSIterableDataset(f"gs://{bucket}/ds/", transform=functools.partial(len_of, scale=2), client=client)
    assert sum(ds) == 2 * sum(map(len, expected.values()))
    ds = GCSMapDataset(
        f"gs://{bucket}/ds/", transform=lambda stream, scale=3: scale * len(stream.read()), client=client
    )
    assert ds[3] == 3 * len(expected[f"gs://{bucket}/ds/003.bin"]), "a second argument with a default is not the stream"
    with pytest.raises(TypeError, match="transform must be callable"):
        GCSMapDataset(f"gs://{bucket}/ds/", transform="decode", client=client)  # type: ignore[arg-type]


def test_a_stream_handed_on_by_a_transform_stays_readable(dataset, client) -> None:
    """``ds[i][1].read()`` drops the item before the read runs: the stream inside must still be open."""
    bucket, expected = dataset
    ds = GCSMapDataset(f"gs://{bucket}/ds/", transform=pair, client=client)
    assert [ds[i][1].read() for i in range(len(ds))] == list(expected.values())
    url, data = GCSMapDataset(f"gs://{bucket}/ds/", client=client)[4]
    assert type(data) is bytes and data == expected[url], "default items are (url, bytes), as documented"


def test_from_prefix_and_from_objects(dataset, client) -> None:
    bucket, expected = dataset
    urls = [f"gs://{bucket}/ds/007.bin", f"gs://{bucket}/ds/003.bin"]
    assert [url for url, _ in GCSMapDataset.from_prefix(f"gs://{bucket}/ds/00*.bin", client=client)] == sorted(
        expected
    )[:10]
    with GCSFront(client.endpoint) as front:
        ds = GCSIterableDataset.from_objects(urls, client=front.client_config, shuffle=False)
        assert front.counts == {"metadata": 2}, "one metadata request per object, no listing"
        assert list(ds) == [(url, expected[url]) for url in urls]
    with pytest.raises(NotFoundError, match=f"gs://{bucket}/ds/missing.bin"):
        GCSMapDataset.from_objects([*urls, f"gs://{bucket}/ds/missing.bin"], client=client)
    with pytest.warns(MissingObjectWarning, match="missing.bin"):
        ds = GCSMapDataset.from_objects([f"gs://{bucket}/ds/missing.bin", *urls], skip_missing=True, client=client)
    assert [ds[i][0] for i in range(len(ds))] == urls and ds.stats.missing == 1
    with pytest.raises(InvalidURIError, match="object name must not be empty"):
        GCSMapDataset.from_objects([f"gs://{bucket}/"], client=client)


def test_errors_name_the_public_classes(dataset, client) -> None:
    bucket, _ = dataset
    for kind in (GCSMapDataset, GCSIterableDataset):
        with pytest.raises(
            TypeError, match=rf"{kind.__name__}.__init__\(\) got an unexpected keyword argument 'shufle'"
        ):
            kind(f"gs://{bucket}/ds/", shufle=True, client=client)
        with pytest.raises(TypeError, match=rf"{kind.__name__}.__init__\(\) got an unexpected keyword argument 'mask'"):
            kind.from_prefix(f"gs://{bucket}/ds/", mask="*.bin", client=client)


def test_iterable_dataset_splits_across_workers_by_itself(dataset, client) -> None:
    bucket, expected = dataset
    ds = GCSIterableDataset(f"gs://{bucket}/ds/", transform=read, client=client, shuffle=True, seed=5)
    assert_exactly_once(list(DataLoader(ds, batch_size=None, num_workers=2)), expected)


def test_iterable_dataset_shuffles_by_seed_and_epoch(dataset, client) -> None:
    bucket, _ = dataset
    ds = GCSIterableDataset(
        f"gs://{bucket}/ds/", transform=lambda url, stream: url, client=client, shuffle=True, seed=5
    )
    first = list(ds)
    assert list(ds) == first, "the same epoch and seed give the same order"
    ds.set_epoch(1)
    second = list(ds)
    assert second != first and sorted(second) == sorted(first)
    assert list(GCSIterableDataset(f"gs://{bucket}/ds/", transform=lambda url, stream: url, client=client)) == sorted(
        first
    )


def test_iterable_dataset_resumes_mid_epoch(dataset, client) -> None:
    bucket, expected = dataset
    ds = GCSIterableDataset(f"gs://{bucket}/ds/", transform=read, client=client, shuffle=True, seed=9)
    ds.set_epoch(2)
    iterator = iter(ds)
    before = [next(iterator) for _ in range(23)]
    state = ds.state_dict()
    fresh = GCSIterableDataset(f"gs://{bucket}/ds/", transform=read, client=client, shuffle=True)
    fresh.load_state_dict(state)
    after = list(fresh)
    assert len(after) == N_OBJECTS - 23
    assert_exactly_once(before + after, expected)


def _stateful(ds, batch_size: int):
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning
        )
        from torchdata.stateful_dataloader import StatefulDataLoader
    return StatefulDataLoader(
        ds, batch_size=batch_size, num_workers=2, collate_fn=list, shuffle=isinstance(ds, GCSMapDataset)
    )


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.9's StatefulDataLoader on torch 2.13
@pytest.mark.parametrize("kind", [GCSMapDataset, GCSIterableDataset])
def test_stateful_dataloader_resumes_mid_epoch_in_a_fresh_loader(dataset, client, kind) -> None:
    bucket, expected = dataset
    loader = _stateful(kind(f"gs://{bucket}/ds/", transform=read, client=client), batch_size=4)
    iterator = iter(loader)
    before = [item for _ in range(5) for item in next(iterator)]
    state = loader.state_dict()
    del iterator, loader
    fresh = _stateful(kind(f"gs://{bucket}/ds/", transform=read, client=client), batch_size=4)
    fresh.load_state_dict(state)
    after = [item for batch in fresh for item in batch]
    assert len(before) == 20 and len(after) == N_OBJECTS - 20
    assert_exactly_once(before + after, expected)


def _one_rank(rank: int, world: int, folder: str, url: str, endpoint: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    try:
        ds = GCSIterableDataset(url, transform=read, client=ClientConfig(endpoint=endpoint), shuffle=True, seed=1)
        Path(folder, f"rank-{rank}.pkl").write_bytes(pickle.dumps(list(DataLoader(ds, batch_size=None, num_workers=2))))
    finally:
        dist.destroy_process_group()


def test_two_ranks_of_two_workers_read_each_object_once(dataset, client, tmp_path: Path) -> None:
    bucket, expected = dataset
    mp.spawn(_one_rank, args=(2, str(tmp_path), f"gs://{bucket}/ds/", client.endpoint), nprocs=2)
    shares = [pickle.loads((tmp_path / f"rank-{rank}.pkl").read_bytes()) for rank in range(2)]
    assert [len(share) for share in shares] == [N_OBJECTS // 2] * 2
    assert_exactly_once(shares[0] + shares[1], expected)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_stats_are_summed_over_the_workers(dataset, client, context: str) -> None:
    bucket, expected = dataset
    kinds = (GCSMapDataset, GCSIterableDataset) if context == "fork" else (GCSIterableDataset,)  # spawning is slow
    for ds in (kind(f"gs://{bucket}/ds/", transform=read, client=client) for kind in kinds):
        loader = DataLoader(ds, batch_size=6, num_workers=2, multiprocessing_context=context, collate_fn=list)
        for epoch in (1, 2):  # new workers each epoch: their counts add to the earlier ones'
            assert_exactly_once([item for batch in loader for item in batch], expected)
            stats = ds.stats
            assert stats.objects == epoch * N_OBJECTS, type(ds).__name__
            assert stats.requests >= epoch * N_OBJECTS and stats.bytes == epoch * sum(map(len, expected.values()))
            assert ds.stall_stats()["object_wait_s"]["count"] == epoch * N_OBJECTS  # every worker's waits
        assert pickle.loads(pickle.dumps(ds)).stats.objects == 0, "a pickled copy counts afresh"
