"""The listings cache as gcsfs keeps it, over HTTP to the emulator through a ``GCSFront`` that counts requests:
``ls`` lists a directory once and ``info``/``exists`` answer from the cached listing of the parent, ``refresh``
lists anew, writes and deletes through the filesystem drop what they change, and listings expire as told.
And ``find(prefix=)``: GCS selects the names (its ``prefix`` parameter)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.filesystem.test_hierarchical_namespace import call, make_empty_folder
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)


def _fs(front: GCSFront, **options: Any) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, skip_instance_cache=True, **options)


def _lists(front: GCSFront) -> int:
    return front.counts["list"]


def test_ls_lists_once_and_info_exists_answer_from_the_listing(front: GCSFront, gcs_bucket: str) -> None:
    fs = _fs(front)
    fs.pipe({f"{gcs_bucket}/d/a.txt": b"alpha", f"{gcs_bucket}/d/sub/b.txt": b"b"})
    front.reset_counts()
    listing = fs.ls(f"gs://{gcs_bucket}/d", detail=True)
    assert [entry["name"] for entry in listing] == [f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/sub"]
    assert fs.ls(f"gs://{gcs_bucket}/d") == [f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/sub"]
    assert _lists(front) == 1 and f"{gcs_bucket}/d" in fs.dircache
    asked = sum(front.counts.values())
    assert fs.info(f"gs://{gcs_bucket}/d/a.txt")["size"] == 5 and fs.isdir(f"{gcs_bucket}/d/sub")
    assert not fs.exists(f"{gcs_bucket}/d/missing.txt")
    with pytest.raises(FileNotFoundError, match="cached listing"):
        fs.info(f"{gcs_bucket}/d/missing.txt")
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{gcs_bucket}/d/missing")
    assert fs.ls(f"{gcs_bucket}/d/a.txt") == [f"{gcs_bucket}/d/a.txt"]  # a file lists as itself
    assert sum(front.counts.values()) == asked  # all of it from the one listing
    listing[0]["size"] = -1  # what a caller does with its copy leaves the cache alone
    assert fs.info(f"{gcs_bucket}/d/a.txt")["size"] == 5
    fs.ls(f"{gcs_bucket}/d", refresh=True)
    assert _lists(front) == 2


def test_another_writer_shows_after_refresh_expiry_or_invalidation(front: GCSFront, gcs_bucket: str) -> None:
    """What another process writes may be stale until then, as with gcsfs; reads always see the live object."""
    fs, other = _fs(front), _fs(front)
    fs.pipe_file(f"{gcs_bucket}/d/a.txt", b"alpha")
    assert fs.ls(f"{gcs_bucket}/d") == [f"{gcs_bucket}/d/a.txt"]
    other.pipe({f"{gcs_bucket}/d/new.txt": b"n", f"{gcs_bucket}/d/a.txt": b"replaced, longer"})
    assert fs.ls(f"{gcs_bucket}/d") == [f"{gcs_bucket}/d/a.txt"] and not fs.exists(f"{gcs_bucket}/d/new.txt")
    assert fs.size(f"{gcs_bucket}/d/a.txt") == 5  # the cached listing's
    assert fs.cat_file(f"{gcs_bucket}/d/a.txt") == b"replaced, longer"
    assert fs.cat_file(f"{gcs_bucket}/d/a.txt", start=0, end=8) == b"replaced"  # the live version's size
    with fs.open(f"{gcs_bucket}/d/a.txt", "rb") as f:
        assert f.read() == b"replaced, longer"
    assert fs.ls(f"{gcs_bucket}/d", refresh=True) == [f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/new.txt"]
    other.rm_file(f"{gcs_bucket}/d/new.txt")
    assert fs.exists(f"{gcs_bucket}/d/new.txt")
    fs.invalidate_cache(f"gs://{gcs_bucket}/d/new.txt")  # the path and its parents
    assert not fs.exists(f"{gcs_bucket}/d/new.txt") and fs.size(f"{gcs_bucket}/d/a.txt") == 16


def test_invalidating_a_directory_drops_the_listings_under_it(front: GCSFront, gcs_bucket: str) -> None:
    fs, other = _fs(front), _fs(front)
    fs.pipe_file(f"{gcs_bucket}/d/sub/a.txt", b"a")
    assert fs.ls(f"{gcs_bucket}/d/sub") == [f"{gcs_bucket}/d/sub/a.txt"]
    other.pipe_file(f"{gcs_bucket}/d/sub/b.txt", b"b")
    assert fs.ls(f"{gcs_bucket}/d/sub") == [f"{gcs_bucket}/d/sub/a.txt"]  # cached
    fs.invalidate_cache(f"{gcs_bucket}/d")
    assert fs.ls(f"{gcs_bucket}/d/sub") == [f"{gcs_bucket}/d/sub/a.txt", f"{gcs_bucket}/d/sub/b.txt"]
    other.pipe_file(f"{gcs_bucket}/d/sub/c.txt", b"c")
    fs.invalidate_cache()
    assert fs.ls(f"{gcs_bucket}/d/sub")[-1] == f"{gcs_bucket}/d/sub/c.txt"


def test_folders_of_a_hierarchical_namespace_are_cached_and_dropped_when_removed(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """An empty folder is a directory of its parent's listing; removing the tree drops the listings of
    folders that held no object too."""
    with GCSFront(gcs_emulator.endpoint, hierarchical=[gcs_bucket]) as front:
        make_empty_folder(front, gcs_emulator, gcs_bucket)
        assert call(front, "POST", f"/storage/v1/b/{gcs_bucket}/folders", {"name": "logs/empty/inner/"})[0] == 200
        fs = _fs(front)
        assert fs.ls(f"{gcs_bucket}/logs/empty") == [f"{gcs_bucket}/logs/empty/inner"]
        assert fs.ls(f"{gcs_bucket}/logs")[1:] == [f"{gcs_bucket}/logs/empty", f"{gcs_bucket}/logs/left"]
        asked = sum(front.counts.values())
        assert fs.isdir(f"{gcs_bucket}/logs/empty") and fs.ls(f"{gcs_bucket}/logs/empty/inner") == []
        assert sum(front.counts.values()) == asked + 1  # the empty folder's own listing only
        fs.rm(f"{gcs_bucket}/logs", recursive=True)
        assert not fs.exists(f"{gcs_bucket}/logs") and not fs.exists(f"{gcs_bucket}/logs/empty")
        with pytest.raises(FileNotFoundError):
            fs.ls(f"{gcs_bucket}/logs/empty")


def _make(fs: GCSFileSystem, tmp_path: Path, bucket: str) -> dict[str, Callable[[], None]]:
    """Each way the filesystem writes or deletes, by name (what ``d/`` holds after each: ``AFTER``)."""
    local = tmp_path / "local.txt"
    local.write_bytes(b"local")

    def text() -> None:
        with fs.open(f"{bucket}/d/new.txt", "w") as f:
            f.write("text")

    def binary() -> None:
        with fs.open(f"{bucket}/d/new.txt", "wb") as f:
            f.write(b"bytes")

    def transaction() -> None:
        with fs.transaction, fs.open(f"{bucket}/d/new.txt", "wb") as f:
            f.write(b"staged")

    return {
        "pipe": lambda: fs.pipe_file(f"{bucket}/d/new.txt", b"new"),
        "put": lambda: fs.put_file(str(local), f"{bucket}/d/new.txt"),
        "open_wb": binary,
        "open_w": text,
        "transaction": transaction,
        "touch": lambda: fs.touch(f"{bucket}/d/new.txt"),
        "cp": lambda: fs.cp_file(f"{bucket}/d/a.txt", f"{bucket}/d/new.txt"),
        "mv": lambda: fs.mv(f"{bucket}/d/a.txt", f"{bucket}/d/new.txt"),
        "mv_file": lambda: fs.mv_file(f"{bucket}/d/a.txt", f"{bucket}/d/new.txt"),
        "merge": lambda: fs.merge(f"{bucket}/d/new.txt", [f"{bucket}/d/a.txt", f"{bucket}/d/sub/b.txt"]),
        "rm_file": lambda: fs.rm_file(f"{bucket}/d/a.txt"),
        "rm": lambda: fs.rm([f"{bucket}/d/a.txt", f"{bucket}/d/sub/b.txt"]),
        "rm_recursive": lambda: fs.rm(f"{bucket}/d/sub", recursive=True),
    }


AFTER = {
    "pipe": ["a.txt", "new.txt", "sub"],
    "put": ["a.txt", "new.txt", "sub"],
    "open_wb": ["a.txt", "new.txt", "sub"],
    "open_w": ["a.txt", "new.txt", "sub"],
    "transaction": ["a.txt", "new.txt", "sub"],
    "touch": ["a.txt", "new.txt", "sub"],
    "cp": ["a.txt", "new.txt", "sub"],
    "mv": ["new.txt", "sub"],
    "mv_file": ["new.txt", "sub"],
    "merge": ["a.txt", "new.txt", "sub"],
    "rm_file": ["sub"],
    "rm": [],
    "rm_recursive": ["a.txt"],
}


@pytest.mark.parametrize("change", sorted(AFTER))
def test_own_writes_and_deletes_never_leave_a_stale_listing(
    front: GCSFront, gcs_bucket: str, tmp_path: Path, change: str
) -> None:
    fs = _fs(front)
    fs.pipe({f"{gcs_bucket}/d/a.txt": b"alpha", f"{gcs_bucket}/d/sub/b.txt": b"b"})
    for level in (gcs_bucket, f"{gcs_bucket}/d", f"{gcs_bucket}/d/sub"):
        fs.ls(level)
    lists = _lists(front)
    assert fs.ls(f"{gcs_bucket}/d") == [f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/sub"] and _lists(front) == lists
    _make(fs, tmp_path, gcs_bucket)[change]()
    expected = [f"{gcs_bucket}/d/{name}" for name in AFTER[change]]
    if expected:
        assert fs.ls(f"{gcs_bucket}/d") == expected
    else:
        assert not fs.exists(f"{gcs_bucket}/d")
    assert fs.ls(gcs_bucket) == ([f"{gcs_bucket}/d"] if expected else [])
    for name in ("a.txt", "new.txt", "sub"):
        assert fs.exists(f"{gcs_bucket}/d/{name}") == (name in AFTER[change])
    assert fs.exists(f"{gcs_bucket}/d/sub/b.txt") == (change not in ("rm", "rm_recursive"))


def test_a_listing_made_while_a_writer_is_open_is_not_kept(front: GCSFront, gcs_bucket: str) -> None:
    """The object appears when its writer closes: a listing made before that must not answer after it."""
    fs = _fs(front)
    fs.pipe_file(f"{gcs_bucket}/d/a.txt", b"alpha")
    with fs.open(f"{gcs_bucket}/d/new.txt", "wb") as f:
        f.write(b"new")
        assert fs.ls(f"{gcs_bucket}/d") == [f"{gcs_bucket}/d/a.txt"]
        assert not fs.exists(f"{gcs_bucket}/d/new.txt")
    assert fs.ls(f"{gcs_bucket}/d") == [f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/new.txt"]
    lists = _lists(front)
    assert fs.exists(f"{gcs_bucket}/d/new.txt") and fs.ls(f"{gcs_bucket}/d")[-1] == f"{gcs_bucket}/d/new.txt"
    assert _lists(front) == lists  # once the writer closed, listings are kept again


def test_listings_expire_as_told_and_are_not_kept_when_off(front: GCSFront, gcs_bucket: str) -> None:
    _fs(front).pipe_file(f"{gcs_bucket}/d/a.txt", b"alpha")
    for options in ({"listings_expiry_time": 1.0}, {"cache_timeout": 1.0}):
        fs = _fs(front, **options)
        front.reset_counts()
        fs.ls(f"{gcs_bucket}/d")
        fs.ls(f"{gcs_bucket}/d")
        assert _lists(front) == 1, options
        time.sleep(1.1)
        fs.ls(f"{gcs_bucket}/d")
        assert _lists(front) == 2, options
    for options in ({"use_listings_cache": False}, {"cache_timeout": 0}, {"cache_timeout": -1}):
        fs = _fs(front, **options)
        front.reset_counts()
        fs.ls(f"{gcs_bucket}/d")
        fs.ls(f"{gcs_bucket}/d")
        assert _lists(front) == 2 and f"{gcs_bucket}/d" not in fs.dircache, options
    never = _fs(front, cache_timeout=None)  # gcsfs's default: kept until invalidated
    never.ls(f"{gcs_bucket}/d")
    assert never.dircache.listings_expiry_time is None and f"{gcs_bucket}/d" in never.dircache


def test_cache_timeout_is_refused_beside_listings_expiry_time_or_when_not_seconds() -> None:
    with pytest.raises(TypeError, match="either gcsfs's cache_timeout or fsspec's listings_expiry_time"):
        GCSFileSystem(cache_timeout=5, listings_expiry_time=5, skip_instance_cache=True)
    with pytest.raises(TypeError, match="cache_timeout must be seconds"):
        GCSFileSystem(cache_timeout="5", skip_instance_cache=True)


def _prefixes_listed(front: GCSFront, since: int) -> list[str]:
    return [
        parse_qs(urlsplit(request.target).query).get("prefix", [""])[0]
        for request in front.recorded[since:]
        if request.method == "GET" and urlsplit(request.target).path.endswith("/o")
    ]


def test_find_with_a_prefix_lists_only_the_names_under_path_that_start_with_it(
    front: GCSFront, gcs_bucket: str
) -> None:
    names = ["dir/ab.txt", "dir/abc/x.txt", "dir/abc/deep/y.txt", "dir/b.txt", "dir/xab", "dirab", "other/ab.txt"]
    fs = _fs(front)
    fs.pipe({f"{gcs_bucket}/{name}": b"x" for name in names})
    since = len(front.recorded)
    under = [f"{gcs_bucket}/dir/ab.txt", f"{gcs_bucket}/dir/abc/deep/y.txt", f"{gcs_bucket}/dir/abc/x.txt"]
    assert fs.find(f"gs://{gcs_bucket}/dir", prefix="ab") == under
    assert _prefixes_listed(front, since) == ["dir/ab"]  # GCS selected them
    assert fs.find(f"{gcs_bucket}/dir/", prefix="ab") == under
    assert fs.find(f"{gcs_bucket}/dir", prefix="ab", withdirs=True) == sorted(
        [*under, f"{gcs_bucket}/dir/abc", f"{gcs_bucket}/dir/abc/deep"]
    )
    assert fs.find(f"{gcs_bucket}/dir", prefix="ab", maxdepth=1, withdirs=True) == [
        f"{gcs_bucket}/dir/ab.txt",
        f"{gcs_bucket}/dir/abc",
    ]
    assert list(fs.find(f"{gcs_bucket}/dir", prefix="abc/", detail=True)) == under[1:]
    assert fs.find(gcs_bucket, prefix="dir") == sorted(f"{gcs_bucket}/{name}" for name in names if name[:3] == "dir")
    assert fs.find(f"{gcs_bucket}/dir/b.txt", prefix="a") == []  # a file has nothing under it
    assert fs.find(f"{gcs_bucket}/dir", prefix="zz") == []
    with pytest.raises(TypeError, match="prefix"):
        fs.find(f"{gcs_bucket}/dir", prefix=b"ab")


def test_a_write_keeps_the_listings_it_cannot_change(front: GCSFront, gcs_bucket: str) -> None:
    """As gcsfs keeps them: a listing that names the written object's directory already stays; the directory's
    own listing, and those that do not name the directory below yet, are dropped."""
    fs = _fs(front)
    fs.pipe({f"{gcs_bucket}/d/sub/a.txt": b"a", f"{gcs_bucket}/other/x.txt": b"x"})
    listed = [gcs_bucket, f"{gcs_bucket}/d", f"{gcs_bucket}/d/sub", f"{gcs_bucket}/other"]
    for key in listed:
        fs.ls(key)
    fs.pipe_file(f"{gcs_bucket}/d/sub/new.txt", b"new")
    assert sorted(fs.dircache) == [gcs_bucket, f"{gcs_bucket}/d", f"{gcs_bucket}/other"]
    fs.pipe_file(f"{gcs_bucket}/d/fresh/deeper/f.txt", b"f")  # d did not name fresh: d's listing goes too
    assert sorted(fs.dircache) == [gcs_bucket, f"{gcs_bucket}/other"]
    fresh = _fs(front)
    for key in listed:  # what is kept is what GCS lists
        assert fs.ls(key, detail=True) == fresh.ls(key, detail=True)
    assert fs.ls(f"{gcs_bucket}/d") == [f"{gcs_bucket}/d/fresh", f"{gcs_bucket}/d/sub"]
