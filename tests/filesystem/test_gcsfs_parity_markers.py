"""Folder placeholders (the zero-byte ``name/`` objects the Cloud console's "Create folder" and many tools write)
seen as gcsfs sees them, over HTTP to the emulator: the folder lists itself (``ls`` agrees with ``info``), ``find``
names the placeholder object, ``walk`` and ``glob`` see the folder, whether or not the listings came from GCS or
from what ``find`` kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fs(gcs_emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)


@pytest.fixture
def tree(gcs_emulator: Emulator, gcs_bucket: str) -> str:
    """``base/`` with a placeholder-only folder ``empty/``, a folder with a placeholder and a file ``made/``, a
    folder without one ``plain/``, and a file."""
    base = f"{gcs_bucket}/base"
    gcs_emulator.seed(
        gcs_bucket,
        {
            "base/empty/": b"",
            "base/made/": b"",
            "base/made/in.txt": b"in",
            "base/plain/p.txt": b"p",
            "base/f.txt": b"f",
        },
    )
    return base


def test_a_folder_with_a_placeholder_lists_itself_as_info_describes_it(fs: GCSFileSystem, tree: str) -> None:
    assert fs.ls(f"{tree}/empty", detail=True) == [fs.info(f"{tree}/empty")]
    assert fs.ls(f"gs://{tree}/empty/") == [f"{tree}/empty"]
    assert fs.info(f"{tree}/empty") == {"name": f"{tree}/empty", "type": "directory", "size": 0}
    assert fs.ls(f"{tree}/made") == [f"{tree}/made", f"{tree}/made/in.txt"]
    assert fs.ls(f"{tree}/plain") == [f"{tree}/plain/p.txt"]  # no placeholder: only what it holds
    fs.invalidate_cache()
    assert fs.ls(tree) == [f"{tree}/empty", f"{tree}/f.txt", f"{tree}/made", f"{tree}/plain"]
    assert fs.info(f"{tree}/empty")["type"] == "directory"  # from the cached listing of base


def test_find_names_the_placeholder_objects(fs: GCSFileSystem, tree: str) -> None:
    assert fs.find(tree) == [f"{tree}/{n}" for n in ("empty/", "f.txt", "made/", "made/in.txt", "plain/p.txt")]
    assert fs.find(tree, withdirs=True) == [  # the folder itself first, as fsspec's find names it
        tree,
        *(f"{tree}/{n}" for n in ("empty", "empty/", "f.txt", "made", "made/", "made/in.txt", "plain", "plain/p.txt")),
    ]
    placeholder = fs.find(tree, detail=True)[f"{tree}/empty/"]
    assert (placeholder["type"], placeholder["size"]) == ("file", 0)


def test_the_listings_find_keeps_show_placeholders_as_gcs_listings_do(
    fs: GCSFileSystem, gcs_emulator: Emulator, tree: str
) -> None:
    fresh = GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)
    fs.find(tree)
    for folder in (tree, f"{tree}/empty", f"{tree}/made", f"{tree}/plain"):
        assert folder in fs.dircache
        assert fs.ls(folder, detail=True) == fresh.ls(folder, detail=True)


def test_walk_goes_into_placeholder_folders(fs: GCSFileSystem, tree: str) -> None:
    walked = {root: (sorted(dirs), sorted(files)) for root, dirs, files in fs.walk(tree)}
    assert walked == {
        tree: (["empty", "made", "plain"], ["f.txt"]),
        f"{tree}/empty": ([], [""]),  # fsspec's walk names a listing's entry for the folder itself so
        f"{tree}/made": ([], ["", "in.txt"]),
        f"{tree}/plain": ([], ["p.txt"]),
    }


def test_glob_sees_placeholder_folders(fs: GCSFileSystem, tree: str) -> None:
    assert fs.glob(f"{tree}/*") == [f"{tree}/{n}" for n in ("empty", "f.txt", "made", "plain")]
    assert fs.glob(f"gs://{tree}/e*") == [f"{tree}/empty"]
    assert set(fs.glob(f"{tree}/**")) == {
        tree,
        *(f"{tree}/{n}" for n in ("empty", "empty/", "f.txt", "made", "made/", "made/in.txt", "plain", "plain/p.txt")),
    }


def test_removing_what_find_names_removes_the_placeholders(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str, tree: str
) -> None:
    fs.rm(fs.find(f"{tree}/made"))
    assert not fs.exists(f"{tree}/made")
    fs.rm(f"{tree}", recursive=True)
    assert gcs_emulator.names(gcs_bucket) == []


def test_a_recursive_get_makes_placeholder_folders_local_directories(
    fs: GCSFileSystem, tree: str, tmp_path: Path
) -> None:
    fs.get(tree, str(tmp_path / "out"), recursive=True)
    local = sorted(
        str(p.relative_to(tmp_path / "out")) + ("/" if p.is_dir() else "") for p in (tmp_path / "out").rglob("*")
    )
    assert local == ["empty/", "f.txt", "made/", "made/in.txt", "plain/", "plain/p.txt"]
    assert (tmp_path / "out" / "made" / "in.txt").read_bytes() == b"in"


def test_a_recursive_copy_copies_the_placeholders(fs: GCSFileSystem, gcs_emulator: Emulator, tree: str) -> None:
    bucket = tree.partition("/")[0]
    fs.copy(tree, f"{bucket}/copy", recursive=True)
    assert [n for n in gcs_emulator.names(bucket) if n.startswith("copy/")] == [
        "copy/empty/", "copy/f.txt", "copy/made/", "copy/made/in.txt", "copy/plain/p.txt"
    ]  # fmt: skip


def test_removing_what_find_with_dirs_names_empties_the_tree(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str, tree: str
) -> None:
    """Each placeholder-only folder is named twice there, as a directory and as its placeholder."""
    fs.rm(fs.find(gcs_bucket, withdirs=True))
    assert gcs_emulator.names(gcs_bucket) == [] and fs.find(gcs_bucket, withdirs=True) == []
