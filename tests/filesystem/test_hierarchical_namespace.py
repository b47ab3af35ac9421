"""Buckets with a hierarchical namespace: folders are resources there, and outlive their objects. The
filesystem sees empty folders as directories (``ls``, ``info``, ``isdir``, ``exists``) through listings
alone (``storage.objects.list``, which object roles hold), and lists a flat bucket as before; the GCS
front keeps folders as GCS does, and refuses what GCS refuses."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def hns_front(gcs_emulator: Emulator, gcs_bucket: str) -> Iterator[GCSFront]:
    """A front that gives ``gcs_bucket`` a hierarchical namespace, and records what is sent."""
    with GCSFront(gcs_emulator.endpoint, hierarchical=[gcs_bucket], record=True) as running:
        yield running


def call(front: GCSFront, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """Send one JSON API request through the front; its status and decoded answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{front.endpoint}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = response.read()
            return response.status, json.loads(payload) if payload else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def make_empty_folder(front: GCSFront, emulator: Emulator, bucket: str) -> None:
    """``logs/empty/`` made by folders.insert, and ``logs/left/`` left behind by its deleted object."""
    assert call(front, "POST", f"/storage/v1/b/{bucket}/folders", {"name": "logs/empty/"})[0] == 404  # no parent
    assert call(front, "POST", f"/storage/v1/b/{bucket}/folders?recursive=true", {"name": "logs/empty/"})[0] == 200
    emulator.upload(bucket, "logs/a.txt", b"a")
    emulator.upload(bucket, "logs/left/gone.txt", b"gone")
    assert call(front, "DELETE", f"/storage/v1/b/{bucket}/o/{quote('logs/left/gone.txt', safe='')}")[0] == 204


def filesystem(front: GCSFront) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, skip_instance_cache=True)


def test_empty_folders_are_listed_as_directories(gcs_emulator: Emulator, hns_front: GCSFront, gcs_bucket: str) -> None:
    make_empty_folder(hns_front, gcs_emulator, gcs_bucket)
    fs = filesystem(hns_front)
    assert fs.ls(f"gs://{gcs_bucket}/logs", detail=False) == [
        f"{gcs_bucket}/logs/a.txt",
        f"{gcs_bucket}/logs/empty",
        f"{gcs_bucket}/logs/left",
    ]
    entries = {entry["name"]: entry["type"] for entry in fs.ls(f"gs://{gcs_bucket}/logs", detail=True)}
    assert entries[f"{gcs_bucket}/logs/empty"] == entries[f"{gcs_bucket}/logs/left"] == "directory"
    assert fs.ls(f"gs://{gcs_bucket}/logs/empty") == []  # an empty directory, not a missing one


def test_an_empty_folder_is_a_directory_that_exists(
    gcs_emulator: Emulator, hns_front: GCSFront, gcs_bucket: str
) -> None:
    make_empty_folder(hns_front, gcs_emulator, gcs_bucket)
    fs = filesystem(hns_front)
    for folder in ("logs/empty", "logs/empty/", "logs/left"):
        assert fs.info(f"gs://{gcs_bucket}/{folder}") == {
            "name": f"{gcs_bucket}/{folder.rstrip('/')}",
            "type": "directory",
            "size": 0,
        }
        assert fs.isdir(f"gs://{gcs_bucket}/{folder}") and fs.exists(f"gs://{gcs_bucket}/{folder}")
    assert not fs.exists(f"gs://{gcs_bucket}/logs/emp")  # a name's start is no folder
    assert not fs.exists(f"gs://{gcs_bucket}/logs/nothing")
    with pytest.raises(FileNotFoundError):
        fs.info(f"gs://{gcs_bucket}/logs/nothing")


def test_folders_are_found_with_object_permissions_only(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    with GCSFront(gcs_emulator.endpoint, hierarchical=[gcs_bucket], object_only=True, record=True) as front:
        make_empty_folder(front, gcs_emulator, gcs_bucket)
        fs = filesystem(front)
        front.reset_counts()
        assert fs.isdir(f"gs://{gcs_bucket}/logs/empty")
        assert f"{gcs_bucket}/logs/empty" in fs.ls(f"gs://{gcs_bucket}/logs", detail=False)
        assert dict(front.counts) == {"metadata": 1, "list": 2}, "an object GET and listings; no folders.get"


def test_listings_ask_for_folders_and_a_flat_bucket_costs_nothing_more(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"d/a.txt": b"a", "d/sub/b.txt": b"b"})
    fs = filesystem(gcs_front)
    gcs_front.reset_counts()
    assert fs.ls(f"gs://{gcs_bucket}/d", detail=False) == [f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/sub"]
    assert dict(gcs_front.counts) == {"list": 1}
    fs.invalidate_cache()  # else the listing just made answers what follows
    gcs_front.reset_counts()
    assert fs.isdir(f"gs://{gcs_bucket}/d/sub") and not fs.exists(f"gs://{gcs_bucket}/d/su")
    assert dict(gcs_front.counts) == {"metadata": 2, "list": 2}, "an object GET and one listing each, as before"


def test_every_listing_with_a_delimiter_asks_for_folders(
    hns_front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"d/a.txt": b"a"})
    fs = filesystem(hns_front)
    fs.ls(f"gs://{gcs_bucket}/d")
    fs.info(f"gs://{gcs_bucket}/d")
    listings = [r.target for r in hns_front.recorded if r.target.startswith(f"/storage/v1/b/{gcs_bucket}/o?")]
    assert listings and all("delimiter=%2F" in t and "includeFoldersAsPrefixes=true" in t for t in listings)


def listing(front: GCSFront, bucket: str, **params: str) -> tuple[int, Any]:
    return call(front, "GET", f"/storage/v1/b/{bucket}/o?{urlencode(params)}")


def test_the_front_names_folders_only_when_asked(gcs_emulator: Emulator, hns_front: GCSFront, gcs_bucket: str) -> None:
    make_empty_folder(hns_front, gcs_emulator, gcs_bucket)
    status, page = listing(hns_front, gcs_bucket, prefix="logs/", delimiter="/")
    assert status == 200 and page.get("prefixes") is None, "without the parameter GCS leaves empty folders out"
    status, page = listing(hns_front, gcs_bucket, prefix="logs/", delimiter="/", includeFoldersAsPrefixes="true")
    assert status == 200 and page["prefixes"] == ["logs/empty/", "logs/left/"]
    assert [item["name"] for item in page["items"]] == ["logs/a.txt"]
    status, page = listing(
        hns_front, gcs_bucket, prefix="logs/", delimiter="/", includeFoldersAsPrefixes="true", maxResults="2"
    )
    assert [item["name"] for item in page["items"]] == ["logs/a.txt"] and page["prefixes"] == ["logs/empty/"]
    token = page["nextPageToken"]
    status, page = listing(
        hns_front, gcs_bucket, prefix="logs/", delimiter="/", includeFoldersAsPrefixes="true", pageToken=token
    )
    assert page == {"kind": "storage#objects", "prefixes": ["logs/left/"]}


def test_the_front_refuses_what_gcs_refuses(gcs_emulator: Emulator, hns_front: GCSFront, gcs_bucket: str) -> None:
    for params in ({"includeFoldersAsPrefixes": "true"}, {"includeFoldersAsPrefixes": "true", "delimiter": "-"}):
        status, answer = listing(hns_front, gcs_bucket, **params)
        assert status == 400 and "delimiter" in answer["error"]["message"]
    make_empty_folder(hns_front, gcs_emulator, gcs_bucket)
    folder = f"/storage/v1/b/{gcs_bucket}/folders/{quote('logs/empty/', safe='')}"
    status, resource = call(hns_front, "GET", folder)
    assert status == 200 and resource["name"] == "logs/empty/" and resource["kind"] == "storage#folder"
    assert call(hns_front, "GET", f"/storage/v1/b/{gcs_bucket}/folders/{quote('logs/none/', safe='')}")[0] == 404
    assert call(hns_front, "POST", f"/storage/v1/b/{gcs_bucket}/folders", {"name": "logs/empty/"})[0] == 409
    assert call(hns_front, "DELETE", f"/storage/v1/b/{gcs_bucket}/folders/{quote('logs/', safe='')}")[0] == 409
    assert call(hns_front, "DELETE", folder)[0] == 204
    assert call(hns_front, "GET", folder)[0] == 404
    layout = call(hns_front, "GET", f"/storage/v1/b/{gcs_bucket}/storageLayout")[1]
    assert layout["hierarchicalNamespace"] == {"enabled": True}


def test_a_flat_bucket_has_no_folders_resource(gcs_front: GCSFront, gcs_bucket: str) -> None:
    status, answer = call(gcs_front, "GET", f"/storage/v1/b/{gcs_bucket}/folders/{quote('a/', safe='')}")
    assert status == 400 and "hierarchical namespace" in answer["error"]["message"]
    layout = call(gcs_front, "GET", f"/storage/v1/b/{gcs_bucket}/storageLayout")[1]
    assert layout["hierarchicalNamespace"] == {"enabled": False}


def folder_exists(front: GCSFront, bucket: str, folder: str) -> bool:
    return call(front, "GET", f"/storage/v1/b/{bucket}/folders/{quote(folder, safe='')}")[0] == 200


def test_removing_a_directory_removes_its_folders(gcs_emulator: Emulator, hns_front: GCSFront, gcs_bucket: str) -> None:
    make_empty_folder(hns_front, gcs_emulator, gcs_bucket)
    gcs_emulator.seed(gcs_bucket, {"logs/deep/er/c.txt": b"c", "keep/d.txt": b"d"})
    fs = filesystem(hns_front)
    fs.rm(f"gs://{gcs_bucket}/logs", recursive=True)
    assert not fs.exists(f"gs://{gcs_bucket}/logs")
    assert fs.ls(f"gs://{gcs_bucket}", detail=False) == [f"{gcs_bucket}/keep"]
    for folder in ("logs/", "logs/empty/", "logs/left/", "logs/deep/", "logs/deep/er/"):
        assert not folder_exists(hns_front, gcs_bucket, folder), folder
    assert folder_exists(hns_front, gcs_bucket, "keep/")


def test_removing_an_empty_folder_removes_it(gcs_emulator: Emulator, hns_front: GCSFront, gcs_bucket: str) -> None:
    make_empty_folder(hns_front, gcs_emulator, gcs_bucket)
    fs = filesystem(hns_front)
    fs.rm(f"gs://{gcs_bucket}/logs/empty", recursive=True)  # nothing but a folder: removed, no FileNotFoundError
    assert not fs.exists(f"gs://{gcs_bucket}/logs/empty") and fs.exists(f"gs://{gcs_bucket}/logs/left")


def test_folders_that_may_not_be_deleted_stay_with_a_warning(
    gcs_emulator: Emulator, gcs_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    refused = Fault("http_403", match=r"^DELETE /storage/v1/b/[^/]+/folders/")
    with GCSFront(gcs_emulator.endpoint, hierarchical=[gcs_bucket], faults=[refused]) as front:
        gcs_emulator.seed(gcs_bucket, {"run/a.txt": b"a"})
        fs = filesystem(front)
        fs.rm(f"gs://{gcs_bucket}/run", recursive=True)
        assert gcs_emulator.names(gcs_bucket) == [] and fs.ls(f"gs://{gcs_bucket}/run") == []
    assert "the objects under gs://" in caplog.text and "its empty folders stay" in caplog.text


def test_removing_from_a_flat_bucket_costs_one_listing_more(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"run/a.txt": b"a", "run/sub/b.txt": b"b"})
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        filesystem(front).rm(f"gs://{gcs_bucket}/run", recursive=True)
        targets = [r.target for r in front.recorded]
    assert gcs_emulator.names(gcs_bucket) == []
    assert not [t for t in targets if "/folders" in t or "storageLayout" in t]
    checks = [t for t in targets if "includeFoldersAsPrefixes" in t]
    assert len(checks) == 1, "one listing more: is anything left in run/?"


def test_removing_to_a_depth_leaves_the_folders_of_what_stays(
    gcs_emulator: Emulator, hns_front: GCSFront, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"logs/a.txt": b"a", "logs/deep/er/c.txt": b"c"})
    fs = filesystem(hns_front)
    fs.rm(f"gs://{gcs_bucket}/logs", recursive=True, maxdepth=1)  # no folder is deleted: none would be empty
    assert gcs_emulator.names(gcs_bucket) == ["logs/deep/er/c.txt"]
    assert folder_exists(hns_front, gcs_bucket, "logs/deep/er/")
