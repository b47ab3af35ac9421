"""What ``info`` tells and what writes set, as gcsfs's: the object resource in ``info``, ``ls`` and ``find``;
``created``/``modified``; ``setxattrs``/``getxattr``; content type, user and fixed-key metadata on every write
path (JSON upload, compose, XML multipart upload); the writer's ``mode``, ``name``, ``path`` and ``fs``. Over
HTTP to the emulator, through ``GCSFront`` where GCS does what the emulator does not (XML API, patches)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from torchdata_gcs import WriteConfig
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
RESOURCE_FIELDS = (
    "contentType",
    "md5Hash",
    "crc32c",
    "metadata",
    "timeCreated",
    "updated",
    "generation",
    "metageneration",
    "storageClass",
    "etag",
)
FIXED = {
    "cache_control": "no-store",
    "content_disposition": "attachment; filename=report.csv",
    "content_encoding": "identity",
    "content_language": "fr",
    "custom_time": "2024-05-06T07:08:09.000Z",
}
FIXED_FIELDS = {
    "cacheControl": "no-store",
    "contentDisposition": "attachment; filename=report.csv",
    "contentEncoding": "identity",
    "contentLanguage": "fr",
}


@pytest.fixture
def fs(gcs_emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)


@pytest.fixture
def front_fs(front: GCSFront) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, skip_instance_cache=True)


def _without_acl(entry: dict[str, Any]) -> dict[str, Any]:
    """The emulator lists objects with their ACL, which GCS leaves out (``projection=noAcl``, its default)."""
    return {key: value for key, value in entry.items() if key != "acl"}


def _query(target: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(target).query, keep_blank_values=True))


# -- info, ls, find ----------------------------------------------------------------------------------


def test_info_holds_the_object_resource_as_gcsfs_returns_it(fs: GCSFileSystem, gcs_bucket: str) -> None:
    path = f"{gcs_bucket}/data/table.csv"
    fs.pipe_file(path, b"a,b\n1,2\n", metadata={"owner": "team-a"})
    info = fs.info(path)
    assert set(RESOURCE_FIELDS) <= set(info)
    assert info["name"] == path and info["type"] == "file" and info["size"] == 8
    assert info["contentType"] == "text/csv" and info["metadata"] == {"owner": "team-a"}
    assert isinstance(info["generation"], int) and info["metageneration"] == 1
    assert info["md5Hash"] and info["etag"] and info["storageClass"] == "STANDARD"


def test_ls_and_find_entries_hold_what_info_holds(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe({f"{gcs_bucket}/d/a.json": b"{}", f"{gcs_bucket}/d/sub/b.txt": b"b"}, metadata={"k": "v"})
    info = _without_acl(fs.info(f"{gcs_bucket}/d/a.json"))
    listed = [_without_acl(entry) for entry in fs.ls(f"{gcs_bucket}/d", detail=True) if entry["type"] == "file"]
    found = fs.find(f"{gcs_bucket}/d", detail=True)
    assert listed == [info] and _without_acl(found[f"{gcs_bucket}/d/a.json"]) == info
    assert found[f"{gcs_bucket}/d/sub/b.txt"]["metadata"] == {"k": "v"}


def test_info_ls_and_find_ask_gcs_for_the_whole_resource(
    front_fs: GCSFileSystem, front: GCSFront, gcs_bucket: str
) -> None:
    """The emulator answers every field whatever ``fields=`` says; GCS trims to it: what is asked decides."""
    front_fs.pipe_file(f"{gcs_bucket}/d/a.txt", b"a")
    start = len(front.recorded)
    front_fs.info(f"{gcs_bucket}/d/a.txt")
    front_fs.ls(f"{gcs_bucket}/d", detail=True)
    front_fs.find(f"{gcs_bucket}/d", detail=True)
    asked = [
        (urlsplit(request.target).path, _query(request.target))
        for request in front.recorded[start:]
        if request.method == "GET" and urlsplit(request.target).path.startswith(f"/storage/v1/b/{gcs_bucket}/o")
    ]
    info_gets = [query for path, query in asked if path.endswith("/o/d%2Fa.txt")]
    fields = [query.get("fields", "") for path, query in asked if path.endswith("/o")]
    assert info_gets and all("fields" not in query for query in info_gets)
    assert "items,prefixes,nextPageToken" in fields and "items,nextPageToken" in fields  # ls's, find's
    assert not [asked_for for asked_for in fields if "items(" in asked_for]


def test_created_and_modified_are_timezone_aware_datetimes(fs: GCSFileSystem, gcs_bucket: str) -> None:
    path = f"{gcs_bucket}/times/t.bin"
    before = datetime.now(timezone.utc).replace(microsecond=0)
    fs.pipe_file(path, b"x")
    created, modified = fs.created(path), fs.modified(path)
    info = fs.info(path)
    assert created.tzinfo is not None and modified.tzinfo is not None
    assert created == datetime.fromisoformat(info["timeCreated"].replace("Z", "+00:00"))
    assert modified == datetime.fromisoformat(info["updated"].replace("Z", "+00:00"))
    assert before <= created <= modified < before.replace(year=before.year + 1)
    assert info["ctime"] == created and info["mtime"] == modified
    with pytest.raises(IsADirectoryError):
        fs.created(f"{gcs_bucket}/times")


# -- content type and metadata on writes ---------------------------------------------------------------


def test_writes_guess_the_content_type_from_the_extension(fs: GCSFileSystem, gcs_bucket: str, tmp_path: Path) -> None:
    base = f"{gcs_bucket}/types"
    with fs.open(f"{base}/open.csv", "wb") as f:
        f.write(b"a,b\n")
    with fs.open(f"{base}/text.html", "w") as t:
        t.write("<p>hi</p>")
    fs.pipe_file(f"{base}/pipe.json", b"{}")
    local = tmp_path / "local.txt"
    local.write_bytes(b"words")
    fs.put_file(str(local), f"{base}/put-anything")
    fs.pipe_file(f"{base}/no-extension", b"?")
    fs.pipe_file(f"{base}/given.csv", b"x", content_type="application/x-custom")
    types = {entry["name"].rpartition("/")[2]: entry["contentType"] for entry in fs.ls(base, detail=True)}
    assert types == {
        "open.csv": "text/csv",
        "text.html": "text/html",
        "pipe.json": "application/json",
        "put-anything": "text/plain",  # from the local file's name, as gcsfs
        "no-extension": "application/octet-stream",
        "given.csv": "application/x-custom",
    }


def _written(fs: GCSFileSystem, path: str, how: str, data: bytes, **options: Any) -> None:
    if how == "pipe":
        fs.pipe_file(path, data, **options)
    else:
        with fs.open(path, "wb", **options) as f:
            for start in range(0, len(data), MiB):
                f.write(data[start : start + MiB])


@pytest.mark.parametrize(
    ("how", "write", "size"),
    [
        ("pipe", WriteConfig(), 10),  # one JSON multipart upload
        ("open", WriteConfig(), 10),  # the same, from a writer under one part
        ("pipe", WriteConfig(strategy="compose", part_size=256 * 1024), 600 * 1024),  # parts, composed
        ("open", WriteConfig(strategy="compose", part_size=256 * 1024), 600 * 1024),
        ("open", WriteConfig(strategy="multipart", part_size=5 * MiB), 6 * MiB),  # XML API multipart upload
    ],
)
def test_metadata_and_fixed_key_metadata_reach_the_object_on_every_write_path(
    front: GCSFront, gcs_bucket: str, how: str, write: WriteConfig, size: int
) -> None:
    fs = GCSFileSystem(client=front.client_config, write=write, skip_instance_cache=True)
    path = f"{gcs_bucket}/meta/report.csv"
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    _written(fs, path, how, data, metadata={"owner": "team-a", "run": "7"}, fixed_key_metadata=FIXED)
    info = fs.info(path)
    assert fs.cat_file(path) == data
    assert info["metadata"] == {"owner": "team-a", "run": "7"} and info["contentType"] == "text/csv"
    assert {key: info.get(key) for key in FIXED_FIELDS} == FIXED_FIELDS
    assert datetime.fromisoformat(info["customTime"].replace("Z", "+00:00")) == datetime(
        2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc
    )
    if write.strategy == "multipart" and size > write.part_size:
        assert front.counts["upload"] >= 3 and not any(r.target.endswith("/compose") for r in front.recorded)


def test_metadata_an_xml_header_cannot_carry_is_written_whole_by_compose(front: GCSFront, gcs_bucket: str) -> None:
    fs = GCSFileSystem(client=front.client_config, write=WriteConfig(part_size=5 * MiB), skip_instance_cache=True)
    path = f"{gcs_bucket}/meta/unicode.bin"
    metadata = {"Auteur": "Zoë", "plain": "yes"}
    _written(fs, path, "open", b"u" * (6 * MiB), metadata=metadata)
    assert fs.info(path)["metadata"] == metadata


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"acl": "publicRead"}, "acl"),
        ({"consistency": "md5", "block_until": 1}, "block_until, consistency"),
        ({"kms_key_name": 7}, "kms_key_name"),
        ({"metadata": {"n": 1}}, "metadata['n']"),
        ({"fixed_key_metadata": {"storage_class": "COLDLINE"}}, "storage_class"),
        ({"content_type": 7}, "content_type"),
    ],
)
def test_a_write_with_an_unknown_or_bad_keyword_raises_type_error_and_writes_nothing(
    fs: GCSFileSystem, gcs_bucket: str, tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    local = tmp_path / "l.bin"
    local.write_bytes(b"l")
    path = f"{gcs_bucket}/refused/x.bin"
    attempts = [
        lambda: fs.pipe_file(path, b"x", **options),
        lambda: fs.open(path, "wb", **options),
        lambda: fs.open(path, "w", **options),
        lambda: fs.put_file(str(local), path, **options),
    ]
    for attempt in attempts:
        with pytest.raises(TypeError, match=named.replace("[", r"\[").replace("]", r"\]")):
            attempt()
    assert not fs.exists(path)


# -- customer-managed encryption keys ---------------------------------------------------------------

KEY = "projects/p/locations/global/keyRings/r/cryptoKeys/k"
OTHER_KEY = "projects/p/locations/global/keyRings/r/cryptoKeys/other"


@pytest.mark.parametrize(
    ("how", "write", "size"),
    [
        ("pipe", WriteConfig(), 10),
        ("open", WriteConfig(), 10),
        ("open", WriteConfig(strategy="compose", part_size=256 * 1024), 600 * 1024),
        ("open", WriteConfig(strategy="multipart", part_size=5 * MiB), 6 * MiB),
    ],
)
def test_kms_key_name_encrypts_the_object_and_its_parts_on_every_write_path(
    front: GCSFront, gcs_bucket: str, how: str, write: WriteConfig, size: int
) -> None:
    fs = GCSFileSystem(client=front.client_config, write=write, kms_key_name=KEY, skip_instance_cache=True)
    path = f"{gcs_bucket}/cmek/data.bin"
    start = len(front.recorded)
    _written(fs, path, how, b"k" * size)
    assert fs.info(path)["kmsKeyName"].startswith(f"{KEY}/cryptoKeyVersions/")
    writes = [r for r in front.recorded[start:] if r.method in ("POST", "PUT")]
    json_writes = [r for r in writes if urlsplit(r.target).path.startswith(("/upload/", "/storage/"))]
    xml_starts = [r for r in writes if "uploads" in _query(r.target)]
    assert json_writes and all(_query(r.target).get("kmsKeyName") == KEY for r in json_writes)  # parts, marker too
    assert all(r.header("x-goog-encryption-kms-key-name") == [KEY] for r in xml_starts)
    assert bool(xml_starts) == (write.strategy == "multipart" and size > write.part_size)


def test_a_write_names_its_own_kms_key_and_cp_mv_merge_take_the_filesystems(front: GCSFront, gcs_bucket: str) -> None:
    fs = GCSFileSystem(client=front.client_config, kms_key_name=KEY, skip_instance_cache=True)
    fs.pipe_file(f"{gcs_bucket}/cmek/own.bin", b"o", kms_key_name=OTHER_KEY)
    assert fs.info(f"{gcs_bucket}/cmek/own.bin")["kmsKeyName"].startswith(f"{OTHER_KEY}/")
    fs.cp(f"{gcs_bucket}/cmek/own.bin", f"{gcs_bucket}/cmek/copy.bin")
    fs.mv_file(f"{gcs_bucket}/cmek/copy.bin", f"{gcs_bucket}/cmek/moved.bin")
    fs.merge(f"{gcs_bucket}/cmek/merged.txt", [f"{gcs_bucket}/cmek/own.bin", f"{gcs_bucket}/cmek/moved.bin"])
    for made in ("moved.bin", "merged.txt"):  # a copy, a move (mv_file) and a merge: the filesystem's key
        assert fs.info(f"{gcs_bucket}/cmek/{made}")["kmsKeyName"].startswith(f"{KEY}/")
    assert fs.info(f"{gcs_bucket}/cmek/merged.txt")["contentType"] == "text/plain"
    plain = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
    plain.pipe_file(f"{gcs_bucket}/cmek/plain.bin", b"p")
    assert "kmsKeyName" not in plain.info(f"{gcs_bucket}/cmek/plain.bin")
    with pytest.raises(TypeError, match="kms_key_name"):
        GCSFileSystem(client=front.client_config, kms_key_name=5, skip_instance_cache=True)


# -- setxattrs and getxattr ---------------------------------------------------------------------------


def test_setxattrs_patches_metadata_in_place_and_none_removes_a_key(front_fs: GCSFileSystem, gcs_bucket: str) -> None:
    path = f"{gcs_bucket}/x/attrs.bin"
    front_fs.pipe_file(path, b"payload", metadata={"keep": "1", "drop": "2"})
    generation = front_fs.info(path)["generation"]
    assert front_fs.ls(f"{gcs_bucket}/x", detail=True)[0]["metadata"] == {"keep": "1", "drop": "2"}  # cached
    after = front_fs.setxattrs(
        path, drop=None, added="3", content_type="text/plain", fixed_key_metadata={"cache_control": "no-cache"}
    )
    assert after == {"keep": "1", "added": "3"}
    info = front_fs.info(path)
    assert info["metadata"] == {"keep": "1", "added": "3"} and info["generation"] == generation
    assert info["contentType"] == "text/plain" and info["cacheControl"] == "no-cache"
    assert info["metageneration"] == 2
    assert front_fs.getxattr(path, "added") == "3"
    with pytest.raises(KeyError):
        front_fs.getxattr(path, "drop")
    assert front_fs.cat_file(path) == b"payload"


def test_setxattrs_is_conditional_so_a_lost_answer_is_retried_safely(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    with GCSFront(gcs_emulator.endpoint, lose_write_answers=True, record=True) as front:
        fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
        path = f"{gcs_bucket}/x/lost.bin"
        fs.pipe_file(path, b"p")
        assert fs.setxattrs(path, label="seen") == {"label": "seen"}
        assert fs.getxattr(path, "label") == "seen" and fs.info(path)["metageneration"] == 2  # patched once
        patches = [_query(r.target) for r in front.recorded if r.method == "PATCH"]
        assert front.unconditional_resends == []
    assert len(patches) == 2  # the first answer was lost: sent again, answered 412, found carried out
    assert all("ifMetagenerationMatch" in query and "ifGenerationMatch" in query for query in patches)


def test_setxattrs_of_a_missing_object_raises_file_not_found(front_fs: GCSFileSystem, gcs_bucket: str) -> None:
    with pytest.raises(FileNotFoundError):
        front_fs.setxattrs(f"{gcs_bucket}/x/missing.bin", a="1")
    with pytest.raises(TypeError, match="metadata"):
        front_fs.setxattrs(f"{gcs_bucket}/x/missing.bin", a=1)


def test_the_front_refuses_a_patch_whose_metageneration_precondition_fails(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"p.bin": b"p"})
    request = urllib.request.Request(
        f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o/p.bin?ifMetagenerationMatch=7",
        data=json.dumps({"metadata": {"a": "b"}}).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    refused.value.close()
    assert refused.value.code == 412


# -- the writer ---------------------------------------------------------------------------------------


def test_a_writer_tells_its_mode_name_path_and_filesystem(fs: GCSFileSystem, gcs_bucket: str) -> None:
    path = f"{gcs_bucket}/w/file.bin"
    with fs.open(f"gs://{path}", "wb") as binary:
        assert (binary.mode, binary.name, binary.path, binary.fs) == ("wb", path, path, fs)
    with fs.open(f"gs://{path}.txt", "w") as text:
        assert (text.mode, text.name) == ("w", f"{path}.txt")
    with fs.transaction, fs.open(f"{path}.staged", "wb") as staged:
        assert (staged.mode, staged.name, staged.path, staged.fs) == ("wb", f"{path}.staged", f"{path}.staged", fs)
    with fs.open(f"{path}.new", "xb") as exclusive:
        assert exclusive.mode == "xb"
