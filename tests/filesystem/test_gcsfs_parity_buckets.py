"""Bucket-level calls answer as gcsfs's do, over HTTP through the test front (which answers bucket calls as
GCS does where the emulator does not): ``ls("")`` lists the project's buckets, ``mkdir`` creates one,
``rmdir`` deletes an empty one."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit

import pytest

from torchdata_gcs.fsspec import BucketExistsError, BucketNotEmptyError, GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

pytestmark = pytest.mark.timeout(120)

PROJECT = "parity-project"


@pytest.fixture
def fs(front: GCSFront) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, project=PROJECT, skip_instance_cache=True)


@pytest.fixture
def new_bucket(fs: GCSFileSystem) -> Iterator[str]:
    """A bucket name no bucket has yet; the bucket, if a test makes it, is deleted afterwards."""
    bucket = f"new-{uuid.uuid4().hex[:12]}"
    yield bucket
    if fs.exists(bucket):
        left = fs.find(bucket)
        if left:
            fs.rm(left)
        fs.rmdir(bucket)


def sent(front: GCSFront, method: str, path: str) -> list[tuple[dict[str, str], bytes]]:
    """The query and body of each request ``method path`` the front received."""
    found = []
    for request in front.recorded:
        target = urlsplit(request.target)
        if request.method == method and target.path == path:
            found.append((dict(parse_qsl(target.query)), request.body))
    return found


@pytest.mark.parametrize("root", ["", "gs://", "gcs://"])
def test_ls_of_the_root_lists_the_projects_buckets(
    fs: GCSFileSystem, front: GCSFront, gcs_bucket: str, root: str
) -> None:
    names = fs.ls(root)
    assert gcs_bucket in names and names == sorted(names)
    entry = next(entry for entry in fs.ls(root, detail=True) if entry["name"] == gcs_bucket)
    assert entry["type"] == "directory" and entry["size"] == 0
    assert [query["project"] for query, _ in sent(front, "GET", "/storage/v1/b")] == [PROJECT, PROJECT]


def test_ls_of_the_root_without_a_project_says_it_needs_one(front: GCSFront) -> None:
    fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
    with pytest.raises(ValueError, match="project="):
        fs.ls("")
    assert sent(front, "GET", "/storage/v1/b") == []


def test_mkdir_of_a_bucket_creates_it_in_the_location_asked(
    fs: GCSFileSystem, front: GCSFront, gcs_emulator: Emulator, new_bucket: str
) -> None:
    fs.mkdir(f"gs://{new_bucket}", location="EUROPE-WEST3")
    assert fs.exists(new_bucket) and new_bucket in fs.ls("")
    fs.pipe_file(f"{new_bucket}/a.txt", b"alpha")
    assert gcs_emulator.names(new_bucket) == ["a.txt"]
    [(query, body)] = sent(front, "POST", "/storage/v1/b")
    assert query["project"] == PROJECT and json.loads(body) == {"name": new_bucket, "location": "EUROPE-WEST3"}


def test_mkdir_of_a_bucket_takes_the_default_location(front: GCSFront, new_bucket: str) -> None:
    fs = GCSFileSystem(client=front.client_config, project=PROJECT, default_location="ASIA", skip_instance_cache=True)
    fs.mkdir(new_bucket)
    [(_, body)] = sent(front, "POST", "/storage/v1/b")
    assert json.loads(body) == {"name": new_bucket, "location": "ASIA"} and fs.exists(new_bucket)


def test_mkdir_below_a_missing_bucket_creates_it_only_with_create_parents(
    fs: GCSFileSystem, front: GCSFront, new_bucket: str
) -> None:
    with pytest.raises(FileNotFoundError, match=new_bucket):
        fs.mkdir(f"gs://{new_bucket}/dir")
    assert not fs.exists(new_bucket) and sent(front, "POST", "/storage/v1/b") == []
    fs.mkdir(f"gs://{new_bucket}/dir", create_parents=True)
    assert fs.exists(new_bucket) and fs.ls(new_bucket) == []
    fs.mkdir(f"gs://{new_bucket}/dir", create_parents=True)  # the bucket is there: nothing to make
    fs.mkdir(f"gs://{new_bucket}")
    assert len(sent(front, "POST", "/storage/v1/b")) == 1


def test_mkdir_of_a_bucket_name_taken_elsewhere_raises_file_exists(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    # As GCS answers for a bucket of another project: its objects may not be listed (403), its name is taken (409).
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="list")]) as front:
        fs = GCSFileSystem(client=front.client_config, project=PROJECT, skip_instance_cache=True)
        with pytest.raises(BucketExistsError, match=gcs_bucket) as caught:
            fs.mkdir(gcs_bucket)
    assert isinstance(caught.value, FileExistsError)


def test_rmdir_deletes_an_empty_bucket_and_refuses_one_with_objects(
    fs: GCSFileSystem, gcs_emulator: Emulator, new_bucket: str
) -> None:
    fs.mkdir(new_bucket)
    fs.pipe_file(f"{new_bucket}/kept.txt", b"kept")
    with pytest.raises(BucketNotEmptyError, match="holds objects") as caught:
        fs.rmdir(f"gs://{new_bucket}")
    assert isinstance(caught.value, OSError) and not isinstance(caught.value, FileExistsError)
    assert gcs_emulator.names(new_bucket) == ["kept.txt"]
    fs.rmdir(f"gs://{new_bucket}/kept.txt")  # below a bucket: nothing to delete, as gcsfs does
    fs.rm(f"{new_bucket}/kept.txt")
    fs.rmdir(f"gs://{new_bucket}")
    assert not fs.exists(new_bucket) and new_bucket not in fs.ls("")
    with pytest.raises(FileNotFoundError):
        fs.rmdir(new_bucket)


def test_rmdir_whose_answer_is_lost_finds_the_bucket_deleted(gcs_emulator: Emulator, new_bucket: str) -> None:
    gcs_emulator.create_bucket(new_bucket)
    with GCSFront(gcs_emulator.endpoint, lose_write_answers=True) as front:
        fs = GCSFileSystem(client=front.client_config, project=PROJECT, skip_instance_cache=True)
        fs.rmdir(new_bucket)  # carried out, answered 503, sent again: 404
        assert front.faults_injected["lost_answer"] == 1 and front.unconditional_resends == []
        assert not fs.exists(new_bucket)


def test_a_bucket_emptied_by_a_recursive_rm_can_be_deleted(fs: GCSFileSystem, new_bucket: str) -> None:
    fs.mkdir(new_bucket)
    fs.pipe({f"{new_bucket}/a.txt": b"a", f"{new_bucket}/empty/": b"", f"{new_bucket}/d/sub/": b""})
    fs.rm(new_bucket, recursive=True)  # the objects go, folder placeholders included; the bucket stays
    assert fs.exists(new_bucket) and fs.ls(new_bucket) == []
    fs.rmdir(new_bucket)
    assert new_bucket not in fs.ls("")
