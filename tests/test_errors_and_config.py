"""The exception tree and the settings: types, validation, pickling."""

from __future__ import annotations

import pickle

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import (
    AccessDeniedError,
    ClientConfig,
    GCSError,
    IntegrityError,
    InvalidURIError,
    NotFoundError,
    PreconditionFailedError,
    RetryConfig,
    TransferConfig,
    TransientError,
    Zstd,
    checkpoint,
)
from torchdata_gcs._transport.http import error_for_status
from torchdata_gcs.datapipes import GCSFileListerIterDataPipe, GCSFileLoaderIterDataPipe


@pytest.mark.parametrize(
    "status, error_type, builtin",
    [
        (404, NotFoundError, FileNotFoundError),
        (401, AccessDeniedError, PermissionError),
        (403, AccessDeniedError, PermissionError),
        (412, PreconditionFailedError, FileExistsError),
        (429, TransientError, ConnectionError),
        (503, TransientError, ConnectionError),
        (400, GCSError, Exception),
    ],
)
def test_statuses_map_to_typed_errors(status: int, error_type: type, builtin: type) -> None:
    error = error_for_status(status, "gs://b/x", "detail")
    assert type(error) is error_type
    assert isinstance(error, builtin) and isinstance(error, GCSError)
    assert error.url == "gs://b/x" and error.status == status
    assert "gs://b/x" in str(error) and str(status) in str(error)


@pytest.mark.parametrize(
    "error",
    [
        NotFoundError("gone", url="gs://b/x", status=404),
        AccessDeniedError("no", url="gs://b/x", status=403),
        PreconditionFailedError("changed", url="gs://b/x", status=412),
        InvalidURIError("bad"),
        TransientError("busy", url="gs://b/x", status=429, retry_after=3.0),
        IntegrityError("crc", url="gs://b/x"),
        GCSError("other", status=400),
    ],
)
def test_errors_pickle_with_their_fields(error: GCSError) -> None:
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error)
    assert str(clone) == str(error)
    assert clone.url == error.url and clone.status == error.status
    assert getattr(clone, "retry_after", None) == getattr(error, "retry_after", None)


def test_retry_after_reaches_transient_errors() -> None:
    assert error_for_status(429, None, "", retry_after=2.5).retry_after == 2.5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "make",
    [
        lambda: ClientConfig(endpoint="localhost:4443"),
        lambda: ClientConfig(endpoint="ftp://host"),
        lambda: ClientConfig(endpoint="http://user:pw@host"),
        lambda: ClientConfig(endpoint="http://host?x=1"),
        lambda: ClientConfig(anonymous=True, credentials_file="/tmp/key.json"),
        lambda: RetryConfig(max_attempts=0),
        lambda: RetryConfig(deadline=0),
        lambda: RetryConfig(initial_delay=-1),
        lambda: RetryConfig(initial_delay=2, max_delay=1),
        lambda: RetryConfig(multiplier=0.5),
        lambda: TransferConfig(max_in_flight=0),
        lambda: TransferConfig(max_in_flight=5000),
        lambda: TransferConfig(max_buffered_bytes=0),
        lambda: ClientConfig(connect_timeout=0),
        lambda: ClientConfig(read_timeout=-1),
        lambda: TransferConfig(max_in_flight=2.5),
        lambda: TransferConfig(max_in_flight=True),
        lambda: TransferConfig(part_size=float(1 << 20)),
        lambda: RetryConfig(max_attempts=1.5),
        lambda: Zstd(threads=1.0),
        lambda: GCSFileListerIterDataPipe("gs://bucket/", page_size=1.5),
        lambda: GCSFileListerIterDataPipe("gs://bucket/", concurrency=2.0),
    ],
)
def test_bad_settings_raise_value_error(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_an_empty_mask_keeps_everything_alone_or_in_a_list(gcs_emulator) -> None:
    gcs_emulator.seed("masks-bucket", {"a.jpg": b"1", "b.txt": b"2"})

    def names(masks):
        return [
            url
            for url in GCSFileListerIterDataPipe("gs://masks-bucket/", client=gcs_emulator.client_config, masks=masks)
        ]

    everything = ["gs://masks-bucket/a.jpg", "gs://masks-bucket/b.txt"]
    assert names("") == names([""]) == names(["*.jpg", ""]) == names([]) == everything
    assert names(["*.jpg"]) == everything[:1]


def test_writes_to_a_folder_name_are_refused_before_any_request(gcs_emulator) -> None:
    gcs_emulator.create_bucket("folder-bucket")
    client = gcs_emulator.client_config
    with pytest.raises(InvalidURIError, match="names a folder"):
        checkpoint.save({"w": 1}, "gs://folder-bucket/run/", client=client)
    with pytest.raises(InvalidURIError, match="names a folder"):
        list(IterableWrapper([("gs://folder-bucket/run/", b"data")]).save_by_gcs(client=client))
    assert gcs_emulator.names("folder-bucket") == []


def test_errors_never_hold_a_payload(gcs_emulator) -> None:
    payload = "x" * (8 * 1024 * 1024)
    for bad in ((payload, b"data"), (b"\x00" * (8 * 1024 * 1024), b"data")):
        with pytest.raises(InvalidURIError) as caught:
            list(IterableWrapper([bad]).save_by_gcs(client=gcs_emulator.client_config))
        assert len(str(caught.value)) < 1000  # torch adds the DataPipe's repr
    with pytest.raises(InvalidURIError) as caught:
        list(GCSFileLoaderIterDataPipe([("gs://bucket/a", payload)], client=gcs_emulator.client_config))
    assert len(str(caught.value)) < 1000  # torch adds the DataPipe's repr


def test_settings_are_frozen_and_pickle() -> None:
    settings = [ClientConfig(endpoint="http://127.0.0.1:1", user_project="p"), RetryConfig(), TransferConfig()]
    for setting in settings:
        assert pickle.loads(pickle.dumps(setting)) == setting
    with pytest.raises(AttributeError):
        settings[0].endpoint = "http://other"  # type: ignore[misc]
