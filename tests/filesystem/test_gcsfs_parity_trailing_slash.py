"""A trailing ``/`` is kept as gcsfs keeps it, over HTTP to the emulator: written, ``x/`` is the object ``x/``
(a folder's placeholder), never ``x``; read, it names a directory, never the object ``x``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import fsspec
import pytest
from fsspec.registry import _registry

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fs(gcs_emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)


@pytest.fixture
def front_fs(gcs_emulator: Emulator) -> Iterator[GCSFileSystem]:
    """Through the front, which answers the storage layout a recursive ``rm`` asks for (the emulator lacks it)."""
    with GCSFront(gcs_emulator.endpoint) as front:
        yield GCSFileSystem(client=front.client_config, skip_instance_cache=True)


def _open_and_close(fs: GCSFileSystem, path: str) -> None:
    with fs.open(path, "wb"):
        pass


def _fsspec_open(fs: GCSFileSystem, path: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(_registry, "gs", GCSFileSystem)  # as register() makes it, undone afterwards
        with fsspec.open(path, "wb", client=fs.client, skip_instance_cache=True) as f:
            f.write(b"")


WRITERS: dict[str, Callable[[GCSFileSystem, str], None]] = {
    "touch": lambda fs, path: fs.touch(path),
    "pipe": lambda fs, path: fs.pipe(path, b""),
    "pipe_file": lambda fs, path: fs.pipe_file(path, b""),
    "open": _open_and_close,
    "fsspec.open": _fsspec_open,
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_write_to_a_path_ending_in_slash_makes_that_object(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str, writer: str
) -> None:
    WRITERS[writer](fs, f"gs://{gcs_bucket}/made/")
    assert gcs_emulator.names(gcs_bucket) == ["made/"]
    assert fs.info(f"gs://{gcs_bucket}/made") == {"name": f"{gcs_bucket}/made", "type": "directory", "size": 0}
    assert fs.ls(f"gs://{gcs_bucket}", detail=False) == [f"{gcs_bucket}/made"]


def test_a_path_ending_in_slash_never_names_the_object_without_it(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe_file(f"gs://{gcs_bucket}/f.txt", b"data")
    assert fs.exists(f"gs://{gcs_bucket}/f.txt") and not fs.exists(f"gs://{gcs_bucket}/f.txt/")
    assert not fs.isfile(f"gs://{gcs_bucket}/f.txt/") and not fs.isdir(f"gs://{gcs_bucket}/f.txt/")
    with pytest.raises(FileNotFoundError):
        fs.info(f"gs://{gcs_bucket}/f.txt/")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"gs://{gcs_bucket}/f.txt/")


def test_rm_of_a_path_ending_in_slash_removes_that_placeholder(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.upload(gcs_bucket, "empty/", b"")  # as the console makes a folder
    gcs_emulator.upload(gcs_bucket, "empty.txt", b"kept")
    fs.rm(f"gs://{gcs_bucket}/empty/")
    assert gcs_emulator.names(gcs_bucket) == ["empty.txt"] and not fs.exists(f"gs://{gcs_bucket}/empty")


def test_a_recursive_rm_removes_the_placeholders_below(
    front_fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    front_fs.touch(f"gs://{gcs_bucket}/empty/")
    front_fs.rm(f"gs://{gcs_bucket}/empty", recursive=True)  # an empty directory, made as gcsfs makes one
    front_fs.pipe({f"{gcs_bucket}/d/a.txt": b"a", f"{gcs_bucket}/d/sub/": b"", f"{gcs_bucket}/d/sub/deep/": b""})
    front_fs.rm(f"gs://{gcs_bucket}/d", recursive=True)
    assert gcs_emulator.names(gcs_bucket) == [] and not front_fs.exists(f"gs://{gcs_bucket}/d")
