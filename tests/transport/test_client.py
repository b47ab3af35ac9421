"""Endpoint and credential resolution, per-process sessions, and secrets that never leak."""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import platform
from importlib.metadata import version
from pathlib import Path

import google.oauth2.service_account
import pytest
from google.cloud import storage
from torch.utils.data import DataLoader

from tests.delivery import read
from tests.http_proxy import RecordingProxy
from tests.token_server import ACCESS_TOKEN, TokenServer, private_key_pem
from torchdata_gcs import (
    AccessDeniedError,
    ClientConfig,
    GCSError,
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    GCSIterableDataset,
)
from torchdata_gcs._transport.http import GCS_ENDPOINT, resolve_endpoint
from torchdata_gcs._transport.session import session_for
from torchdata_gcs.testing import Emulator, GCSFront


def test_credentials_are_used_but_never_leak(
    tmp_path: Path, token_server: TokenServer, gcs_emulator: Emulator, gcs_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    private_key = private_key_pem()
    key_file = token_server.write_key_file(tmp_path / "service-account.json", private_key)
    secrets = [ACCESS_TOKEN, *private_key.splitlines()[1:-1]]
    gcs_emulator.seed(gcs_bucket, {"a": b"1"})
    caplog.set_level(logging.DEBUG)
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        config = ClientConfig(endpoint=proxy.endpoint, anonymous=False, credentials_file=key_file)
        lister = GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/", client=config)
        loader = GCSFileLoaderIterDataPipe(lister, client=config)
        assert [(url, stream.read()) for url, stream in loader] == [(f"gs://{gcs_bucket}/a", b"1")]
        errors: list[GCSError] = []
        for url in (f"gs://{gcs_bucket}/missing", "gs://no-such-bucket-xyz/a"):
            with pytest.raises(GCSError) as info:
                list(GCSFileLoaderIterDataPipe([url], client=config))
            errors.append(info.value)
    assert token_server.grants, "the credentials file was never used"
    assert {headers.get("authorization") for _, _, headers in proxy.requests} == {f"Bearer {ACCESS_TOKEN}"}
    exposed = [
        repr(config),
        repr(lister),
        repr(loader),
        repr(session_for(config)),
        caplog.text,
        *(str(error) + repr(error) for error in errors),
    ]
    pickles = [pickle.dumps(obj) for obj in (config, lister, loader, *errors)]
    for secret in secrets:
        assert not any(secret in text for text in exposed)
        assert not any(secret.encode() in blob for blob in pickles)


def test_a_credentials_object_or_a_storage_client_is_taken(
    tmp_path: Path, token_server: TokenServer, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    key_file = token_server.write_key_file(tmp_path / "service-account.json", private_key_pem())
    unscoped = google.oauth2.service_account.Credentials.from_service_account_file(key_file)  # scoped when used
    gcs_emulator.seed(gcs_bucket, {f"c/{i}": bytes([i]) for i in range(4)})
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        storage_client = storage.Client(
            project="billing-project", credentials=unscoped, client_options={"api_endpoint": proxy.endpoint}
        )
        for config in (
            ClientConfig(endpoint=proxy.endpoint, anonymous=False, credentials=unscoped),
            ClientConfig.from_storage_client(storage_client),
        ):
            dataset = GCSIterableDataset(f"gs://{gcs_bucket}/c/", client=config, transform=read)
            loaded = list(DataLoader(dataset, batch_size=None, num_workers=2))
            assert sorted(data for _, data in loaded) == [bytes([i]) for i in range(4)]  # workers got them pickled
    assert token_server.grants >= 3, "the parent and each worker asked for a token"
    assert {headers.get("authorization") for _, _, headers in proxy.requests} == {f"Bearer {ACCESS_TOKEN}"}
    assert ClientConfig.from_storage_client(storage.Client.create_anonymous_client()).anonymous is True
    with pytest.raises(ValueError, match="not both"):
        ClientConfig(credentials=unscoped, credentials_file=key_file)
    with pytest.raises(ValueError, match="contradict"):
        ClientConfig(credentials=unscoped, anonymous=True)
    with pytest.raises(ValueError, match="google.auth.credentials.Credentials"):
        ClientConfig(credentials=key_file)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="storage.Client"):
        ClientConfig.from_storage_client(unscoped)
    with pytest.raises(ValueError, match="anonymous=False"):  # a token would travel in clear text: refused, not dropped
        session_for(ClientConfig(endpoint=gcs_emulator.endpoint, credentials=unscoped))


def test_refused_credentials_raise_access_denied(
    tmp_path: Path, token_server: TokenServer, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    token_server.refuse = True
    key_file = token_server.write_key_file(tmp_path / "revoked.json", private_key_pem())
    config = ClientConfig(endpoint=gcs_emulator.endpoint, anonymous=False, credentials_file=key_file)
    with pytest.raises(AccessDeniedError, match="invalid_grant") as info:
        list(GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/", client=config))
    assert info.value.url == f"gs://{gcs_bucket}/"


def test_endpoint_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert resolve_endpoint(ClientConfig()) == (GCS_ENDPOINT, False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9023")
    assert resolve_endpoint(ClientConfig()) == ("http://127.0.0.1:9023", True)
    assert resolve_endpoint(ClientConfig(endpoint="https://private.example.com/")) == (
        "https://private.example.com",
        False,
    )
    assert resolve_endpoint(ClientConfig(endpoint="http://127.0.0.1:1")) == ("http://127.0.0.1:1", True)


def test_emulator_env_alone_reaches_the_emulator(
    monkeypatch: pytest.MonkeyPatch, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"env": b"x"})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint.removeprefix("http://"))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")  # anonymous: never read
    assert list(GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/")) == [f"gs://{gcs_bucket}/env"]


def test_missing_credentials_raise_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
    with pytest.raises(AccessDeniedError, match=r"key.json \(GOOGLE_APPLICATION_CREDENTIALS\) does not exist"):
        list(GCSFileListerIterDataPipe("gs://some-bucket/"))
    with pytest.raises(AccessDeniedError, match="missing.json"):
        session_for(ClientConfig(credentials_file="/nonexistent/missing.json"))


_INHERITED: list[object] = []  # the parent's session, as a forked child sees it


def _child_builds_its_own(client: ClientConfig) -> bool:
    return session_for(client) is not _INHERITED[0]


def test_sessions_are_per_process_and_never_pickled(client: ClientConfig) -> None:
    session = session_for(client)
    assert session_for(client) is session
    with pytest.raises(TypeError, match="pickle its Destination"):
        pickle.dumps(session)
    _INHERITED[:] = [session]
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_child_builds_its_own, (client,))  # a forked child builds its own
    assert session_for(client) is session


def test_every_request_names_the_library(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"1"})
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        assert [
            stream.read()
            for _, stream in GCSFileLoaderIterDataPipe(
                GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/", client=front.client_config), client=front.client_config
            )
        ] == [b"1"]
        agents = [request.header("User-Agent") for request in front.recorded]
        clients = [request.header("x-goog-api-client") for request in front.recorded]
    library = f"torchdata-gcs/{version('torchdata-gcs')}"
    assert len(agents) == 2 and agents == [[f"{library} (gzip)"]] * 2
    assert clients == [[f"gl-python/{platform.python_version()} {library}"]] * 2


def test_a_key_file_for_an_anonymous_endpoint_is_refused(
    tmp_path: Path, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """An emulator's http:// endpoint is anonymous by default: a key file given for it is an error, not ignored."""
    config = ClientConfig(endpoint=gcs_emulator.endpoint, credentials_file=str(tmp_path / "key.json"))
    with pytest.raises(ValueError, match="anonymous=False"):
        list(GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/", client=config))
