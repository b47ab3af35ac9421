"""The project whose buckets ``ls("")`` lists and ``mkdir("bucket")`` creates, and which ``requester_pays=True``
bills, found as gcsfs finds it when ``project=`` is not given: ``GCSFS_DEFAULT_PROJECT``, else the credentials'
own project; over HTTP through the test front, which records what each request names."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.oauth2 import service_account

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import GCSFront

pytestmark = pytest.mark.timeout(120)


def _projects_asked(front: GCSFront, method: str) -> list[str | None]:
    """The ``project`` parameter of each bucket listing (``GET``) or creation (``POST``) the front received."""
    return [
        dict(parse_qsl(urlsplit(request.target).query)).get("project")
        for request in front.recorded
        if request.method == method and urlsplit(request.target).path == "/storage/v1/b"
    ]


@pytest.fixture(scope="module")
def key_info() -> dict[str, Any]:
    """A service-account key of project ``key-project`` on an RSA key made here (it never reaches a token server)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return {
        "type": "service_account",
        "project_id": "key-project",
        "private_key_id": "0123456789abcdef",
        "private_key": pem.decode(),
        "client_email": "reader@key-project.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    }


@pytest.fixture
def key_file(tmp_path: Path, key_info: dict[str, Any]) -> str:
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key_info))
    return str(path)


def test_gcsfs_default_project_lists_and_creates_buckets(
    front: GCSFront, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCSFS_DEFAULT_PROJECT", "env-project")
    fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
    assert fs.project == "env-project"
    assert gcs_bucket in fs.ls("")
    new = f"new-{uuid.uuid4().hex[:12]}"
    fs.mkdir(new)
    try:
        assert fs.exists(new)
        assert _projects_asked(front, "GET") == ["env-project"] and _projects_asked(front, "POST") == ["env-project"]
    finally:
        fs.rmdir(new)


def test_project_given_wins_over_the_variable_and_the_credentials(
    monkeypatch: pytest.MonkeyPatch, key_file: str
) -> None:
    monkeypatch.setenv("GCSFS_DEFAULT_PROJECT", "env-project")
    assert GCSFileSystem(token=key_file, project="named", skip_instance_cache=True).project == "named"
    assert GCSFileSystem(token=key_file, skip_instance_cache=True).project == "env-project"


def test_the_credentials_name_the_project_without_the_variable(
    monkeypatch: pytest.MonkeyPatch, key_file: str, key_info: dict[str, Any]
) -> None:
    monkeypatch.delenv("GCSFS_DEFAULT_PROJECT", raising=False)
    assert GCSFileSystem(token=key_file, skip_instance_cache=True).project == "key-project"
    credentials = service_account.Credentials.from_service_account_info(key_info)
    assert GCSFileSystem(token=credentials, skip_instance_cache=True).project == "key-project"
    # Application Default Credentials, as google.auth.default() finds them (here: the key file it is pointed at)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", key_file)
    assert GCSFileSystem(skip_instance_cache=True).project == "key-project"
    paying = GCSFileSystem(token=key_file, requester_pays=True, skip_instance_cache=True)
    assert paying.client.config.user_project == "key-project" and paying.requester_pays is True


def test_requester_pays_bills_the_default_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCSFS_DEFAULT_PROJECT", "env-project")
    fs = GCSFileSystem(token="anon", requester_pays=True, skip_instance_cache=True)
    assert fs.client.config.user_project == "env-project" and fs.requester_pays is True


def test_no_project_anywhere_is_refused_naming_where_one_comes_from(
    front: GCSFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anonymous access has no credentials to name a project; GCS lists and creates buckets only in one."""
    monkeypatch.delenv("GCSFS_DEFAULT_PROJECT", raising=False)
    fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
    assert fs.project is None
    with pytest.raises(ValueError, match="project=.*GCSFS_DEFAULT_PROJECT"):
        fs.ls("")
    with pytest.raises(ValueError, match="project=.*GCSFS_DEFAULT_PROJECT"):
        fs.mkdir(f"new-{uuid.uuid4().hex[:12]}")
    with pytest.raises(ValueError, match="GCSFS_DEFAULT_PROJECT"):
        GCSFileSystem(token="anon", requester_pays=True, skip_instance_cache=True)
    assert _projects_asked(front, "GET") == [] and _projects_asked(front, "POST") == []
    monkeypatch.setenv("GCSFS_DEFAULT_PROJECT", "")
    assert GCSFileSystem(token="anon", skip_instance_cache=True).project is None  # empty is unset
