"""``url``, ``sign`` and ``version_aware`` answer as gcsfs's do: signed URLs are google-cloud-storage's V4 URLs
byte for byte, and with ``version_aware=True`` a ``name#<generation>`` path names one version of an object,
over HTTP to the emulator with a bucket that keeps versions."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import google.oauth2.credentials
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import impersonated_credentials
from google.cloud import storage
from google.oauth2 import service_account

from torchdata_gcs.config import ClientConfig
from torchdata_gcs.errors import AccessDeniedError
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)

GCS = "https://storage.googleapis.com"
SIGNED_AT = datetime.datetime(2026, 11, 26, 12, 30, 5, tzinfo=datetime.timezone.utc)


@pytest.fixture(scope="module")
def signer() -> service_account.Credentials:
    """Service-account credentials on an RSA key made here: they sign, and never reach a token server."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    info = {
        "type": "service_account",
        "project_id": "demo-project",
        "private_key_id": "0123456789abcdef",
        "private_key": pem.decode(),
        "client_email": "signer@demo-project.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    return service_account.Credentials.from_service_account_info(info)


@pytest.fixture
def fs(gcs_emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)


@pytest.fixture
def versioned(gcs_emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=gcs_emulator.client_config, version_aware=True, skip_instance_cache=True)


@pytest.fixture
def versioned_bucket(gcs_emulator: Emulator, gcs_bucket: str) -> Iterator[str]:
    """A bucket with object versioning: an overwritten or deleted object stays as a noncurrent version."""
    name = f"{gcs_bucket}-v"
    answer = requests.post(
        f"{gcs_emulator.endpoint}/storage/v1/b", json={"name": name, "versioning": {"enabled": True}}, timeout=30
    )
    answer.raise_for_status()
    yield name


def _google_url(signer: service_account.Credentials, bucket: str, name: str, **kwargs: Any) -> str:
    client = storage.Client(project="demo-project", credentials=signer)
    blob = client.bucket(bucket).blob(name)
    return blob.generate_signed_url(version="v4", credentials=signer, api_access_endpoint=GCS, **kwargs)  # type: ignore[no-any-return]


SIGNING_CASES = {
    "get": ("dir/a b~c+é.txt", 100, {}, {}),
    "put with a content type, for a day": (
        "upload/x.bin",
        datetime.timedelta(days=1),
        {"method": "PUT", "content_type": "application/octet-stream"},
        {"method": "PUT", "content_type": "application/octet-stream"},
    ),
    "a generation, a download name and an md5": (
        "v/o.txt#1700000000123456",
        3600,
        {"response_disposition": 'attachment; filename="o.txt"', "content_md5": "XUFAKrxLKna5cZ2REBfFkg=="},
        {
            "response_disposition": 'attachment; filename="o.txt"',
            "content_md5": "XUFAKrxLKna5cZ2REBfFkg==",
            "generation": 1700000000123456,
        },
    ),
    "headers and query parameters": (
        "q/z",
        600,
        {"headers": {"X-Goog-Meta-Owner": "  a   b "}, "query_parameters": {"userProject": "billed"}},
        {"headers": {"X-Goog-Meta-Owner": "  a   b "}, "query_parameters": {"userProject": "billed"}},
    ),
    "a resumable upload": ("r/big", 60, {"method": "RESUMABLE"}, {"method": "RESUMABLE"}),
}


@pytest.mark.parametrize(("path", "expiration", "ours", "theirs"), SIGNING_CASES.values(), ids=list(SIGNING_CASES))
def test_sign_makes_google_cloud_storages_v4_url_byte_for_byte(
    signer: service_account.Credentials,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    expiration: Any,
    ours: dict[str, Any],
    theirs: dict[str, Any],
) -> None:
    fs = GCSFileSystem(token=signer, endpoint_url=GCS, version_aware=True, skip_instance_cache=True)
    signed = fs.sign(f"gs://bucket-1/{path}", expiration, now=SIGNED_AT, **ours)
    monkeypatch.setattr("google.cloud.storage._signing._NOW", lambda tz=None: SIGNED_AT)  # their clock, fixed
    seconds = expiration if isinstance(expiration, datetime.timedelta) else datetime.timedelta(seconds=expiration)
    expected = _google_url(signer, "bucket-1", path.partition("#")[0], expiration=seconds, **theirs)
    assert signed == expected
    assert parse_qs(urlsplit(signed).query)["X-Goog-Algorithm"] == ["GOOG4-RSA-SHA256"]


def test_sign_takes_a_moment_to_expire_at_and_refuses_what_gcs_would(signer: service_account.Credentials) -> None:
    fs = GCSFileSystem(token=signer, endpoint_url=GCS, skip_instance_cache=True)
    ends = SIGNED_AT + datetime.timedelta(hours=2)
    assert parse_qs(urlsplit(fs.sign("bucket-1/o", ends, now=SIGNED_AT)).query)["X-Goog-Expires"] == ["7200"]
    with pytest.raises(ValueError, match="seven days"):
        fs.sign("bucket-1/o", datetime.timedelta(days=8), now=SIGNED_AT)
    with pytest.raises(ValueError, match="V4"):
        fs.sign("bucket-1/o", version="v2")
    with pytest.raises(TypeError, match="virtual_hosted_style"):
        fs.sign("bucket-1/o", virtual_hosted_style=True)


def test_sign_without_a_private_key_raises_access_denied(signer: service_account.Credentials) -> None:
    anonymous = GCSFileSystem(token="anon", endpoint_url=GCS, skip_instance_cache=True)
    with pytest.raises(AccessDeniedError, match="anonymous"):
        anonymous.sign("bucket-1/o")
    user = google.oauth2.credentials.Credentials(token="a-token")  # a user's token: nothing to sign with
    # these would sign by a request to the IAM API of their own, which no deadline of ours bounds
    impersonated = impersonated_credentials.Credentials(
        source_credentials=signer, target_principal="other@demo-project.iam.gserviceaccount.com", target_scopes=[]
    )
    for credentials in (user, impersonated):
        with pytest.raises(AccessDeniedError, match="private key"):
            GCSFileSystem(token=credentials, endpoint_url=GCS, skip_instance_cache=True).sign("bucket-1/o")


def test_a_signed_url_fetches_the_object(
    signer: service_account.Credentials, gcs_emulator: Emulator, fs: GCSFileSystem, gcs_bucket: str
) -> None:
    """The emulator serves a signed URL without checking its signature: the comparison above is the proof
    that GCS takes it; this shows the URL names the object on the configured endpoint."""
    fs.pipe_file(f"{gcs_bucket}/dir/a b.txt", b"signed bytes")
    signing = GCSFileSystem(token=signer, endpoint_url=gcs_emulator.endpoint, skip_instance_cache=True)
    answer = requests.get(signing.sign(f"gs://{gcs_bucket}/dir/a b.txt", 60), timeout=30)
    assert (answer.status_code, answer.content) == (200, b"signed bytes")


def test_url_is_the_objects_media_url_on_the_endpoint(
    gcs_emulator: Emulator, fs: GCSFileSystem, versioned: GCSFileSystem, versioned_bucket: str
) -> None:
    fs.pipe_file(f"{versioned_bucket}/dir/a b.txt", b"old")
    first = fs.info(f"{versioned_bucket}/dir/a b.txt")["generation"]
    fs.pipe_file(f"{versioned_bucket}/dir/a b.txt", b"new")
    url = fs.url(f"gs://{versioned_bucket}/dir/a b.txt")
    assert url == f"{gcs_emulator.endpoint}/download/storage/v1/b/{versioned_bucket}/o/dir%2Fa%20b.txt?alt=media"
    assert requests.get(url, timeout=30).content == b"new"
    old = versioned.url(f"gs://{versioned_bucket}/dir/a b.txt#{first}")
    assert old == f"{url}&generation={first}"
    assert requests.get(old, timeout=30).content == b"old"


def test_version_aware_paths_read_a_noncurrent_version(versioned: GCSFileSystem, versioned_bucket: str) -> None:
    path = f"{versioned_bucket}/data/o.txt"
    versioned.pipe_file(path, b"first version")
    first = versioned.info(path)["generation"]
    versioned.pipe_file(path, b"second")
    assert versioned.cat_file(f"gs://{path}#{first}") == b"first version"
    assert versioned.cat_file(f"{path}#{first}", start=6, end=13) == b"version"
    assert versioned.cat_file(f"{path}?generation={first}") == b"first version"  # gcsfs's other spelling
    with versioned.open(f"{path}#{first}", "rb") as f:
        assert f.read() == b"first version"
    info = versioned.info(f"{path}#{first}")
    assert (info["generation"], info["size"], info["name"]) == (first, 13, path)
    assert versioned.exists(f"{path}#{first}") and not versioned.exists(f"{path}#{first + 1}")
    assert versioned.cat_file(path) == b"second"


def test_cp_of_a_version_copies_that_version(versioned: GCSFileSystem, versioned_bucket: str) -> None:
    path = f"{versioned_bucket}/o"
    versioned.pipe_file(path, b"old bytes")
    old = _gen(versioned, path)
    versioned.pipe_file(path, b"new")
    versioned.cp(f"gs://{path}#{old}", f"{versioned_bucket}/restored")
    assert versioned.cat_file(f"{versioned_bucket}/restored") == b"old bytes"
    with pytest.raises(FileNotFoundError):
        versioned.cp(f"{path}#{old + 1}", f"{versioned_bucket}/never")
    with pytest.raises(ValueError, match="one version"):
        versioned.cp(path, f"{versioned_bucket}/restored#{old}")
    assert not versioned.exists(f"{versioned_bucket}/never")


def test_ls_and_find_with_versions_name_every_version(versioned: GCSFileSystem, versioned_bucket: str) -> None:
    for data in (b"1", b"22", b"333"):
        versioned.pipe_file(f"{versioned_bucket}/d/o", data)
    versioned.pipe_file(f"{versioned_bucket}/d/sub/p", b"p")
    listed = versioned.ls(f"{versioned_bucket}/d", detail=True, versions=True)
    files = [entry for entry in listed if entry["type"] == "file"]
    assert sorted(entry["size"] for entry in files) == [1, 2, 3]
    assert [entry["name"] for entry in files] == [f"{versioned_bucket}/d/o#{entry['generation']}" for entry in files]
    assert versioned.ls(f"{versioned_bucket}/d", detail=False) == [
        f"{versioned_bucket}/d/o",
        f"{versioned_bucket}/d/sub",
    ]
    found = versioned.find(f"{versioned_bucket}/d", versions=True)
    assert found == sorted(
        [entry["name"] for entry in files]
        + [f"{versioned_bucket}/d/sub/p#{_gen(versioned, f'{versioned_bucket}/d/sub/p')}"]
    )
    assert {versioned.cat_file(name) for name in found} == {b"1", b"22", b"333", b"p"}


def _gen(fs: GCSFileSystem, path: str) -> int:
    return int(fs.info(path)["generation"])


@pytest.fixture
def through_front(gcs_front: GCSFront) -> GCSFileSystem:
    """Version-aware, through the front, which deletes a version by its generation as GCS does."""
    return GCSFileSystem(client=ClientConfig(endpoint=gcs_front.endpoint), version_aware=True, skip_instance_cache=True)


def test_rm_of_a_version_deletes_that_version_for_good(through_front: GCSFileSystem, versioned_bucket: str) -> None:
    path = f"{versioned_bucket}/dir/o"
    for data in (b"old", b"middle", b"new"):
        through_front.pipe_file(path, data)
    old, middle, new = sorted(int(name.rpartition("#")[2]) for name in through_front.ls(path, versions=True))
    through_front.rm(f"gs://{path}#{old}")
    through_front.rm_file(f"{path}#{middle}")
    assert not through_front.exists(f"{path}#{old}") and not through_front.exists(f"{path}#{middle}")
    assert through_front.ls(path, versions=True) == [f"{path}#{new}"]
    assert through_front.cat_file(path) == b"new"
    with pytest.raises(FileNotFoundError):
        through_front.rm(f"{path}#{old}")
    through_front.rm(f"{path}#{new}")  # the live version: gone for good too, none left behind
    assert through_front.find(versioned_bucket, versions=True) == [] and not through_front.exists(path)


def test_a_recursive_rm_or_find_of_a_version_touches_that_version_alone(
    through_front: GCSFileSystem, versioned_bucket: str
) -> None:
    """``o#G`` names one version: neither the live ``o`` nor what lies under ``o/`` is found or deleted."""
    path = f"{versioned_bucket}/o"
    through_front.pipe({path: b"old", f"{path}/under": b"u"})
    old = _gen(through_front, path)
    through_front.pipe_file(path, b"new")
    assert through_front.find(f"{path}#{old}") == [f"{path}#{old}"]
    assert through_front.find(f"{path}#{old + 1}") == []
    through_front.rm(f"{path}#{old}", recursive=True)
    assert not through_front.exists(f"{path}#{old}")
    assert through_front.cat([path, f"{path}/under"]) == {path: b"new", f"{path}/under": b"u"}


def test_a_hash_is_part_of_the_name_unless_version_aware(
    fs: GCSFileSystem, versioned: GCSFileSystem, gcs_bucket: str
) -> None:
    fs.pipe_file(f"{gcs_bucket}/x#1", b"a name with a hash")
    assert fs.ls(gcs_bucket) == [f"{gcs_bucket}/x#1"] and fs.cat_file(f"{gcs_bucket}/x#1") == b"a name with a hash"
    with pytest.raises(FileNotFoundError):  # version_aware: generation 1 of "x", which does not exist
        versioned.cat_file(f"{gcs_bucket}/x#1")
    assert GCSFileSystem._get_kwargs_from_urls(f"gs://{gcs_bucket}/x#1") == {"version_aware": True}
    assert GCSFileSystem._get_kwargs_from_urls(f"gs://{gcs_bucket}/x#y") == {}


def test_writes_to_a_version_path_are_refused(versioned: GCSFileSystem, versioned_bucket: str) -> None:
    path = f"{versioned_bucket}/o"
    versioned.pipe_file(path, b"kept")
    generation = _gen(versioned, path)
    with pytest.raises(ValueError, match="one version"):
        versioned.pipe_file(f"{path}#{generation}", b"lost")
    with pytest.raises(ValueError, match="one version"):
        versioned.open(f"{path}#{generation}", "wb")
    assert versioned.cat_file(path) == b"kept" and versioned.ls(versioned_bucket) == [path]
