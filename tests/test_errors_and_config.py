"""The exception tree and the settings: types, validation, pickling."""

from __future__ import annotations

import json
import pickle

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import (
    AccessDeniedError,
    ClientConfig,
    EndpointError,
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
from torchdata_gcs._transport.http import error_detail, error_for_status
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


def _json_error(message: str) -> str:
    """A 404 body of GCS's JSON API, as GCS words it."""
    error = {"message": message, "domain": "global", "reason": "notFound"}
    return json.dumps({"error": {"code": 404, "message": message, "errors": [error]}}, indent=2)


def _xml_error(code: str, message: str, details: str = "") -> str:
    """A 404 body of GCS's XML API."""
    extra = f"<Details>{details}</Details>" if details else ""
    return (
        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message>{extra}</Error>"
    )


NO_BUCKET = "The specified bucket does not exist."


@pytest.mark.parametrize(
    "url, body, message, named",
    [
        ("gs://bkt/a/b", _json_error(NO_BUCKET), "bucket 'bkt' does not exist (gs://bkt/a/b)", "gs://bkt/"),
        ("gs://bkt/", _json_error(NO_BUCKET), "bucket 'bkt' does not exist", "gs://bkt/"),
        ("gs://bkt/a", NO_BUCKET, "bucket 'bkt' does not exist (gs://bkt/a)", "gs://bkt/"),  # a media read's text body
        ("gs://bkt/a", _xml_error("NoSuchBucket", NO_BUCKET), "bucket 'bkt' does not exist (gs://bkt/a)", "gs://bkt/"),
        ("gs://bkt/a/b", _json_error("No such object: bkt/a/b"), "object gs://bkt/a/b does not exist", "gs://bkt/a/b"),
        ("gs://bkt/a", "No such object: bkt/a", "object gs://bkt/a does not exist", "gs://bkt/a"),
        (
            "gs://bkt/a",
            _xml_error("NoSuchKey", "The specified key does not exist.", "No such object: bkt/a"),
            "object gs://bkt/a does not exist",
            "gs://bkt/a",
        ),
        # what an emulator (and GCS in earlier years) answers for either: both are said
        ("gs://bkt/a", _json_error("Not Found"), "gs://bkt/a does not exist: no such object, or no bucket 'bkt'", None),
        ("gs://bkt/a", "Not Found\n", "gs://bkt/a does not exist: no such object, or no bucket 'bkt'", None),
        ("gs://bkt/", _json_error("Not Found"), "bucket 'bkt' does not exist", "gs://bkt/"),  # a bucket's own URL
        # another object than the one asked for (a compose's source), or no object at all: GCS's words
        (
            "gs://bkt/out",
            _json_error("No such object: bkt/src"),
            "GCS answered 404 (gs://bkt/out): No such object: bkt/src",
            None,
        ),
        (
            "gs://bkt/a",
            _xml_error("NoSuchUpload", "The requested upload was not found."),
            "GCS answered 404 (gs://bkt/a): NoSuchUpload: The requested upload was not found.",
            None,
        ),
    ],
)
def test_a_404_says_whether_the_bucket_or_the_object_is_missing(
    url: str, body: str, message: str, named: str | None
) -> None:
    error = error_for_status(404, url, error_detail(body))
    assert type(error) is NotFoundError and error.status == 404
    assert str(error).startswith(message), str(error)
    assert error.url == (named or url)


@pytest.mark.parametrize(
    "error",
    [
        NotFoundError("gone", url="gs://b/x", status=404),
        AccessDeniedError("no", url="gs://b/x", status=403),
        PreconditionFailedError("changed", url="gs://b/x", status=412),
        InvalidURIError("bad"),
        TransientError("busy", url="gs://b/x", status=429, retry_after=3.0),
        IntegrityError("crc", url="gs://b/x"),
        EndpointError("refused", url="http://127.0.0.1:1"),
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
        lambda: ClientConfig(completion_timeout=0),
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
