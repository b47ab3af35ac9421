"""The front's benchmark mode: list pages answered from a snapshot must match the emulator's own."""

from __future__ import annotations

import uuid

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdata_gcs import GCSFileListerIterDataPipe
from torchdata_gcs.testing import Emulator, GCSFront
from torchdata_gcs.testing._list_index import ListingIndex, parse_fields

ALPHABET = st.sampled_from(["a", "b", "z", "/", "-", "0", "é", "日", "😀", "~"])
NAMES = st.lists(st.text(ALPHABET, min_size=1, max_size=6), min_size=0, max_size=25, unique=True).map(
    lambda names: [name for name in names if name not in (".", "..")]
)
BOUNDS = st.one_of(st.none(), st.text(ALPHABET, max_size=3))


def _list_all(endpoint: str, bucket: str, params: dict[str, str]) -> list[str]:
    """Every name a paginated listing returns, following nextPageToken."""
    names: list[str] = []
    params = dict(params)
    while True:
        page = requests.get(f"{endpoint}/storage/v1/b/{bucket}/o", params=params, timeout=30).json()
        names += [item["name"] for item in page.get("items", [])]
        if not page.get("nextPageToken"):
            return names
        params["pageToken"] = page["nextPageToken"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=NAMES, prefix=BOUNDS, start=BOUNDS, end=BOUNDS, page_size=st.integers(1, 4))
def test_index_pages_match_the_emulator(
    gcs_emulator: Emulator, names: list[str], prefix: str | None, start: str | None, end: str | None, page_size: int
) -> None:
    bucket = f"idx-{uuid.uuid4().hex[:12]}"
    gcs_emulator.seed(bucket, {name: name.encode() for name in names})
    params = {key: value for key, value in (("prefix", prefix), ("startOffset", start), ("endOffset", end)) if value}
    params["maxResults"] = str(page_size)
    with GCSFront(gcs_emulator.endpoint) as front:
        assert front.index_listings(bucket) == len(names)
        from_index = _list_all(front.endpoint, bucket, params)
        first_page = requests.get(f"{front.endpoint}/storage/v1/b/{bucket}/o", params=params, timeout=30).json()
        served = front.counts["list"]
    from_emulator = _list_all(gcs_emulator.endpoint, bucket, params)
    emulator_first = requests.get(f"{gcs_emulator.endpoint}/storage/v1/b/{bucket}/o", params=params, timeout=30).json()
    assert from_index == from_emulator
    assert [i["name"] for i in first_page.get("items", [])] == [i["name"] for i in emulator_first.get("items", [])]
    assert ("nextPageToken" in first_page) == ("nextPageToken" in emulator_first)
    pages = max(1, -(-len(from_index) // page_size))  # a page per page_size names, never an empty extra one
    assert served == pages + 1  # the full listing, then the first page again


def test_fields_trim_the_answer(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"1", "b": b"22"})
    with GCSFront(gcs_emulator.endpoint) as front:
        front.index_listings(gcs_bucket)
        page = requests.get(
            f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o",
            params={"fields": "items(name,size),nextPageToken", "maxResults": "1"},
            timeout=30,
        ).json()
    assert page["items"] == [{"name": "a", "size": "1"}] and page["nextPageToken"]
    assert parse_fields("kind,items(name , generation)") == {"kind": None, "items": {"name", "generation"}}
    with pytest.raises(ValueError):
        parse_fields("items(name")


def test_unsupported_requests_and_writes_fall_back_to_the_emulator(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"d/1": b"1", "d/2": b"2", "e": b"3"})
    with GCSFront(gcs_emulator.endpoint) as front:
        front.index_listings(gcs_bucket)
        listed = requests.get(f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o", params={"delimiter": "/"}, timeout=30)
        assert listed.json()["prefixes"] == ["d/"]  # delimiter: answered by the emulator
        bad = requests.get(f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o", params={"maxResults": "x"}, timeout=30)
        assert bad.status_code == 400
        url = f"gs://{gcs_bucket}/"
        assert list(GCSFileListerIterDataPipe(url, client=front.client_config)) == [url + "d/1", url + "d/2", url + "e"]
        requests.post(
            f"{front.endpoint}/upload/storage/v1/b/{gcs_bucket}/o",
            params={"uploadType": "media", "name": "f"},
            data=b"new",
            timeout=30,
        ).raise_for_status()
        assert list(GCSFileListerIterDataPipe(url, client=front.client_config))[-1] == url + "f"  # snapshot dropped


def test_index_sorts_like_gcs() -> None:
    index = ListingIndex([{"name": name} for name in ["b", "a/", "a", "é", "z", "😀"]])
    page = index.page({"maxResults": "10"})
    assert page is not None
    assert [item["name"] for item in page["items"]] == sorted(
        ["b", "a/", "a", "é", "z", "😀"], key=lambda n: n.encode()
    )
