"""What ``doctor`` and ``clean`` tell users about what a bucket costs them: the default storage class, Autoclass,
the default event-based hold and lifecycle rules (with the rules to add, as the JSON gcloud takes), and the
soft-deleted temporaries that stay billed until they expire."""

from __future__ import annotations

import datetime
import json
import re
import time

import pytest

from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.cli import main
from torchdata_gcs.cli.bucket_settings import bucket_settings
from torchdata_gcs.testing import Emulator, Fault, GCSFront

WEEK = 7 * 86400
ABORT = {"action": {"type": "AbortIncompleteMultipartUpload"}, "condition": {"age": 3}}
DELETE_TEMPORARIES = {"action": {"type": "Delete"}, "condition": {"age": 2, "matchesPrefix": [TEMPORARY_PREFIX]}}
COLD_LOGS = {"action": {"type": "SetStorageClass", "storageClass": "COLDLINE"}, "condition": {"age": 90}}


def printed_json(out: str) -> dict:
    """The JSON document printed whole between a line "{" and a line "}"."""
    lines = out.splitlines()
    start = lines.index("{")
    return json.loads("\n".join(lines[start : lines.index("}", start) + 1]))


def fact(out: str, name: str) -> str:
    """The value and meaning printed for bucket setting ``name``."""
    line = next(line for line in out.splitlines() if line.startswith(f"  {name}  "))
    return " ".join(line[len(name) + 2 :].split())


def rules_by_action(document: dict) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for rule in document["lifecycle"]["rule"]:
        found.setdefault(rule["action"]["type"], []).append(rule)
    return found


def test_doctor_says_what_a_cold_held_bucket_without_lifecycle_costs_and_prints_the_rules_to_add(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with GCSFront(gcs_emulator.endpoint) as front:
        front.bucket_overlay.update(gcs_bucket, {"storageClass": "NEARLINE", "defaultEventBasedHold": True})
        code = main(["--endpoint", front.endpoint, "doctor", f"gs://{gcs_bucket}/data/"])
    out = capsys.readouterr().out

    storage_class = fact(out, "default storage class")
    assert storage_class.startswith("NEARLINE ") and "30 days" in storage_class
    assert "torchdata-gcs writes its own temporary objects as Standard" in storage_class
    assert fact(out, "autoclass").startswith("off ")
    hold = fact(out, "event-based hold")
    assert hold.startswith("on ") and "undeletable" in hold and "load_files_by_gcs" in hold
    assert fact(out, "lifecycle").startswith("none ")

    # Every object doctor wrote is held: its delete is refused, and the hold is named as the reason.
    assert code == 1
    assert re.search(r"^delete +REFUSED +.*Event-Based hold", out, re.MULTILINE), out
    assert "problem: delete REFUSED: the bucket's default event-based hold" in out
    assert "could not remove gs://" in out

    assert f"gcloud storage buckets update gs://{gcs_bucket} --lifecycle-file=" in out
    document = printed_json(out)
    by_action = rules_by_action(document)
    assert set(by_action) == {"AbortIncompleteMultipartUpload", "Delete"}
    (abort,) = by_action["AbortIncompleteMultipartUpload"]
    (delete,) = by_action["Delete"]
    assert isinstance(abort["condition"]["age"], int) and abort["condition"]["age"] >= 1
    assert delete["condition"]["matchesPrefix"] == [TEMPORARY_PREFIX]
    assert isinstance(delete["condition"]["age"], int) and delete["condition"]["age"] >= 1
    assert set(abort["condition"]) == {"age"} and set(delete["condition"]) == {"age", "matchesPrefix"}


def test_doctor_with_the_rules_in_place_recommends_none_and_names_autoclass(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lifecycle = {"rule": [COLD_LOGS, ABORT, DELETE_TEMPORARIES]}
    settings = {"autoclass": {"enabled": True, "terminalStorageClass": "ARCHIVE"}, "lifecycle": lifecycle}
    with GCSFront(gcs_emulator.endpoint) as front:
        front.bucket_overlay.update(gcs_bucket, settings)
        code = main(["--endpoint", front.endpoint, "doctor", f"gs://{gcs_bucket}"])
    out = capsys.readouterr().out
    assert code == 0, out
    autoclass = fact(out, "autoclass")
    assert autoclass.startswith("on, down to ARCHIVE ") and "compose_shards_by_gcs" in autoclass
    rules = fact(out, "lifecycle")
    assert rules.startswith("3 rules ") and "SetStorageClass COLDLINE if age 90" in rules
    assert "covers torchdata-gcs's temporary objects and unfinished multipart uploads" in rules
    assert "--lifecycle-file" not in out and "{" not in out.splitlines()


def test_doctor_without_storage_buckets_get_says_the_costs_could_not_be_read(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with GCSFront(gcs_emulator.endpoint, object_only=True) as front:
        front.bucket_overlay.update(gcs_bucket, {"storageClass": "ARCHIVE"})
        assert main(["--endpoint", front.endpoint, "doctor", f"gs://{gcs_bucket}"]) == 0
    out = capsys.readouterr().out
    for name in ("default storage class", "autoclass", "event-based hold", "lifecycle"):
        assert fact(out, name) == "unknown (no storage.buckets.get)", name
    assert "lifecycle rules not checked: reading them needs storage.buckets.get" in out
    assert "--lifecycle-file" not in out


def test_the_rules_to_add_keep_the_bucket_s_own_rules() -> None:
    """``--lifecycle-file`` replaces the whole configuration: the printed one holds the bucket's rules too."""
    from torchdata_gcs.cli.lifecycle_rules import missing_rules

    assert missing_rules({"rule": [ABORT, DELETE_TEMPORARIES]}) == []
    narrow = {"action": {"type": "Delete"}, "condition": {"age": 2, "matchesPrefix": ["logs/"]}}
    everything = {"action": {"type": "Delete"}, "condition": {"age": 30}}
    assert [rule["action"]["type"] for rule in missing_rules({"rule": [narrow, ABORT]})] == ["Delete"]
    assert missing_rules({"rule": [everything, ABORT]}) == []
    facts = {
        f.name: f
        for f in bucket_settings({"lifecycle": {"rule": [COLD_LOGS, narrow]}, "storageClass": "STANDARD"}, None)
    }
    assert facts["lifecycle"].value == "2 rules"
    assert "missing: the rules that remove torchdata-gcs's leftovers (below)" in facts["lifecycle"].meaning
    assert facts["default storage class"].value == "STANDARD"
    assert "no minimum storage duration" in facts["default storage class"].meaning
    archive = {f.name: f for f in bucket_settings({"storageClass": "ARCHIVE"}, None)}["default storage class"]
    assert "365 days" in archive.meaning


# -- clean -----------------------------------------------------------------------------------------


def soft_delete_front(gcs_emulator: Emulator, bucket: str) -> GCSFront:
    front = GCSFront(gcs_emulator.endpoint)
    front.bucket_overlay.update(bucket, {"softDeletePolicy": {"retentionDurationSeconds": str(WEEK)}})
    return front


def test_clean_lists_the_soft_deleted_temporaries_it_leaves_billed_and_when_they_expire(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/{i:09d}" for i in range(3)]
    gcs_emulator.seed(gcs_bucket, {**{name: b"x" * 1000 for name in names}, "data/keep.bin": b"keep"})
    with soft_delete_front(gcs_emulator, gcs_bucket) as front:
        endpoint = ["--endpoint", front.endpoint]
        assert main([*endpoint, "clean", f"gs://{gcs_bucket}", "--older-than", "0s"]) == 0
        out = capsys.readouterr().out
        expires = max(item["hardDeleteTime"] for item in front.bucket_overlay.soft_deleted(gcs_bucket))
        assert "deleted 3 temporary object(s)" in out
        assert gcs_emulator.names(gcs_bucket) == ["data/keep.bin"]
        line = next(line for line in out.splitlines() if "soft-deleted" in line)
        assert line.startswith(
            f"3 soft-deleted temporary object(s), 2.9 KiB, under gs://{gcs_bucket}/{TEMPORARY_PREFIX} stay billed "
            f"until they expire, the last at {expires}"
        ), line
        assert "no request removes them sooner" in line

        # Deleting data that is not a temporary object leaves it out; a later run still reports what is kept.
        time.sleep(0.01)
        assert main([*endpoint, "clean", f"gs://{gcs_bucket}", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "would delete 0 temporary object(s)" in out
        assert f"3 soft-deleted temporary object(s), 2.9 KiB, under gs://{gcs_bucket}/{TEMPORARY_PREFIX}" in out
    hard = datetime.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
    assert hard - time.time() == pytest.approx(WEEK, abs=60)


def test_clean_with_nothing_soft_deleted_says_so(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with GCSFront(gcs_emulator.endpoint) as front:
        assert main(["--endpoint", front.endpoint, "clean", f"gs://{gcs_bucket}"]) == 0
    assert f"no soft-deleted temporary objects under gs://{gcs_bucket}/{TEMPORARY_PREFIX}\n" in capsys.readouterr().out


def test_clean_still_cleans_when_the_soft_deleted_listing_is_refused(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/{i:09d}" for i in range(2)]
    gcs_emulator.seed(gcs_bucket, {name: b"x" for name in names})
    with soft_delete_front(gcs_emulator, gcs_bucket) as front:
        front.set_faults([Fault("http_403", match=r"softDeleted=true")])
        assert main(["--endpoint", front.endpoint, "clean", f"gs://{gcs_bucket}", "--older-than", "0s"]) == 0
        assert front.faults_injected["http_403"] == 1
    out = capsys.readouterr().out
    assert "deleted 2 temporary object(s)" in out and gcs_emulator.names(gcs_bucket) == []
    line = next(line for line in out.splitlines() if "soft-deleted" in line)
    assert line.startswith("soft-deleted temporary objects not listed (storage.objects.list refused): "), line


def test_clean_against_an_endpoint_that_ignores_soft_deleted_does_not_count_live_objects(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """fake-gcs-server answers ``softDeleted=true`` with the live objects: they carry no ``softDeleteTime``."""
    gcs_emulator.seed(gcs_bucket, {f"{TEMPORARY_PREFIX}job/1": b"live"})
    assert main(["--endpoint", gcs_emulator.endpoint, "clean", f"gs://{gcs_bucket}", "--older-than", "1d"]) == 0
    out = capsys.readouterr().out
    assert "soft-deleted temporary objects not listed: the endpoint answered softDeleted=true with live objects" in out
    assert "1 soft-deleted" not in out
