"""A bucket that does not exist is named as such, apart from an object that does not exist, on every
path: listing, loading, checkpoints and fsspec. Through ``GCSFront`` the answers are GCS's own 404
bodies; the bare emulator answers every 404 alike, and the message then stays true, if less specific."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import ClientConfig, GCSMapDataset, NotFoundError, checkpoint
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

MISSING = "no-such-bucket-4f1c"
Read = Callable[[ClientConfig, str], object]


def message_of(error: BaseException) -> str:
    """The error's own message (torch adds a line naming the DataPipe that raised it)."""
    return str(error).splitlines()[0]


def list_prefix(client: ClientConfig, url: str) -> object:
    return list(IterableWrapper([url]).list_files_by_gcs(client=client))


def load(client: ClientConfig, url: str) -> object:
    return [stream.read() for _, stream in IterableWrapper([url]).load_files_by_gcs(client=client)]


def load_skipping_missing(client: ClientConfig, url: str) -> object:
    return list(IterableWrapper([url]).load_files_by_gcs(client=client, skip_missing=True))


def dataset_skipping_missing(client: ClientConfig, url: str) -> object:
    return GCSMapDataset.from_objects([url], client=client, skip_missing=True)


def load_checkpoint(client: ClientConfig, url: str) -> object:
    return checkpoint.load(url, client=client)


def fsspec_cat(client: ClientConfig, url: str) -> object:
    return GCSFileSystem(client=client, skip_instance_cache=True).cat(url)


def fsspec_ls(client: ClientConfig, url: str) -> object:
    return GCSFileSystem(client=client, skip_instance_cache=True).ls(url)


@pytest.mark.parametrize(
    "read, url",
    [
        (list_prefix, f"gs://{MISSING}/train/"),
        (load, f"gs://{MISSING}/train/a.bin"),
        (load_skipping_missing, f"gs://{MISSING}/train/a.bin"),  # a missing bucket is never skipped
        (dataset_skipping_missing, f"gs://{MISSING}/train/a.bin"),
        (load_checkpoint, f"gs://{MISSING}/ckpt.pt"),
        (fsspec_cat, f"gs://{MISSING}/train/a.bin"),
        (fsspec_ls, f"gs://{MISSING}/train/"),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_a_missing_bucket_is_named(read: Read, url: str, gcs_front: GCSFront) -> None:
    with pytest.raises(NotFoundError) as info:
        read(gcs_front.client_config, url)
    message = message_of(info.value)
    assert message.startswith(f"bucket '{MISSING}' does not exist"), message
    assert info.value.url == f"gs://{MISSING}/" and info.value.status == 404
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize("read", [load, load_checkpoint, fsspec_cat], ids=lambda read: read.__name__)
def test_a_missing_object_is_named_apart_from_its_bucket(
    read: Read, gcs_front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"here.bin": b"1"})
    url = f"gs://{gcs_bucket}/gone.bin"
    with pytest.raises(NotFoundError) as info:
        read(gcs_front.client_config, url)
    assert message_of(info.value) == f"object {url} does not exist"
    assert info.value.url == url and "bucket" not in message_of(info.value)


@pytest.mark.parametrize("read", [load, load_checkpoint, fsspec_cat], ids=lambda read: read.__name__)
def test_the_bare_emulator_still_gives_a_true_message(read: Read, client: ClientConfig, gcs_bucket: str) -> None:
    """fake-gcs-server answers "Not Found" for a missing bucket and a missing object alike: the message
    names the URL and both possibilities, and never claims the one it cannot know."""
    for url in (f"gs://{MISSING}/a.bin", f"gs://{gcs_bucket}/a.bin"):
        with pytest.raises(NotFoundError) as info:
            read(client, url)
        message = message_of(info.value)
        assert url in message and "does not exist" in message, message
        assert not message.startswith(("bucket", "object")), message


def test_the_bare_emulator_listing_a_missing_bucket_names_it(client: ClientConfig) -> None:
    """A listing answered 404 can only mean the bucket, whatever the answer's text."""
    with pytest.raises(NotFoundError) as info:
        list_prefix(client, f"gs://{MISSING}/train/")
    assert message_of(info.value).startswith(f"bucket '{MISSING}' does not exist")
    assert info.value.url == f"gs://{MISSING}/"
