"""The test front's bucket settings over real HTTP: what ``buckets.get`` reports, soft delete (deleted objects
listed only with ``softDeleted=true``, until their ``hardDeleteTime``) and the default event-based hold."""

from __future__ import annotations

import datetime
from urllib.parse import quote

import pytest
import requests

from torchdata_gcs.testing import Emulator, GCSFront

WEEK = 7 * 86400


def object_url(front: GCSFront, bucket: str, name: str) -> str:
    return f"{front.endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"


def listing(front: GCSFront, bucket: str, **params: object) -> requests.Response:
    return requests.get(f"{front.endpoint}/storage/v1/b/{bucket}/o", params=params, timeout=30)


def seconds(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_buckets_get_reports_the_settings_given_trimmed_to_fields(gcs_front: GCSFront, gcs_bucket: str) -> None:
    plain = requests.get(f"{gcs_front.endpoint}/storage/v1/b/{gcs_bucket}", timeout=30).json()
    assert plain["storageClass"] == "STANDARD" and "lifecycle" not in plain
    rules = {"rule": [{"action": {"type": "Delete"}, "condition": {"age": 30}}]}
    gcs_front.bucket_overlay.update(
        gcs_bucket, {"storageClass": "COLDLINE", "autoclass": {"enabled": True}, "lifecycle": rules}
    )
    answer = requests.get(f"{gcs_front.endpoint}/storage/v1/b/{gcs_bucket}", timeout=30).json()
    assert (answer["storageClass"], answer["autoclass"], answer["lifecycle"]) == ("COLDLINE", {"enabled": True}, rules)
    trimmed = requests.get(
        f"{gcs_front.endpoint}/storage/v1/b/{gcs_bucket}", params={"fields": "location,lifecycle"}, timeout=30
    ).json()
    assert trimmed["lifecycle"] == rules and "autoclass" not in trimmed
    with pytest.raises(ValueError, match="not a bucket setting the front models: website"):
        gcs_front.bucket_overlay.update(gcs_bucket, {"website": {}})


def test_a_delete_under_soft_delete_is_listed_only_with_soft_deleted_until_it_expires(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    gcs_front.bucket_overlay.update(gcs_bucket, {"softDeletePolicy": {"retentionDurationSeconds": str(WEEK)}})
    gcs_emulator.seed(gcs_bucket, {"tmp/a": b"aaaa", "tmp/b": b"bb", "keep": b"k"})
    generation = requests.get(object_url(gcs_front, gcs_bucket, "tmp/a"), timeout=30).json()["generation"]
    for name in ("tmp/a", "tmp/b"):
        assert requests.delete(object_url(gcs_front, gcs_bucket, name), timeout=30).status_code == 204
    assert requests.delete(object_url(gcs_front, gcs_bucket, "tmp/a"), timeout=30).status_code == 404

    live = listing(gcs_front, gcs_bucket).json()
    assert [item["name"] for item in live["items"]] == ["keep"]
    page = listing(gcs_front, gcs_bucket, softDeleted="true", prefix="tmp/", maxResults=1)
    assert page.status_code == 200
    first = page.json()
    assert [item["name"] for item in first["items"]] == ["tmp/a"] and first["nextPageToken"]
    item = first["items"][0]
    assert (item["generation"], item["size"]) == (generation, "4")
    assert seconds(item["hardDeleteTime"]) - seconds(item["softDeleteTime"]) == pytest.approx(WEEK, abs=1)
    rest = listing(gcs_front, gcs_bucket, softDeleted="true", prefix="tmp/", pageToken=first["nextPageToken"]).json()
    assert [item["name"] for item in rest["items"]] == ["tmp/b"] and "nextPageToken" not in rest

    refused = listing(gcs_front, gcs_bucket, softDeleted="true", versions="true")
    assert refused.status_code == 400
    assert listing(gcs_front, "no-such-bucket-here", softDeleted="true").status_code == 404

    gcs_front.bucket_overlay.update(gcs_bucket, {"softDeletePolicy": {"retentionDurationSeconds": "0"}})
    assert requests.delete(object_url(gcs_front, gcs_bucket, "keep"), timeout=30).status_code == 204
    kept = listing(gcs_front, gcs_bucket, softDeleted="true").json()["items"]
    assert [item["name"] for item in kept] == ["tmp/a", "tmp/b"]  # soft delete turned off spares only later deletes


def test_a_refused_delete_keeps_no_soft_deleted_copy(gcs_front: GCSFront, gcs_bucket: str) -> None:
    gcs_front.bucket_overlay.update(gcs_bucket, {"softDeletePolicy": {"retentionDurationSeconds": str(WEEK)}})
    created = requests.post(
        f"{gcs_front.endpoint}/upload/storage/v1/b/{gcs_bucket}/o",
        params={"uploadType": "media", "name": "x"},
        data=b"x",
        timeout=30,
    ).json()
    stale = int(created["generation"]) + 1
    answer = requests.delete(object_url(gcs_front, gcs_bucket, "x"), params={"ifGenerationMatch": stale}, timeout=30)
    assert answer.status_code == 412
    assert gcs_front.bucket_overlay.soft_deleted(gcs_bucket) == []


def test_objects_created_under_a_default_event_based_hold_cannot_be_deleted(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"before": b"b"})
    gcs_front.bucket_overlay.update(gcs_bucket, {"defaultEventBasedHold": True})
    gcs_emulator.seed(gcs_bucket, {"after": b"a"})
    described = requests.get(object_url(gcs_front, gcs_bucket, "after"), timeout=30).json()
    assert described["eventBasedHold"] is True
    assert "eventBasedHold" not in requests.get(object_url(gcs_front, gcs_bucket, "before"), timeout=30).json()

    answer = requests.delete(object_url(gcs_front, gcs_bucket, "after"), timeout=30)
    assert answer.status_code == 403
    error = answer.json()["error"]
    assert error["message"] == (
        f"Object '{gcs_bucket}/after' is under active Event-Based hold and cannot be deleted, overwritten or "
        "archived until hold is removed."
    )
    by_generation = requests.delete(
        object_url(gcs_front, gcs_bucket, "after"), params={"generation": described["generation"]}, timeout=30
    )
    assert by_generation.status_code == 403
    assert requests.delete(object_url(gcs_front, gcs_bucket, "before"), timeout=30).status_code == 204
    assert gcs_emulator.names(gcs_bucket) == ["after"]
