"""``LocalCache``: a node's own copy of the objects, under every front end. Requests are counted where GCS would
see them (a ``GCSFront`` before the emulator); the bytes are checked against what was seeded."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import CacheWarning, GCSIterableDataset, GCSMapDataset, LocalCache
from torchdata_gcs._engines.local_cache import LAYOUT
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET = "local-cache"
COUNT, SIZE = 50, 4096
OBJECTS = {f"data/{i:03d}.bin": os.urandom(SIZE) for i in range(COUNT)}
PREFIX = f"gs://{BUCKET}/data/"


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    gcs_emulator.seed(BUCKET, OBJECTS)
    with GCSFront(gcs_emulator.endpoint) as running:
        yield running


def media_gets(front: GCSFront) -> int:
    counts = front.counts
    return counts["get"] + counts["range_get"]


def entries(folder: Path) -> list[Path]:
    return [path for path in (folder / LAYOUT / "entries").glob("*/*") if path.is_file()]


def read_epochs(dataset: GCSIterableDataset, epochs: int, front: GCSFront, workers: int = 2) -> list[int]:
    """The media GETs each epoch sent; every epoch's items checked against the seeded bytes."""
    sent = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        before = media_gets(front)
        got = dict(DataLoader(dataset, batch_size=None, num_workers=workers))
        assert got == {f"gs://{BUCKET}/{name}": data for name, data in OBJECTS.items()}
        sent.append(media_gets(front) - before)
    return sent


def test_a_cached_epoch_sends_no_media_request_and_gives_the_same_bytes(front: GCSFront, tmp_path: Path) -> None:
    cache = LocalCache(tmp_path, limit=10 * COUNT * SIZE)
    dataset = GCSIterableDataset(PREFIX, shuffle=True, client=front.client_config, cache=cache)
    assert read_epochs(dataset, 3, front) == [COUNT, 0, 0]
    assert len(entries(tmp_path)) == COUNT


@pytest.mark.parametrize("shuffle", [False, True], ids=["same-order", "reshuffled"])
def test_a_cache_half_the_data_serves_at_least_45_percent_of_every_later_epoch(
    shuffle: bool, front: GCSFront, tmp_path: Path
) -> None:
    cache = LocalCache(tmp_path, limit=COUNT * SIZE // 2)
    dataset = GCSIterableDataset(PREFIX, shuffle=shuffle, client=front.client_config, cache=cache)
    sent = read_epochs(dataset, 4, front, workers=0)
    assert sent[0] == COUNT
    assert all(gets <= 0.55 * COUNT for gets in sent[1:]), sent  # LRU would send all of them again (same order)
    assert sum(path.stat().st_size for path in entries(tmp_path)) <= cache.limit


def test_the_folder_never_holds_more_than_the_limit(front: GCSFront, tmp_path: Path) -> None:
    cache = LocalCache(tmp_path, limit=7 * SIZE + 100)
    pipe = IterableWrapper(sorted(f"gs://{BUCKET}/{name}" for name in OBJECTS)).load_files_by_gcs(
        client=front.client_config, cache=cache
    )
    for _, stream in pipe:
        stream.read()
        assert sum(path.stat().st_size for path in entries(tmp_path)) <= cache.limit
    assert len(entries(tmp_path)) == 7


def test_an_object_rewritten_on_gcs_is_read_anew(gcs_emulator: Emulator, front: GCSFront, tmp_path: Path) -> None:
    bucket = "local-cache-rewritten"
    gcs_emulator.seed(bucket, {"a.bin": b"first version"})
    cache = LocalCache(tmp_path, limit="1MB")
    assert GCSMapDataset(f"gs://{bucket}/", client=front.client_config, cache=cache)[0][1] == b"first version"
    gcs_emulator.upload(bucket, "a.bin", b"second version, longer")
    before = media_gets(front)
    again = GCSMapDataset(f"gs://{bucket}/", client=front.client_config, cache=cache)
    assert again[0][1] == b"second version, longer"
    assert media_gets(front) == before + 1 and again.stats.cache_misses == 1
    assert sorted(path.read_bytes() for path in entries(tmp_path)) == [b"first version", b"second version, longer"]
    assert again[0][1] == b"second version, longer" and again.stats.cache_hits == 1


def test_a_damaged_entry_is_read_from_gcs_and_replaced(front: GCSFront, tmp_path: Path) -> None:
    cache = LocalCache(tmp_path, limit="1MB")
    dataset = GCSMapDataset(PREFIX, client=front.client_config, cache=cache)
    name, data = dataset[3]
    (entry,) = [path for path in entries(tmp_path)]
    damaged = bytearray(entry.read_bytes())
    damaged[100] ^= 0x01
    entry.write_bytes(bytes(damaged))
    before = media_gets(front)
    with pytest.warns(CacheWarning, match="damaged entry"):
        assert dataset[3] == (name, data)
    assert media_gets(front) == before + 1
    assert [path.read_bytes() for path in entries(tmp_path)] == [data]


def test_stats_count_hits_misses_and_bytes_from_the_cache(front: GCSFront, tmp_path: Path) -> None:
    cache = LocalCache(tmp_path, limit="1MB")
    first = GCSMapDataset(PREFIX, client=front.client_config, cache=cache)
    list(DataLoader(first, batch_size=8, num_workers=0))
    assert (first.stats.cache_hits, first.stats.cache_misses, first.stats.bytes) == (0, COUNT, COUNT * SIZE)
    second = GCSMapDataset(PREFIX, client=front.client_config, cache=cache)
    list(DataLoader(second, batch_size=8, num_workers=2))
    report = second.stall_stats()
    assert (report["cache_hits"], report["cache_misses"], report["cache_bytes"]) == (COUNT, 0, COUNT * SIZE)
    assert (report["requests"], report["bytes"]) == (0, 0)


def test_the_settings_pickle_and_bad_ones_are_refused(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path, limit="1.5GiB", evict_idle_after=60)
    assert pickle.loads(pickle.dumps(cache)) == cache and cache.limit == 1536 * 1024**2
    for limit, error in (("lots", ValueError), (0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="limit"):
            LocalCache(tmp_path, limit=limit)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cache must be a LocalCache"):
        GCSMapDataset([], cache=str(tmp_path))  # type: ignore[arg-type]


# -- one download per node ---------------------------------------------------------------------------------

READER = textwrap.dedent(
    """
    import os, sys, time
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata_gcs import ClientConfig, LocalCache, TransferConfig
    endpoint, folder, start, urls = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    time.sleep(max(0.0, start - time.time()))  # every reader starts at once
    pipe = IterableWrapper(urls).load_files_by_gcs(
        client=ClientConfig(endpoint=endpoint, anonymous=True),
        transfer=TransferConfig(max_in_flight=int(os.environ.get("IN_FLIGHT", "64"))),
        cache=LocalCache(folder, limit="1GB"),
    )
    print(sum(len(stream.read()) for _, stream in pipe))
    """
)


def test_four_processes_asking_for_the_same_objects_at_once_download_each_once(
    gcs_emulator: Emulator,
    front: GCSFront,
    tmp_path: Path,  # front: the objects seeded
) -> None:
    urls = sorted(f"gs://{BUCKET}/{name}" for name in OBJECTS)
    with GCSFront(gcs_emulator.endpoint, bandwidth=2_000_000) as slow:  # downloads overlap
        start = time.time() + 3
        readers = [
            subprocess.Popen(
                [sys.executable, "-c", READER, slow.endpoint, str(tmp_path), str(start), *urls],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outputs = [reader.communicate(timeout=120)[0] for reader in readers]
        assert [reader.returncode for reader in readers] == [0] * 4
        assert [int(output) for output in outputs] == [COUNT * SIZE] * 4
        assert media_gets(slow) == COUNT


def test_ranks_and_workers_sharing_one_folder_download_each_object_once_in_the_run(
    gcs_emulator: Emulator,
    front: GCSFront,
    tmp_path: Path,  # front: the objects seeded
) -> None:
    script = textwrap.dedent(
        """
        import sys
        from torch.utils.data import DataLoader
        from torchdata_gcs import ClientConfig, GCSIterableDataset, LocalCache
        endpoint, folder, prefix = sys.argv[1:4]
        dataset = GCSIterableDataset(prefix, shuffle=True, client=ClientConfig(endpoint=endpoint, anonymous=True),
                                     cache=LocalCache(folder, limit="1GB"))
        total = 0
        for epoch in range(3):
            dataset.set_epoch(epoch)
            total += sum(len(data) for _, data in DataLoader(dataset, batch_size=None, num_workers=2))
        print(total)
        """
    )
    with GCSFront(gcs_emulator.endpoint) as counted:
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", script, counted.endpoint, str(tmp_path), PREFIX],
                env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"},
                stdout=subprocess.PIPE,
                text=True,
            )
            for rank in range(2)
        ]
        outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
        assert [rank.returncode for rank in ranks] == [0, 0]
        assert sum(int(output) for output in outputs) == 3 * COUNT * SIZE
        assert media_gets(counted) == COUNT


def test_a_reader_killed_mid_write_leaves_nothing_torn_and_its_entries_are_reused(
    gcs_emulator: Emulator,
    front: GCSFront,
    tmp_path: Path,  # front: the objects seeded
) -> None:
    urls = sorted(f"gs://{BUCKET}/{name}" for name in OBJECTS)
    with GCSFront(gcs_emulator.endpoint, bandwidth=20_000) as slow:  # about 0.2 s an object, 2 at a time
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, slow.endpoint, str(tmp_path), "0", *urls],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "IN_FLIGHT": "2"},
        )
        deadline = time.monotonic() + 60
        while len(entries(tmp_path)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=30)
    kept = len(entries(tmp_path))
    assert 5 <= kept < COUNT
    (tmp_path / LAYOUT / "tmp" / "999999999.0123456789ab").write_bytes(b"half an obj")  # a writer killed mid-way
    with GCSFront(gcs_emulator.endpoint) as counted:
        cache = LocalCache(tmp_path, limit="1GB")
        pipe = IterableWrapper(urls).load_files_by_gcs(client=counted.client_config, cache=cache)
        assert {url: stream.read() for url, stream in pipe} == {f"gs://{BUCKET}/{n}": d for n, d in OBJECTS.items()}
        assert media_gets(counted) == COUNT - kept
    assert list((tmp_path / LAYOUT / "tmp").iterdir()) == []  # the dead writer's file removed


# -- bad conditions cost speed, never data ---------------------------------------------------------------


def read_all_warned(front: GCSFront, cache: LocalCache) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = GCSMapDataset(PREFIX, client=front.client_config, cache=cache)
        assert dict(dataset[i] for i in range(COUNT)) == {f"gs://{BUCKET}/{n}": d for n, d in OBJECTS.items()}
    return [warning for warning in caught if issubclass(warning.category, CacheWarning)]


def test_a_folder_that_cannot_be_made_reads_from_gcs_with_one_warning(front: GCSFront, tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"in the way")
    caught = read_all_warned(front, LocalCache(tmp_path / "file" / "cache", limit="1MB"))
    assert len(caught) == 1 and str(tmp_path / "file") in str(caught[0].message)


def test_entries_removed_by_another_process_are_read_from_gcs(front: GCSFront, tmp_path: Path) -> None:
    cache = LocalCache(tmp_path, limit="1MB")
    assert read_all_warned(front, cache) == []
    for path in entries(tmp_path)[::2]:
        path.unlink()
    before = media_gets(front)
    assert read_all_warned(front, cache) == []
    assert media_gets(front) - before == COUNT // 2


def test_a_full_disk_reads_from_gcs_with_one_warning(front: GCSFront, tmp_path: Path) -> None:
    mounted = tmp_path / "small"
    mounted.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mounted)], capture_output=True)
    if done.returncode:
        pytest.skip(f"a small file system cannot be mounted here: {done.stderr.decode().strip()}")
    try:
        caught = read_all_warned(front, LocalCache(mounted, limit="1GB"))
        assert len(caught) == 1 and "No space left on device" in str(caught[0].message), caught
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=True)  # lazily: the store keeps its lock file open


def test_a_file_system_without_working_locks_reads_from_gcs_with_one_warning(
    front: GCSFront, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import fcntl

    def refuse(*args: object) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "lockf", refuse)  # what an NFS mount without a lock daemon answers
    caught = read_all_warned(front, LocalCache(tmp_path, limit="1MB"))
    assert len(caught) == 1 and "No locks available" in str(caught[0].message)


# -- whole objects: checkpoints and safetensors ------------------------------------------------------------


def test_checkpoints_and_safetensors_load_from_the_cache_the_second_time(
    gcs_emulator: Emulator, front: GCSFront, tmp_path: Path
) -> None:
    import torch

    from torchdata_gcs import WriteConfig, Zstd, checkpoint, safetensors

    gcs_emulator.create_bucket("local-cache-weights")
    client, cache = front.client_config, LocalCache(tmp_path, limit="1GB")
    state = {"w": torch.arange(10_000.0), "b": torch.ones(3, dtype=torch.int64)}
    urls = {
        "plain": "gs://local-cache-weights/plain.pt",
        "zstd": "gs://local-cache-weights/zstd.pt",
        "safetensors": "gs://local-cache-weights/model.safetensors",
    }
    checkpoint.save(state, urls["plain"], client=client)
    checkpoint.save(state, urls["zstd"], client=client, write=WriteConfig(compression=Zstd(byte_grouping=True)))
    safetensors.save_file(state, urls["safetensors"], client=client)

    def load_all() -> list[dict[str, torch.Tensor]]:
        return [
            checkpoint.load(urls["plain"], client=client, cache=cache),
            checkpoint.load(urls["zstd"], client=client, cache=cache),
            safetensors.load_file(urls["safetensors"], client=client, cache=cache),
        ]

    for loaded in load_all():
        assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    before = media_gets(front)
    for loaded in load_all():
        assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    assert media_gets(front) == before  # metadata only: which version is live
    assert len(entries(tmp_path)) == 3


def test_the_guides_snippet_reads_a_second_epoch_from_the_cache(
    front: GCSFront, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.doc_blocks import doc_block

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", front.endpoint)  # the snippet's default client
    snippet = doc_block('LocalCache("gcs-cache"').replace('"gcs-cache"', repr(str(tmp_path)))
    namespace = {"decode": lambda stream: stream.read()}
    exec(snippet.replace("gs://my-bucket/train/", PREFIX), namespace)  # noqa: S102 - our own docs (guides/cache.md)
    dataset = namespace["dataset"]
    assert sorted(dataset) == sorted(OBJECTS.values())
    dataset.set_epoch(1)
    assert sorted(dataset) == sorted(OBJECTS.values())
    assert (dataset.stats.cache_misses, dataset.stats.cache_hits) == (COUNT, COUNT)


def test_the_stall_watch_reports_the_cache(front: GCSFront, tmp_path: Path) -> None:
    from torchdata_gcs.stalls import StallWatch

    cache = LocalCache(tmp_path, limit="1MB")
    for expected in ((0, COUNT), (COUNT, 0)):
        dataset = GCSIterableDataset(PREFIX, client=front.client_config, cache=cache)
        watch = StallWatch(DataLoader(dataset, batch_size=8, num_workers=2), source=dataset)
        assert sum(len(batch[0]) for batch in watch) == COUNT
        report = watch.report()
        assert (report["cache_hits"], report["cache_misses"]) == expected
        assert report["cache_bytes"] == expected[0] * SIZE


def test_entries_left_unread_make_room_for_new_ones(gcs_emulator: Emulator, front: GCSFront, tmp_path: Path) -> None:
    gcs_emulator.seed("local-cache-next", {f"{i}.bin": os.urandom(SIZE) for i in range(10)})
    cache = LocalCache(tmp_path, limit=10 * SIZE, evict_idle_after=1.0)
    old = GCSMapDataset(PREFIX, client=front.client_config, cache=cache)
    old.__getitems__(list(range(10)))
    assert len(entries(tmp_path)) == 10 and old.stats.cache_misses == 10
    new = GCSMapDataset("gs://local-cache-next/", client=front.client_config, cache=cache)
    new.__getitems__(list(range(10)))
    assert new.stats.cache_misses == 10 and len(entries(tmp_path)) == 10  # full of recent entries: nothing admitted
    time.sleep(1.2)
    new.__getitems__(list(range(10)))  # the old entries are idle now
    again = GCSMapDataset("gs://local-cache-next/", client=front.client_config, cache=cache)
    again.__getitems__(list(range(10)))
    assert again.stats.cache_hits == 10 and len(entries(tmp_path)) == 10


def test_compose_shards_keeps_the_objects_and_reads_them_back(front: GCSFront, tmp_path: Path) -> None:
    cache = LocalCache(tmp_path, limit="1MB")
    listed = IterableWrapper([PREFIX]).list_files_by_gcs(client=front.client_config, with_metadata=True)
    pipe = listed.compose_shards_by_gcs(client=front.client_config, cache=cache)
    expected = {f"gs://{BUCKET}/{name}": data for name, data in OBJECTS.items()}
    assert {url: stream.read() for url, stream in pipe} == expected
    assert pipe.stats.composes > 0 and len(entries(tmp_path)) == COUNT
    before = media_gets(front)
    assert {url: stream.read() for url, stream in pipe} == expected
    assert media_gets(front) == before and pipe.stats.composes == 0 and pipe.stats.cache_hits == COUNT


def test_two_nodes_each_keep_their_part_and_read_a_second_epoch_from_their_own_disk(
    gcs_emulator: Emulator, front: GCSFront, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 nodes of 2 ranks (torchrun's variables), a folder each holding 60% of the data: the second epoch asks
    GCS for under a tenth of the objects, and every epoch reads every object once."""
    from tests.ranks import as_rank

    objects = {f"{i:03d}.bin": os.urandom(SIZE) for i in range(40)}
    gcs_emulator.seed("local-cache-nodes", objects)
    gets = []
    for epoch in range(2):
        before, read = media_gets(front), []
        for rank in range(4):
            as_rank(monkeypatch, rank, 4, per_node=2)
            cache = LocalCache(tmp_path / f"node-{rank // 2}", limit=int(0.6 * len(objects) * SIZE))
            dataset = GCSIterableDataset(
                "gs://local-cache-nodes/", shuffle=True, locality="node", client=front.client_config, cache=cache
            )
            dataset.set_epoch(epoch)
            read += [url for url, data in dataset if data == objects[url.rsplit("/", 1)[1]]]
        assert sorted(read) == sorted(f"gs://local-cache-nodes/{name}" for name in objects), f"epoch {epoch}"
        gets.append(media_gets(front) - before)
    assert gets[0] == len(objects) and gets[1] < len(objects) / 10, gets


def test_a_script_whose_cache_folder_is_gone_at_its_end_ends_without_a_word(front: GCSFront, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import shutil
        from torchdata_gcs import ClientConfig, GCSMapDataset, LocalCache
        cache = LocalCache({str(tmp_path / "cache")!r}, limit="1MB")
        client = ClientConfig(endpoint={front.endpoint!r}, anonymous=True)
        dataset = GCSMapDataset({PREFIX!r}, client=client, cache=cache)
        dataset[0], dataset[0]
        shutil.rmtree({str(tmp_path / "cache")!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
