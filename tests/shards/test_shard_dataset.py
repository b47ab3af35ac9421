"""ShardDataset and ShardMapDataset over real HTTP: tar shards (written by Python's tarfile) read as samples,
every sample once per epoch in equal shares on 1, 2 and 3 ranks with 0 and 2 workers, resumed exactly
mid-epoch (the shuffle buffer's samples included) and elastically from 2 ranks to 3; indexes made and
written where missing; bad shards named, or skipped and counted; one sample by one ranged GET."""

from __future__ import annotations

import io
import tarfile
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.ranks import as_rank
from torchdata_gcs import IntegrityError, NotFoundError, ResumeError, RetryConfig, ShardWarning
from torchdata_gcs.shards import ShardDataset, ShardMapDataset, pack
from torchdata_gcs.testing import Emulator, Fault, GCSFront

BUCKET = "shards"
SIZES = [23, 31, 17, 40, 26, 35, 28]  # samples per shard: 200 in all


def shard(first: int, count: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for key in range(first, first + count):
            for extension, data in (("jpg", b"J%d" % key * (key % 7 + 1)), ("json", b'{"k": %d}' % key)):
                info = tarfile.TarInfo(f"{key:06d}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def key_of(sample: dict[str, Any]) -> int:
    assert sample["json"] == b'{"k": %d}' % int(sample["__key__"])  # both members, of the same sample
    assert sample["jpg"] == b"J%d" % int(sample["__key__"]) * (int(sample["__key__"]) % 7 + 1)
    return int(sample["__key__"])


@pytest.fixture(scope="module")
def client(gcs_emulator: Emulator) -> Iterator[Any]:
    starts = [sum(SIZES[:i]) for i in range(len(SIZES))]
    gcs_emulator.seed(
        BUCKET, {f"train/{i:03d}.tar": shard(start, n) for i, (start, n) in enumerate(zip(starts, SIZES, strict=True))}
    )
    yield gcs_emulator.client_config


def dataset(client: Any, **settings: Any) -> ShardDataset[int]:
    return ShardDataset(f"gs://{BUCKET}/train/", transform=key_of, client=client, shuffle_buffer=16, **settings)


def test_an_epoch_reads_each_sample_once_shuffled_and_writes_the_indexes(client: Any, gcs_emulator: Emulator) -> None:
    first = dataset(client)
    assert first.samples == 200
    assert sorted(gcs_emulator.read(BUCKET, f"train/{i:03d}.tar.idx")[:1] for i in range(7)) == [b"{"] * 7
    keys = list(first)
    assert sorted(keys) == list(range(200)) and keys != sorted(keys)
    assert list(dataset(client)) == keys  # the same seed and epoch, the same order
    first.set_epoch(1)
    assert sorted(list(first)) == list(range(200)) and list(first) != keys


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_get_equal_shares_and_every_sample(
    client: Any, monkeypatch: pytest.MonkeyPatch, world: int, workers: int
) -> None:
    shares = []
    for rank in range(world):
        as_rank(monkeypatch, rank, world)
        loader = DataLoader(dataset(client), batch_size=None, num_workers=workers)
        shares.append(list(loader))
    assert len({len(share) for share in shares}) == 1  # equal shares
    counts = Counter(key for share in shares for key in share)
    assert set(counts) == set(range(200))
    padding = -(-200 // world) * world - 200
    assert sum(counts.values()) - 200 == padding and max(counts.values()) <= 2


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_continues_exactly_with_the_buffers_samples(client: Any, workers: int) -> None:
    whole = [
        key
        for batch in StatefulDataLoader(dataset(client), batch_size=4, num_workers=workers)
        for key in batch.tolist()
    ]
    loader = StatefulDataLoader(dataset(client), batch_size=4, num_workers=workers)
    batches = iter(loader)
    head = [key for _ in range(13) for key in next(batches).tolist()]
    state = loader.state_dict()
    del batches
    resumed = StatefulDataLoader(dataset(client), batch_size=4, num_workers=workers)
    resumed.load_state_dict(state)
    tail = [key for batch in resumed for key in batch.tolist()]
    assert head + tail == whole  # nothing lost, nothing repeated, the same order


def test_elastic_resume_from_two_ranks_to_three(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    read, states = [], []
    for rank in range(2):  # both ranks stop after 9 batches of 4, as DDP steps
        as_rank(monkeypatch, rank, 2)
        loader = StatefulDataLoader(dataset(client), batch_size=4, num_workers=2)
        batches = iter(loader)
        read += [key for _ in range(9) for key in next(batches).tolist()]
        states.append(loader.state_dict())
        del batches
    position = dataset(client).elastic_state(states[0])
    for rank in range(3):
        as_rank(monkeypatch, rank, 3)
        resumed = dataset(client)
        resumed.load_state_dict(position)
        read += list(resumed)
    counts = Counter(read)
    assert set(counts) == set(range(200))
    assert sum(counts.values()) - 200 <= 2  # the last block's padding alone


def test_a_state_of_other_ranks_or_settings_is_refused(client: Any) -> None:
    state = dataset(client).state_dict()
    with pytest.raises(ResumeError, match="shuffle_buffer"):
        ShardDataset(f"gs://{BUCKET}/train/", client=client, shuffle_buffer=8).load_state_dict(state)


def test_map_dataset_reads_one_sample_by_one_ranged_get(client: Any, gcs_emulator: Emulator) -> None:
    with GCSFront(gcs_emulator.endpoint) as front:
        samples = ShardMapDataset(f"gs://{BUCKET}/train/", transform=key_of, client=front.client_config)
        assert len(samples) == 200
        front.reset_counts()
        assert [samples[0], samples[23], samples[199], samples[-1]] == [0, 23, 199, 199]
        assert front.counts["range_get"] + front.counts["get"] == 4
    with pytest.raises(IndexError):
        samples[200]


def bad_bucket(gcs_emulator: Emulator, name: str, damaged: bytes) -> str:
    gcs_emulator.seed(name, {"s/000.tar": shard(0, 10), "s/001.tar": damaged, "s/002.tar": shard(20, 10)})
    return f"gs://{name}/s/"


def test_a_cut_shard_is_named_with_its_offset(gcs_emulator: Emulator, client: Any) -> None:
    url = bad_bucket(gcs_emulator, "bad-cut", shard(10, 10)[:3000])
    with pytest.raises(IntegrityError, match=r"gs://bad-cut/s/001.tar: not a tar archive at byte \d+"):
        ShardDataset(url, client=client)


def test_a_cut_shard_without_an_index_is_left_out_when_bad_shards_are_skipped(
    gcs_emulator: Emulator, client: Any
) -> None:
    url = bad_bucket(gcs_emulator, "bad-cut-skipped", shard(10, 10)[:3000])
    with pytest.warns(ShardWarning, match=r"gs://bad-cut-skipped/s/001.tar: not a tar archive .* left out"):
        lenient = ShardDataset(url, client=client, shuffle=False, shards_open=1, skip_bad_shards=True)
    assert lenient.shards == ["gs://bad-cut-skipped/s/000.tar", "gs://bad-cut-skipped/s/002.tar"]
    assert [int(sample["__key__"]) for sample in lenient] == list(range(10)) + list(range(20, 30))


def test_an_index_of_another_version_is_replaced_once(gcs_emulator: Emulator, client: Any) -> None:
    gcs_emulator.seed("stale-index", {"s/000.tar": shard(0, 10)})
    ShardDataset("gs://stale-index/s/", client=client)  # writes the index
    old = gcs_emulator.read("stale-index", "s/000.tar.idx")
    gcs_emulator.upload("stale-index", "s/000.tar", shard(100, 5))  # the shard replaced, its index now stale
    assert ShardDataset("gs://stale-index/s/", client=client).samples == 5
    new = gcs_emulator.read("stale-index", "s/000.tar.idx")
    assert new != old
    with GCSFront(gcs_emulator.endpoint) as front:
        dataset = ShardDataset("gs://stale-index/s/", client=front.client_config)
        assert dataset.samples == 5 and front.counts["get"] == 1  # the index alone: the shard is not read again
    assert gcs_emulator.read("stale-index", "s/000.tar.idx") == new


def test_a_member_without_a_key_is_named(gcs_emulator: Emulator, client: Any) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.addfile(tarfile.TarInfo(".hidden"), io.BytesIO(b""))
    url = bad_bucket(gcs_emulator, "bad-key", out.getvalue())
    with pytest.raises(IntegrityError, match=r"001.tar: member '.hidden' at byte 0 has no sample key"):
        ShardDataset(url, client=client)


def test_a_shard_deleted_mid_epoch_is_named_or_skipped_and_counted(gcs_emulator: Emulator, client: Any) -> None:
    url = bad_bucket(gcs_emulator, "bad-gone", shard(10, 10))
    strict = ShardDataset(url, client=client, shuffle=False, shards_open=1)
    lenient = ShardDataset(url, client=client, shuffle=False, shards_open=1, skip_bad_shards=True)
    gcs_emulator.delete("bad-gone", "s/001.tar")
    with pytest.raises(NotFoundError, match="gs://bad-gone/s/001.tar"):
        list(strict)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [int(sample["__key__"]) for sample in lenient]
    assert keys == list(range(10)) + list(range(20, 30))  # whole samples only, none of the gone shard
    assert lenient.skipped_samples == 10
    assert [type(warning.message) for warning in caught] == [ShardWarning]


def test_packed_shards_read_back_exactly_each_member_checked_by_its_index(gcs_emulator: Emulator) -> None:
    objects = {
        f"raw/{key:05d}.{ext}": b"%s-%d" % (ext.encode(), key) * (key % 50 + 1000)
        for key in range(300)
        for ext in ("jpg", "cls")
    }
    gcs_emulator.seed("packed", objects)
    with GCSFront(gcs_emulator.endpoint) as front:
        pack("gs://packed/raw/", "gs://packed/shards/", shard_size=256 * 1024, client=front.client_config)
        front.reset_counts()
        samples = list(ShardDataset("gs://packed/shards/", shuffle=False, shards_open=1, client=front.client_config))
        shards = sum(1 for name in gcs_emulator.names("packed") if name.endswith(".tar"))
        assert front.counts["range_get"] >= shards and front.counts["get"] == shards  # one index GET per shard
    assert [sample["__key__"] for sample in samples] == [f"{key:05d}" for key in range(300)]
    for sample in samples:
        assert {ext: sample[ext] for ext in ("jpg", "cls")} == {
            ext: objects[f"raw/{sample['__key__']}.{ext}"] for ext in ("jpg", "cls")
        }
    with GCSFront(gcs_emulator.endpoint) as front:  # damage on the way: read again, never handed out
        front.set_faults([Fault("corrupt", match="range_get", times=1)])
        again = list(ShardDataset("gs://packed/shards/", shuffle=False, shards_open=1, client=front.client_config))
        assert again == samples and front.faults_injected["corrupt"] == 1
        front.set_faults([Fault("corrupt", match="range_get")])
        retry = RetryConfig(max_attempts=2, initial_delay=0.01, max_delay=0.02)
        with pytest.raises(IntegrityError, match=r"shard-\d+\.tar: member '\d+\.(jpg|cls)' at byte \d+ does not hold"):
            list(ShardDataset("gs://packed/shards/", shuffle=False, client=front.client_config, retry=retry))
