"""list_files_by_gcs against the embedded emulator."""

from __future__ import annotations

import gc
import pickle
from urllib.parse import parse_qs, urlsplit

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import (
    ClientConfig,
    GCSFileListerIterDataPipe,
    InvalidURIError,
    NotFoundError,
    ObjectInfo,
    RetryConfig,
)
from torchdata_gcs._engines.listing import list_objects
from torchdata_gcs._ops.checksums import crc32c_base64
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.paging import ITEM_FIELDS, NAME_FIELDS
from torchdata_gcs.testing import Emulator, GCSFront

AWKWARD_NAMES = [
    "with space.txt",
    "ünïcødé/日本語.txt",
    "hash#tag.txt",
    "question?mark.txt",
    "per%25cent.txt",
    "plus+sign.txt",
    "double//slash.txt",
    "emoji😀.txt",
]


def lister(urls, client: ClientConfig, **kwargs) -> GCSFileListerIterDataPipe:
    return GCSFileListerIterDataPipe(urls, client=client, **kwargs)


def test_lists_in_name_order_with_metadata(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    objects = {f"data/{i:03d}.bin": bytes(range(i % 200)) * 3 for i in range(57)}
    gcs_emulator.seed(gcs_bucket, objects)
    listed = list(lister(f"gs://{gcs_bucket}/data/", client, with_metadata=True, page_size=10))
    assert [url for url, _ in listed] == [f"gs://{gcs_bucket}/{name}" for name in sorted(objects)]
    for url, info in listed:
        data = objects[url.split("/", 3)[3]]
        assert isinstance(info, ObjectInfo)
        assert info.size == len(data) and info.crc32c == crc32c_base64(data) and info.generation > 0


def test_matches_google_cloud_storage_listing(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    names = [f"{prefix}/{i}" for prefix in ("a", "b", "a b", "a-b", "ä") for i in range(7)] + AWKWARD_NAMES
    gcs_emulator.seed(gcs_bucket, {name: name.encode() for name in names})
    reference = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": gcs_emulator.endpoint}
    )
    expected = [f"gs://{gcs_bucket}/{blob.name}" for blob in reference.list_blobs(gcs_bucket)]
    assert list(lister(f"gs://{gcs_bucket}", client, page_size=3)) == expected
    assert expected == sorted(expected)


def test_awkward_names_round_trip(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {name: name.encode() for name in AWKWARD_NAMES})
    listed = list(lister(f"gs://{gcs_bucket}/", client))
    assert listed == sorted(f"gs://{gcs_bucket}/{name}" for name in AWKWARD_NAMES)
    for name in AWKWARD_NAMES:  # each listed URL also works as an exact input
        assert list(lister(f"gs://{gcs_bucket}/{name}", client)) == [f"gs://{gcs_bucket}/{name}"]


def test_a_listing_of_urls_asks_for_names_and_sizes_alone(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """Metadata that nothing reads is not sent: without ``with_metadata`` each item is a name and a size (which
    tells a folder placeholder), a page about a third of one with metadata."""
    gcs_emulator.seed(gcs_bucket, {"f/a": b"1", "f/b": b"22", "f/sub/": b"", "f/sub/c": b"333"})
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        urls = list(lister(f"gs://{gcs_bucket}/f/", front.client_config, page_size=2))
        names_only = len(front.recorded)
        described = list(lister(f"gs://{gcs_bucket}/f/", front.client_config, page_size=2, with_metadata=True))
        fields = [parse_qs(urlsplit(request.target).query)["fields"] for request in front.recorded]
    assert urls == [f"gs://{gcs_bucket}/f/{name}" for name in ("a", "b", "sub/c")]  # the placeholder skipped
    assert [(url, info.size) for url, info in described] == list(zip(urls, [1, 2, 3], strict=True))
    assert fields[:names_only] == [["items(name,size),nextPageToken"]] * names_only
    items = "items(name,size,generation,crc32c,storageClass),nextPageToken"
    assert fields[names_only:] == [[items]] * (len(fields) - names_only)


def test_object_urls_and_prefixes(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(
        gcs_bucket,
        {"data": b"x", "data/1": b"1", "data/sub/2": b"2", "database.csv": b"d", "folder/": b"", "folder/f": b"f"},
    )
    base = f"gs://{gcs_bucket}/"
    assert list(lister(base + "data", client)) == [base + "data", base + "data/1", base + "data/sub/2"]
    assert list(lister(base + "data/", client)) == [base + "data/1", base + "data/sub/2"]
    assert list(lister(base + "database.csv", client)) == [base + "database.csv"]
    assert list(lister(base + "folder", client)) == [base + "folder/f"]  # placeholder skipped
    assert list(lister(base, client, masks="*.csv")) == [base + "database.csv"]
    assert list(lister(base, client, masks=["1", "2"])) == [base + "data/1", base + "data/sub/2"]
    assert list(lister([base + "folder/", base + "data/"], client)) == [
        base + "folder/f",
        base + "data/1",
        base + "data/sub/2",
    ]


def test_an_empty_prefix_is_an_error_unless_allowed(gcs_bucket: str, client: ClientConfig) -> None:
    for url in (f"gs://{gcs_bucket}/nothing-here/", f"gs://{gcs_bucket}/nothing-here"):
        with pytest.raises(NotFoundError, match=url):
            list(lister(url, client))
        assert list(lister(url, client, allow_empty=True)) == []


def test_missing_bucket_raises_not_found(client: ClientConfig) -> None:
    for url in ("gs://no-such-bucket-1234/", "gs://no-such-bucket-1234/some/object"):
        with pytest.raises(NotFoundError) as info:
            list(lister(url, client))
        assert "no-such-bucket-1234" in str(info.value)
        assert isinstance(info.value, FileNotFoundError)


def test_bad_inputs_raise_typed_errors(client: ClientConfig) -> None:
    with pytest.raises(InvalidURIError):
        lister(["gs://ok-bucket/", "s3://other/"], client)
    with pytest.raises(InvalidURIError):
        list(IterableWrapper(["not a url"]).list_files_by_gcs(client=client))
    with pytest.raises(ValueError):
        lister("gs://ok-bucket/", client, page_size=1001)
    with pytest.raises(InvalidURIError, match="got int: 42"):
        lister(42, client)  # type: ignore[arg-type]


def test_two_pipelines_list_identically_and_pickle(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    gcs_emulator.seed(gcs_bucket, {f"k/{i}": b"v" for i in range(30)})
    first = IterableWrapper([f"gs://{gcs_bucket}/k/"]).list_files_by_gcs(client=client, page_size=7)
    second = GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/k/", client=client)
    clone = pickle.loads(pickle.dumps(first))
    assert list(first) == list(second) == list(clone)
    assert len(list(first)) == 30


@pytest.mark.parametrize("item_fields", [NAME_FIELDS, ITEM_FIELDS])
def test_listed_batches_hold_nothing_the_garbage_collector_tracks(
    gcs_emulator: Emulator, gcs_bucket: str, item_fields: str
) -> None:
    """A resource of strings is a dict the collector leaves alone; a pair holding one it never does. A listing of
    millions of names kept as pairs promotes them by the tens of thousands, and a full collection of the
    process's heap follows (in a listing of 100,000 names, a fifth of its time)."""
    gcs_emulator.seed(gcs_bucket, {f"data/{i:03d}": b"x" for i in range(25)} | {"data": b"exact"})
    with GCSFront(gcs_emulator.endpoint) as front:  # its snapshot keeps to ``fields`` as GCS does; the emulator not
        front.index_listings(gcs_bucket)
        client = Client(front.client_config, RetryConfig(deadline=60))
        batches = list(list_objects(client, gcs_bucket, "data", 10, concurrency=4, item_fields=item_fields))
    listed = [item for batch in batches for item in batch]
    assert [item["name"] for item in listed] == ["data", *(f"data/{i:03d}" for i in range(25))]
    assert [item for item in listed if gc.is_tracked(item)] == []
