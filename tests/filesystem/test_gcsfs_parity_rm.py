"""``rm`` and ``mv`` answer as gcsfs's do, over HTTP to the emulator: ``mv`` of a tree moves every object
(``test_gcsfs_parity_move``), ``rm`` of a glob removes what it matches, and a path that names nothing raises
``FileNotFoundError``; a recursive ``rm`` of a bucket empties it, and leaves it."""

from __future__ import annotations

import pytest

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fs(gcs_emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)


def test_mv_recursive_moves_a_tree_and_leaves_no_source(fs: GCSFileSystem, gcs_bucket: str) -> None:
    tree = {"src/a.txt": b"a", "src/sub/b.txt": b"b", "src/sub/deep/c.txt": b"c"}
    fs.pipe({f"{gcs_bucket}/{name}": data for name, data in tree.items()})
    fs.mv(f"gs://{gcs_bucket}/src", f"gs://{gcs_bucket}/dst", recursive=True)
    moved = {name.replace("src/", "dst/", 1): data for name, data in tree.items()}
    assert fs.cat(sorted(f"{gcs_bucket}/{name}" for name in moved)) == {
        f"{gcs_bucket}/{name}": data for name, data in moved.items()
    }
    assert not fs.exists(f"{gcs_bucket}/src") and fs.find(f"{gcs_bucket}/src") == []


def test_mv_of_one_file_moves_it(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe_file(f"{gcs_bucket}/one.txt", b"1")
    fs.mv(f"{gcs_bucket}/one.txt", f"{gcs_bucket}/two.txt")
    assert fs.cat_file(f"{gcs_bucket}/two.txt") == b"1" and not fs.exists(f"{gcs_bucket}/one.txt")


def test_rm_of_a_glob_removes_its_files_and_skips_its_directories(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe({f"{gcs_bucket}/dir/a.txt": b"a", f"{gcs_bucket}/dir/sub/b.txt": b"b", f"{gcs_bucket}/keep": b"k"})
    fs.rm(f"{gcs_bucket}/dir/*")  # not recursive: the directory it matches stays, as with gcsfs
    assert fs.find(f"{gcs_bucket}") == [f"{gcs_bucket}/dir/sub/b.txt", f"{gcs_bucket}/keep"]
    fs.rm(f"{gcs_bucket}/dir/*", recursive=True)
    assert fs.find(f"{gcs_bucket}") == [f"{gcs_bucket}/keep"]


@pytest.mark.parametrize("recursive", [False, True])
def test_rm_of_a_missing_path_raises_file_not_found(fs: GCSFileSystem, gcs_bucket: str, recursive: bool) -> None:
    fs.pipe_file(f"{gcs_bucket}/there.txt", b"x")
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{gcs_bucket}/missing.txt", recursive=recursive)
    assert fs.exists(f"{gcs_bucket}/there.txt")


def test_rm_of_a_glob_that_matches_nothing_raises_file_not_found(fs: GCSFileSystem, gcs_bucket: str) -> None:
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{gcs_bucket}/nothing/*")


def test_rm_of_a_bucket_is_refused_and_removes_nothing(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe_file(f"{gcs_bucket}/kept.txt", b"x")
    with pytest.raises(IsADirectoryError):
        fs.rm(f"gs://{gcs_bucket}")
    with pytest.raises(FileNotFoundError):
        fs.rm(f"gs://{gcs_bucket}-missing")
    assert fs.cat_file(f"{gcs_bucket}/kept.txt") == b"x"


def test_a_recursive_rm_of_a_bucket_already_empty_removes_nothing_and_raises_nothing(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """The bucket exists, so it names something (gcsfs deletes it there; here ``rmdir`` does)."""
    fs.pipe_file(f"{gcs_bucket}/a/b.txt", b"x")
    fs.rm(f"gs://{gcs_bucket}/*", recursive=True)
    fs.rm(f"gs://{gcs_bucket}", recursive=True)
    assert fs.exists(gcs_bucket) and gcs_emulator.names(gcs_bucket) == []
    with pytest.raises(FileNotFoundError):
        fs.rm(f"gs://{gcs_bucket}/a", recursive=True)  # a prefix that holds nothing names nothing
    with pytest.raises(FileNotFoundError):
        fs.rm(f"gs://{gcs_bucket}-missing", recursive=True)
