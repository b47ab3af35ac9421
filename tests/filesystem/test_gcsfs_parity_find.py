"""``find`` as gcsfs's, over HTTP to the emulator through a ``GCSFront`` that counts requests: with
``withdirs=True`` it names the directories below a bucket, never the bucket itself (so ``rm(find(bucket,
withdirs=True))`` empties it), and a whole listing fills the listings cache, as if each directory under the
path had been listed, so ``ls``, ``info`` and ``exists`` there ask GCS nothing more."""

from __future__ import annotations

from typing import Any

import pytest

from tests.filesystem.test_hierarchical_namespace import make_empty_folder
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)


def _fs(front: GCSFront, **options: Any) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, skip_instance_cache=True, **options)


def _seed(fs: GCSFileSystem, bucket: str) -> None:
    fs.pipe(
        {
            f"{bucket}/top.txt": b"top",
            f"{bucket}/d/a.txt": b"alpha",
            f"{bucket}/d/sub/b.txt": b"b",
            f"{bucket}/d/sub/deeper/c.txt": b"c",
            f"{bucket}/other/x.txt": b"x",
        }
    )


def test_find_with_dirs_of_a_bucket_names_its_directories_but_not_the_bucket(front: GCSFront, gcs_bucket: str) -> None:
    fs = _fs(front)
    _seed(fs, gcs_bucket)
    found = fs.find(gcs_bucket, withdirs=True)
    assert gcs_bucket not in found
    assert found == sorted(
        f"{gcs_bucket}/{name}"
        for name in ["top.txt", "d", "d/a.txt", "d/sub", "d/sub/b.txt", "d/sub/deeper", "d/sub/deeper/c.txt",
                     "other", "other/x.txt"]
    )  # fmt: skip
    assert fs.find(f"gs://{gcs_bucket}/d", withdirs=True, maxdepth=1) == [
        f"{gcs_bucket}/d",
        f"{gcs_bucket}/d/a.txt",
        f"{gcs_bucket}/d/sub",
    ]
    fs.rm(found)  # what gcsfs's users do to empty a bucket
    assert fs.find(gcs_bucket) == [] and fs.exists(gcs_bucket)


@pytest.mark.parametrize("path", ["{bucket}", "gs://{bucket}/d", "{bucket}/d/"])
def test_find_fills_the_listing_of_every_directory_under_the_path(front: GCSFront, gcs_bucket: str, path: str) -> None:
    fs, fresh = _fs(front), _fs(front)
    _seed(fs, gcs_bucket)
    fs.invalidate_cache()
    fs.find(path.format(bucket=gcs_bucket))
    top = path.format(bucket=gcs_bucket).removeprefix("gs://").rstrip("/")
    cached = sorted(key for key in fs.dircache if key == top or key.startswith(f"{top}/"))
    assert cached == sorted(key for key in [gcs_bucket, f"{gcs_bucket}/d", f"{gcs_bucket}/d/sub",
                                            f"{gcs_bucket}/d/sub/deeper", f"{gcs_bucket}/other"]
                            if key == top or key.startswith(f"{top}/"))  # fmt: skip
    assert all(not key.startswith(f"{top}/") and key != top for key in set(fs.dircache) - set(cached))
    front.reset_counts()
    for key in cached:  # each listing as GCS gives it to a filesystem that never listed
        assert fs.ls(key, detail=True) == fresh.ls(key, detail=True)
        asked = sum(front.counts.values())
        assert fs.exists(f"{key}/missing.txt") is False and (key == top or fs.isdir(key))  # top: its parent asks
        assert sum(front.counts.values()) == asked
    assert fs.info(f"{gcs_bucket}/d/sub/b.txt")["size"] == 1


def test_find_that_is_partial_fills_no_listing(front: GCSFront, gcs_bucket: str) -> None:
    """With a prefix, a glob or one object, the names found are not a whole directory's."""
    fs = _fs(front)
    _seed(fs, gcs_bucket)
    fs.invalidate_cache()
    fs.find(f"{gcs_bucket}/d", prefix="su")
    fs.find(f"{gcs_bucket}/d/a.txt")
    fs.glob(f"{gcs_bucket}/d/*.txt")
    assert f"{gcs_bucket}/d/sub" not in fs.dircache and f"{gcs_bucket}/d" not in fs.dircache


def test_find_in_a_hierarchical_namespace_fills_no_listing(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """An empty folder holds no object, so a listing of objects would miss it: such listings stay GCS's."""
    with GCSFront(gcs_emulator.endpoint, hierarchical=[gcs_bucket]) as front:
        make_empty_folder(front, gcs_emulator, gcs_bucket)
        fs = _fs(front)
        assert fs.find(f"{gcs_bucket}/logs") == [f"{gcs_bucket}/logs/a.txt"]
        assert f"{gcs_bucket}/logs" not in fs.dircache
        assert fs.ls(f"{gcs_bucket}/logs") == [
            f"{gcs_bucket}/logs/a.txt",
            f"{gcs_bucket}/logs/empty",
            f"{gcs_bucket}/logs/left",
        ]
