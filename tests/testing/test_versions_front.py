"""The test front deletes a version named by its generation as GCS does, over real HTTP: that version goes for
good, live or noncurrent, the others stay, and a version that does not exist is answered 404 with nothing
deleted (the emulator deletes the live object whatever the generation)."""

from __future__ import annotations

from urllib.parse import quote

import pytest
import requests

from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def bucket(gcs_emulator: Emulator, gcs_bucket: str) -> str:
    name = f"{gcs_bucket}-v"
    answer = requests.post(
        f"{gcs_emulator.endpoint}/storage/v1/b", json={"name": name, "versioning": {"enabled": True}}, timeout=30
    )
    answer.raise_for_status()
    return name


def _write(front: GCSFront, bucket: str, name: str, data: bytes) -> int:
    answer = requests.post(
        f"{front.endpoint}/upload/storage/v1/b/{bucket}/o", params={"uploadType": "media", "name": name}, data=data
    )
    answer.raise_for_status()
    return int(answer.json()["generation"])


def _versions(front: GCSFront, bucket: str) -> list[int]:
    page = requests.get(f"{front.endpoint}/storage/v1/b/{bucket}/o", params={"versions": "true"}, timeout=30).json()
    return sorted(int(item["generation"]) for item in page.get("items", []))


def test_a_delete_by_generation_removes_that_version_only(gcs_front: GCSFront, bucket: str) -> None:
    old, live = _write(gcs_front, bucket, "d/o", b"old"), _write(gcs_front, bucket, "d/o", b"live")
    url = f"{gcs_front.endpoint}/storage/v1/b/{bucket}/o/{quote('d/o', safe='')}"
    missing = requests.delete(url, params={"generation": live + 1}, timeout=30)
    assert missing.status_code == 404 and _versions(gcs_front, bucket) == [old, live]
    assert requests.delete(url, params={"generation": old}, timeout=30).status_code == 204
    assert requests.get(url, params={"generation": old}, timeout=30).status_code == 404
    media = f"{gcs_front.endpoint}/download/storage/v1/b/{bucket}/o/{quote('d/o', safe='')}"
    assert requests.get(media, params={"alt": "media", "generation": old}, timeout=30).status_code == 404
    assert requests.get(media, params={"alt": "media"}, timeout=30).content == b"live"
    assert _versions(gcs_front, bucket) == [live]
    assert requests.delete(url, params={"generation": old}, timeout=30).status_code == 404
    assert requests.delete(url, params={"generation": live}, timeout=30).status_code == 204
    assert _versions(gcs_front, bucket) == [] and requests.get(url, timeout=30).status_code == 404
