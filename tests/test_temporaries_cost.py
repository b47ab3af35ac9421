"""Temporary objects cost nothing beyond their minutes: the composite writer writes its parts as Standard
whatever the bucket's default class, and has each compose delete its sources (``deleteSourceObjects``), so
no part is kept by soft delete, billed a minimum storage duration or deleted by a request of its own.
The front gives new objects the bucket's default class and carries ``deleteSourceObjects`` out, as GCS
does; the emulator does neither."""

from __future__ import annotations

import json
import logging
import random

import pytest
import requests

from torchdata_gcs import RetryConfig
from torchdata_gcs._engines.upload import CompositeWriter
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(180)

KiB = 1024
FAST_RETRY = RetryConfig(initial_delay=0.01, max_delay=0.05)
COLD_WITH_SOFT_DELETE = {"storageClass": "NEARLINE", "softDeletePolicy": {"retentionDurationSeconds": 604800}}


def storage_class(front: GCSFront, bucket: str, name: str) -> str:
    answer = requests.get(f"{front.endpoint}/storage/v1/b/{bucket}/o/{name}", timeout=10)
    answer.raise_for_status()
    return str(answer.json()["storageClass"])


def compose(front: GCSFront, bucket: str, name: str, sources: list[str], **extra: object) -> requests.Response:
    body = {"sourceObjects": [{"name": source} for source in sources], **extra}
    return requests.post(f"{front.endpoint}/storage/v1/b/{bucket}/o/{name}/compose", json=body, timeout=10)


def test_the_front_gives_new_objects_the_bucket_default_class(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    with GCSFront(gcs_emulator.endpoint) as front:
        front.bucket_overlay.update(gcs_bucket, {"storageClass": "COLDLINE"})
        client = Client(front.client_config, FAST_RETRY)
        client.create(gcs_bucket, "default", b"takes the bucket's class")
        client.create(gcs_bucket, "named", b"keeps its own", storage_class="STANDARD")
        assert storage_class(front, gcs_bucket, "default") == "COLDLINE"
        assert storage_class(front, gcs_bucket, "named") == "STANDARD"
        assert gcs_emulator.read(gcs_bucket, "default") == b"takes the bucket's class"  # the body survived


def test_a_compose_that_deletes_its_sources_leaves_no_soft_deleted_copy(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"first ", "b": b"second"})
    with GCSFront(gcs_emulator.endpoint) as front:
        front.bucket_overlay.update(gcs_bucket, COLD_WITH_SOFT_DELETE)
        answer = compose(front, gcs_bucket, "ab", ["a", "b"], deleteSourceObjects=True)
        assert answer.status_code == 200, answer.text
        assert gcs_emulator.names(gcs_bucket) == ["ab"]
        assert gcs_emulator.read(gcs_bucket, "ab") == b"first second"
        assert front.bucket_overlay.soft_deleted(gcs_bucket) == []


def test_a_compose_that_would_delete_held_sources_is_refused(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    with GCSFront(gcs_emulator.endpoint) as front:
        front.bucket_overlay.update(gcs_bucket, {"defaultEventBasedHold": True})
        gcs_emulator.seed(gcs_bucket, {"a": b"held ", "b": b"too"})
        refused = compose(front, gcs_bucket, "ab", ["a", "b"], deleteSourceObjects=True)
        assert refused.status_code == 403 and "Event-Based hold" in refused.text
        assert gcs_emulator.names(gcs_bucket) == ["a", "b"]
        assert compose(front, gcs_bucket, "ab", ["a", "b"]).status_code == 200  # keeping them is allowed


def test_a_composite_checkpoint_in_a_cold_bucket_leaves_nothing_billed(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = random.Random(5).randbytes(34 * 256 * KiB + 7)  # 35 parts: a level of intermediates as well
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        front.bucket_overlay.update(gcs_bucket, COLD_WITH_SOFT_DELETE)
        with CompositeWriter(
            f"gs://{gcs_bucket}/ckpt.pt", client=Client(front.client_config, FAST_RETRY), part_size=256 * KiB
        ) as writer:
            writer.write(data)
        assert gcs_emulator.read(gcs_bucket, "ckpt.pt") == data
        assert gcs_emulator.names(gcs_bucket) == ["ckpt.pt"]
        assert front.bucket_overlay.soft_deleted(gcs_bucket) == []  # no part kept a week by soft delete
        assert front.counts["delete"] == 0 and front.counts["list"] == 1  # one listing found nothing left
        uploads = [r for r in front.recorded if r.target.startswith(f"/upload/storage/v1/b/{gcs_bucket}/o")]
        assert len(uploads) == 35 and all(b'"storageClass": "STANDARD"' in r.body for r in uploads)
        composes = [json.loads(r.body) for r in front.recorded if r.target.split("?")[0].endswith("/compose")]
        assert len(composes) == 3 and all(c.get("deleteSourceObjects") is True for c in composes)
        # GCS gives a composite its sources' class: the checkpoint is Standard too, not Nearline
        assert storage_class(front, gcs_bucket, "ckpt.pt") == "STANDARD"


def test_held_temporaries_are_composed_without_deleting_and_reported(
    gcs_emulator: Emulator, gcs_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    data = random.Random(6).randbytes(3 * 256 * KiB + 1)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        front.bucket_overlay.update(gcs_bucket, {"defaultEventBasedHold": True})
        with (
            caplog.at_level(logging.INFO, logger="torchdata_gcs"),
            CompositeWriter(
                f"gs://{gcs_bucket}/ckpt.pt", client=Client(front.client_config, FAST_RETRY), part_size=256 * KiB
            ) as writer,
        ):
            writer.write(data)
        assert gcs_emulator.read(gcs_bucket, "ckpt.pt") == data
        composes = [json.loads(r.body) for r in front.recorded if r.target.split("?")[0].endswith("/compose")]
        assert [c.get("deleteSourceObjects", False) for c in composes] == [True, False]
        left = [name for name in gcs_emulator.names(gcs_bucket) if name.startswith(TEMPORARY_PREFIX)]
        assert len(left) == 4  # held: GCS refuses their deletes too; `clean` reports them
        assert any("4 temporary parts" in record.getMessage() for record in caplog.records)


def test_temporaries_are_deleted_where_the_server_ignores_delete_source_objects(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket("ignores-deletes")
    data = random.Random(7).randbytes(2 * 256 * KiB + 3)
    with CompositeWriter(
        "gs://ignores-deletes/o", client=Client(gcs_emulator.client_config, FAST_RETRY), part_size=256 * KiB
    ) as writer:
        writer.write(data)
    assert gcs_emulator.names("ignores-deletes") == ["o"]  # the emulator kept the parts; the listing found them
