"""A key file that is missing or malformed is named, with what is wrong with it, whether it comes from
``ClientConfig(credentials_file=...)`` or ``GOOGLE_APPLICATION_CREDENTIALS``; no generic advice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdata_gcs import AccessDeniedError, ClientConfig
from torchdata_gcs._transport.session import session_for

GENERIC_ADVICE = "application-default login"


@pytest.fixture(autouse=True)
def real_gcs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No emulator: the credentials are needed."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)


def from_config(path: Path) -> AccessDeniedError:
    with pytest.raises(AccessDeniedError) as info:
        session_for(ClientConfig(credentials_file=str(path)))
    return info.value


def from_environment(path: Path, monkeypatch: pytest.MonkeyPatch) -> AccessDeniedError:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    with pytest.raises(AccessDeniedError) as info:
        session_for(ClientConfig(user_project=f"p-{path.name}"))  # a configuration of its own: a new session
    return info.value


def test_a_missing_credentials_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "key.json"
    message = str(from_config(path))
    assert message == f"credentials file {path} (ClientConfig.credentials_file) does not exist"


def test_a_missing_file_named_by_the_environment_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nowhere" / "key.json"
    message = str(from_environment(path, monkeypatch))
    assert message == f"credentials file {path} (GOOGLE_APPLICATION_CREDENTIALS) does not exist"


@pytest.mark.parametrize(
    "content, problem",
    [
        ("not json", "not a JSON key file"),
        (json.dumps({"type": "service_account"}), "missing fields"),
        (json.dumps(["a", "list"]), "not a JSON key file"),
        (json.dumps({"type": "external_account_typo"}), "external_account_typo"),
    ],
)
def test_a_malformed_key_file_is_named_with_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, problem: str
) -> None:
    path = tmp_path / "key.json"
    path.write_text(content)
    for error in (from_config(path), from_environment(path, monkeypatch)):
        message = str(error)
        assert str(path) in message and problem in message, message
        assert GENERIC_ADVICE not in message and len(message.splitlines()) == 1


def test_a_folder_is_not_a_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for error in (from_config(tmp_path), from_environment(tmp_path, monkeypatch)):
        assert f"credentials file {tmp_path} " in str(error) and "is a directory" in str(error)
