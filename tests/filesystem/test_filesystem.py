"""GCSFileSystem's own promises, over HTTP to the emulator (through a GCS front where requests are counted
or GCS's rules matter): lazy ranged reads pinned to one version, publish-on-close writes, atomic
exclusive creates, server-side copies, safe downloads, registration, async use and forked workers."""

from __future__ import annotations

import asyncio
import os
import pickle
import random
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.registry import _registry
from torch.utils.data import DataLoader, Dataset

from torchdata_gcs import (
    GCSError,
    IntegrityError,
    InvalidURIError,
    NotFoundError,
    RetryConfig,
    TransferConfig,
    UploadError,
    WriteConfig,
)
from torchdata_gcs.fsspec import GCSFile, GCSFileSystem, register
from torchdata_gcs.testing import Emulator, Fault, GCSFront
from torchdata_gcs_fsspec_handler import VARIABLE

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


def random_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def filesystem(front: GCSFront | Emulator, **settings: object) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, skip_instance_cache=True, **settings)


def test_an_open_file_reads_only_the_ranges_asked_for(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    data = random_bytes(40 * MiB)
    gcs_emulator.upload(gcs_bucket, "shard.tar", data)
    fs = filesystem(gcs_front, transfer=TransferConfig(part_size=4 * MiB))
    gcs_front.reset_counts()
    with fs.open(f"gs://{gcs_bucket}/shard.tar", "rb", block_size=MiB) as f:
        assert isinstance(f, GCSFile) and f.seekable() and f.size == len(data)
        f.seek(-100, os.SEEK_END)
        assert f.read() == data[-100:]  # a tail (a tar index, a parquet footer): one small range
        assert dict(gcs_front.counts) == {"metadata": 1, "range_get": 1} and fs.stats.bytes <= MiB
        f.seek(10 * MiB)
        assert f.read(3 * MiB) == data[10 * MiB : 13 * MiB]
        assert fs.stats.bytes <= 5 * MiB, "only what was asked for, a block ahead"
        f.seek(0)
        assert f.read() == data  # a whole read goes out in concurrent part-size ranges
    assert gcs_front.counts["get"] == 0 and gcs_front.counts["range_get"] >= 10


def test_a_version_replaced_while_open_fails_instead_of_mixing(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.upload(gcs_bucket, "a.bin", random_bytes(3 * MiB, seed=1))
    fs = filesystem(gcs_emulator)
    with fs.open(f"{gcs_bucket}/a.bin", "rb", block_size=MiB) as f:
        first = f.read(10)
        gcs_emulator.upload(gcs_bucket, "a.bin", random_bytes(3 * MiB, seed=2))
        f.seek(2 * MiB)
        with pytest.raises(NotFoundError, match="no longer exists"):
            f.read(10)
    assert first == random_bytes(3 * MiB, seed=1)[:10]


@pytest.mark.parametrize("strategy", ["multipart", "compose"])
def test_a_written_file_is_published_on_a_clean_close_only(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, strategy: str
) -> None:
    fs = filesystem(gcs_front, write=WriteConfig(part_size=5 * MiB, max_parts_in_flight=2, strategy=strategy))  # type: ignore[arg-type]
    data = random_bytes(12 * MiB, seed=3)
    with pytest.raises(RuntimeError, match="halfway"), fs.open(f"gs://{gcs_bucket}/out.bin", "wb") as f:
        f.write(data[: 11 * MiB])  # two parts are out already
        raise RuntimeError("halfway")
    assert gcs_emulator.names(gcs_bucket) == [] and gcs_front.open_uploads == []
    with fs.open(f"gs://{gcs_bucket}/out.bin", "wb") as f:
        for offset in range(0, len(data), MiB):
            f.write(data[offset : offset + MiB])
    assert gcs_emulator.read(gcs_bucket, "out.bin") == data
    assert gcs_emulator.names(gcs_bucket) == ["out.bin"], "no part or temporary object left"
    assert gcs_front.counts["upload"] >= 3


@pytest.mark.parametrize("size", [10, 6 * MiB])
def test_an_exclusive_create_never_replaces_what_appeared_meanwhile(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, size: int
) -> None:
    fs = filesystem(gcs_front, write=WriteConfig(part_size=5 * MiB))
    url = f"gs://{gcs_bucket}/model.pt"
    writer = fs.open(url, "xb")
    writer.write(random_bytes(size, seed=4))
    gcs_emulator.upload(gcs_bucket, "model.pt", b"another writer's")  # lands between the open and the close
    with pytest.raises(FileExistsError):
        writer.close()
    assert gcs_emulator.read(gcs_bucket, "model.pt") == b"another writer's"
    assert gcs_emulator.names(gcs_bucket) == ["model.pt"], "the parts were discarded"
    with pytest.raises(FileExistsError):
        fs.put_file(__file__, url, mode="create")
    fs.put_file(__file__, url)  # overwrite, the default
    assert gcs_emulator.read(gcs_bucket, "model.pt") == Path(__file__).read_bytes()


def test_a_transaction_publishes_its_files_together_or_not_at_all(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    fs = filesystem(gcs_front, write=WriteConfig(part_size=5 * MiB))
    data = random_bytes(7 * MiB, seed=7)
    with pytest.raises(RuntimeError, match="second file"), fs.transaction:
        with fs.open(f"{gcs_bucket}/t/a.bin", "wb") as f:
            f.write(data)
        assert not fs.exists(f"{gcs_bucket}/t/a.bin"), "closed, not yet published"
        raise RuntimeError("failed before the second file")
    assert gcs_emulator.names(gcs_bucket) == [] and gcs_front.open_uploads == []
    with fs.transaction:
        for name in ("a.bin", "b.bin"):
            with fs.open(f"{gcs_bucket}/t/{name}", "wb") as f:
                f.write(data)
        assert fs.find(f"{gcs_bucket}/t") == []
    assert gcs_emulator.names(gcs_bucket) == ["t/a.bin", "t/b.bin"] and gcs_emulator.read(gcs_bucket, "t/b.bin") == data


def test_a_transaction_uploads_every_part_before_it_publishes_any_file(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    """The last part of the second file fails for good: the first file, whose parts were all out, is not
    published either."""
    # a 503 is retried until the deadline: a short one makes the part fail for good soon
    fs = filesystem(gcs_front, write=WriteConfig(part_size=5 * MiB), retry=RetryConfig(deadline=2, initial_delay=0.01))
    gcs_front.set_faults([Fault("http_503", match=r"^PUT .*b\.bin\?partNumber=2")])
    with pytest.raises(UploadError, match="a part failed"), fs.transaction:
        for name in ("a.bin", "b.bin"):
            with fs.open(f"{gcs_bucket}/t/{name}", "wb") as f:
                f.write(random_bytes(7 * MiB))  # a part of 5 MiB goes out now, the last one at commit
    assert gcs_emulator.names(gcs_bucket) == [] and gcs_front.open_uploads == []
    assert not fs._intrans


def test_pipe_and_put_within_a_transaction_publish_when_it_commits(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, tmp_path: Path
) -> None:
    local = tmp_path / "model.pt"
    local.write_bytes(random_bytes(6 * MiB))
    fs = filesystem(gcs_front, write=WriteConfig(part_size=5 * MiB))
    with pytest.raises(RuntimeError, match="diverged"), fs.transaction:
        fs.pipe(f"{gcs_bucket}/small.txt", b"small")
        fs.put_file(str(local), f"{gcs_bucket}/model.pt")
        raise RuntimeError("diverged")
    assert gcs_emulator.names(gcs_bucket) == [] and gcs_front.open_uploads == []
    with fs.transaction:
        fs.pipe(f"{gcs_bucket}/small.txt", b"small")
        fs.put_file(str(local), f"{gcs_bucket}/model.pt")
        assert {"small.txt", "model.pt"}.isdisjoint(gcs_emulator.names(gcs_bucket))  # parts out, nothing published
    assert gcs_emulator.read(gcs_bucket, "small.txt") == b"small"
    assert gcs_emulator.read(gcs_bucket, "model.pt") == local.read_bytes()


def test_a_transaction_whose_second_publish_fails_keeps_the_first_and_says_so(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """GCS publishes one object per request: the first file's publish cannot be undone when the second's fails."""
    fs = filesystem(gcs_front, write=WriteConfig(part_size=5 * MiB), retry=FAST_RETRY)
    gcs_front.set_faults([Fault("http_400", match=r"^POST .*c\.bin\?uploadId=")])  # the second completion
    with pytest.raises(GCSError, match="400"), fs.transaction:
        for name in ("a.bin", "c.bin", "d.bin"):
            with fs.open(f"{gcs_bucket}/t/{name}", "wb") as f:
                f.write(random_bytes(6 * MiB))
    assert gcs_emulator.names(gcs_bucket) == ["t/a.bin"] and gcs_front.open_uploads == []
    warned = [r.getMessage() for r in caplog.records if "a transaction published" in r.getMessage()]
    published, left = [f"gs://{gcs_bucket}/t/a.bin"], [f"gs://{gcs_bucket}/t/{n}" for n in ("c.bin", "d.bin")]
    assert warned == [f"a transaction published {published}, then failed; not published: {left}"]


def test_copy_is_a_server_side_rewrite(gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str) -> None:
    data = random_bytes(6 * MiB, seed=5)
    gcs_emulator.upload(gcs_bucket, "src/a.bin", data)
    gcs_emulator.upload(gcs_bucket, "src/sub/b.bin", b"b")
    fs = filesystem(gcs_front)
    gcs_front.reset_counts()
    fs.copy(f"{gcs_bucket}/src", f"{gcs_bucket}/dst", recursive=True)
    assert gcs_front.counts["get"] + gcs_front.counts["range_get"] + gcs_front.counts["upload"] == 0
    assert fs.stats.bytes == 0
    assert gcs_emulator.read(gcs_bucket, "dst/a.bin") == data and gcs_emulator.read(gcs_bucket, "dst/sub/b.bin") == b"b"
    fs.mv(f"{gcs_bucket}/dst/a.bin", f"{gcs_bucket}/moved.bin")
    assert gcs_emulator.names(gcs_bucket) == ["dst/sub/b.bin", "moved.bin", "src/a.bin", "src/sub/b.bin"]


def test_a_failed_download_leaves_the_local_file_as_it_was(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, tmp_path: Path
) -> None:
    gcs_emulator.upload(gcs_bucket, "big.bin", random_bytes(9 * MiB, seed=6))
    local = tmp_path / "big.bin"
    local.write_bytes(b"what was there before")
    fs = filesystem(gcs_front, retry=RetryConfig(max_attempts=2), transfer=TransferConfig(part_size=MiB))
    gcs_front.set_faults([Fault("corrupt", match="range_get")])  # every range damaged: the checksum never holds
    with pytest.raises(OSError):
        fs.get_file(f"{gcs_bucket}/big.bin", str(local))
    gcs_front.set_faults([])
    assert local.read_bytes() == b"what was there before" and os.listdir(tmp_path) == ["big.bin"]
    with pytest.raises(FileNotFoundError):
        fs.get_file(f"{gcs_bucket}/missing.bin", str(local))
    fs.get_file(f"{gcs_bucket}/big.bin", str(local))  # larger than 4 parts: streamed to disk
    assert local.read_bytes() == random_bytes(9 * MiB, seed=6)


def test_listing_hides_temporary_objects_and_shows_folder_placeholders(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """A placeholder is an object (``find`` names it) that makes its folder a directory, listed by itself as gcsfs
    lists it (``test_gcsfs_parity_markers``)."""
    names = ["a/1", "a/b/2", "a/b/3", "ab", "empty/", ".torchdata-gcs-tmp/job/part-00001"]
    gcs_emulator.seed(gcs_bucket, {name: b"" if name.endswith("/") else b"x" for name in names})
    fs = filesystem(gcs_emulator)
    assert fs.find(gcs_bucket) == [f"{gcs_bucket}/{n}" for n in ("a/1", "a/b/2", "a/b/3", "ab", "empty/")]
    assert fs.find(f"{gcs_bucket}/a", withdirs=True) == [
        f"{gcs_bucket}/{n}" for n in ("a", "a/1", "a/b", "a/b/2", "a/b/3")
    ]
    assert fs.ls(gcs_bucket, detail=False) == [f"{gcs_bucket}/{n}" for n in ("a", "ab", "empty")]
    assert fs.ls(f"{gcs_bucket}/empty") == [f"{gcs_bucket}/empty"]
    assert fs.ls(f"{gcs_bucket}/ab", detail=False) == [f"{gcs_bucket}/ab"]
    assert fs.isdir(f"{gcs_bucket}/a/b") and fs.isfile(f"{gcs_bucket}/ab") and not fs.exists(f"{gcs_bucket}/a/c")
    assert fs.glob(f"{gcs_bucket}/a/**/3") == [f"{gcs_bucket}/a/b/3"]
    with pytest.raises(IsADirectoryError):
        fs.rm(f"{gcs_bucket}/a")
    fs.rm(f"{gcs_bucket}/a", recursive=True)
    assert not fs.exists(f"{gcs_bucket}/a") and fs.exists(f"{gcs_bucket}/ab")


def test_bad_input_is_refused_with_a_typed_error(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    fs = filesystem(gcs_emulator)
    gcs_emulator.upload(gcs_bucket, "x", b"x")
    with pytest.raises(InvalidURIError, match="no bucket"):
        fs.info("gs://")
    with pytest.raises(ValueError, match="needs project="):  # the buckets of which project?
        fs.ls("gs://")
    with pytest.raises(InvalidURIError):
        fs.info("gs://Bad_Bucket/x")
    with pytest.raises(FileNotFoundError):
        fs.info("gs://no-such-bucket-here/x")
    for call in (fs.info, fs.cat, fs.open, fs.rm):
        with pytest.raises(FileNotFoundError):
            call(f"gs://{gcs_bucket}/missing")
    with pytest.raises(FileNotFoundError):
        fs.rm(f"gs://{gcs_bucket}/missing", recursive=True)
    with pytest.raises(NotImplementedError, match="appended"):
        fs.open(f"gs://{gcs_bucket}/x", "ab")
    with pytest.raises(ValueError, match="mode"):
        fs.pipe_file(f"gs://{gcs_bucket}/x", b"y", mode="append")
    with pytest.raises(ValueError, match="compression"):
        GCSFileSystem(write=WriteConfig(compression="zstd"), skip_instance_cache=True)
    with pytest.raises(IsADirectoryError):
        fs.open(gcs_bucket, "wb")
    assert gcs_emulator.read(gcs_bucket, "x") == b"x"


@pytest.mark.parametrize("bad", [None, 7, b"gs://bucket/x", 1.5], ids=["None", "int", "bytes", "float"])
def test_a_path_that_is_not_text_is_refused_at_once(gcs_emulator: Emulator, gcs_bucket: str, bad: object) -> None:
    """Every call refuses it with a TypeError saying what a path must be, before any request: nothing
    named beside it is read, written or deleted."""
    fs = filesystem(gcs_emulator)
    gcs_emulator.upload(gcs_bucket, "keep", b"kept")
    keep = f"gs://{gcs_bucket}/keep"
    calls = {
        "info": lambda: fs.info(bad),
        "exists": lambda: fs.exists(bad),
        "ls": lambda: fs.ls(bad),
        "find": lambda: fs.find(bad),
        "glob": lambda: fs.glob(bad),
        "cat": lambda: fs.cat(bad),
        "cat_file": lambda: fs.cat_file(bad),
        "open": lambda: fs.open(bad),
        "open_wb": lambda: fs.open(bad, "wb"),
        "pipe": lambda: fs.pipe(bad, b"x"),
        "pipe_dict": lambda: fs.pipe({f"gs://{gcs_bucket}/new": b"x", bad: b"y"}),
        "rm": lambda: fs.rm(bad),
        "rm_list": lambda: fs.rm([keep, bad]),
        "cp": lambda: fs.cp(keep, bad),
        "get": lambda: fs.get(bad, "/tmp/never-written"),
        "put": lambda: fs.put(__file__, bad),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"a GCS path must be a str") as info:
            call()
        assert type(bad).__name__ in str(info.value), name
    assert gcs_emulator.names(gcs_bucket) == ["keep"] and gcs_emulator.read(gcs_bucket, "keep") == b"kept"
    assert not os.path.exists("/tmp/never-written")


def test_cat_of_an_object_read_in_ranges_is_checked_whole(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    """``cat`` assembles the ranges in one buffer: a damaged range is read again, damage that stays raises."""
    data = random_bytes(3 * MiB + 5)
    gcs_emulator.upload(gcs_bucket, "ranged", data)
    retry = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)
    fs = filesystem(gcs_front, transfer=TransferConfig(part_size=MiB), retry=retry)
    gcs_front.set_faults([Fault("corrupt", match="range_get", times=1)])
    assert fs.cat(f"gs://{gcs_bucket}/ranged") == data and fs.stats.retries == 1
    gcs_front.set_faults([Fault("corrupt", match="range_get")])
    with pytest.raises(IntegrityError, match="crc32c"):
        fs.cat(f"gs://{gcs_bucket}/ranged")


@pytest.fixture
def registered(gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``register()`` with the emulator as the default endpoint; fsspec's table and the environment as
    they were afterwards."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    monkeypatch.setenv(VARIABLE, "1")  # what register() sets for child processes, undone afterwards
    before = {protocol: _registry.get(protocol) for protocol in ("gs", "gcs")}
    register()
    try:
        yield
    finally:
        for protocol, handler in before.items():
            if handler is None:
                _registry.pop(protocol, None)
            else:
                _registry[protocol] = handler
        GCSFileSystem.clear_instance_cache()


def test_registered_it_serves_gs_urls_with_default_settings(
    registered: None, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    with fsspec.open(f"gs://{gcs_bucket}/notes.txt", "w") as f:
        f.write("through fsspec.open")
    fs, path = fsspec.url_to_fs(f"gcs://{gcs_bucket}/notes.txt")
    assert isinstance(fs, GCSFileSystem) and path == f"{gcs_bucket}/notes.txt"
    assert gcs_emulator.read(gcs_bucket, "notes.txt") == b"through fsspec.open"
    with fsspec.open(f"gs://{gcs_bucket}/notes.txt", "rt") as f:
        assert f.read() == "through fsspec.open"


def test_asynchronous_use_from_another_event_loop(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    async def main() -> tuple[bytes, list[str]]:
        fs = GCSFileSystem(client=gcs_emulator.client_config, asynchronous=True, skip_instance_cache=True)
        await asyncio.gather(*(fs._pipe_file(f"{gcs_bucket}/async/{i}", bytes([i]) * 3) for i in range(5)))
        return await fs._cat_file(f"{gcs_bucket}/async/3"), await fs._ls(f"{gcs_bucket}/async", detail=False)

    data, listed = asyncio.run(main())
    assert data == b"\x03\x03\x03" and listed == [f"{gcs_bucket}/async/{i}" for i in range(5)]


class Files(Dataset[bytes]):
    def __init__(self, fs: GCSFileSystem, paths: list[str]) -> None:
        self.fs, self.paths = fs, paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> bytes:
        with self.fs.open(self.paths[index], "rb") as f:
            return f.read()


def test_workers_use_a_filesystem_made_before_the_fork(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {f"w/{i:02d}": random_bytes(1000 + i, seed=i) for i in range(12)}
    gcs_emulator.seed(gcs_bucket, objects)
    fs = filesystem(gcs_emulator)
    paths = fs.find(f"{gcs_bucket}/w")  # the parent has used it, so its I/O loop is running
    assert pickle.loads(pickle.dumps(fs)).ls(f"{gcs_bucket}/w", detail=False) == paths
    loaded = list(DataLoader(Files(fs, paths), batch_size=None, num_workers=2, multiprocessing_context="fork"))
    assert loaded == [objects[p.split("/", 1)[1]] for p in paths]
