"""The composite upload strategy over real HTTP: parts as temporary objects, composed 32 at a time."""

from __future__ import annotations

import gc
import os
from dataclasses import replace

import pytest

from torchdata_gcs import ClientConfig, RetryConfig, UploadError
from torchdata_gcs._engines.upload import CompositeWriter
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.testing import Emulator, Fault, GCSFront

KiB = 1024
PART = 256 * KiB
FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


def writer(client, bucket: str, name: str, **settings) -> CompositeWriter:
    settings.setdefault("part_size", PART)
    return CompositeWriter(f"gs://{bucket}/{name}", client=Client(client, settings.pop("retry", None)), **settings)


def temporaries(emulator: Emulator, bucket: str) -> list[str]:
    return [name for name in emulator.names(bucket) if name.startswith(TEMPORARY_PREFIX)]


def test_many_parts_compose_through_intermediates(gcs_bucket: str, gcs_emulator: Emulator, gcs_front: GCSFront) -> None:
    data = os.urandom(40 * PART + 999)  # 41 parts: more than one compose call takes (32)
    with writer(gcs_front.client_config, gcs_bucket, "big.bin", max_parts_in_flight=8) as out:
        for start in range(0, len(data), 100_000):
            out.write(data[start : start + 100_000])
        assert "big.bin" not in gcs_emulator.names(gcs_bucket)  # nothing published before close
        assert len(temporaries(gcs_emulator, gcs_bucket)) >= 30  # parts are out as they fill
    assert gcs_emulator.read(gcs_bucket, "big.bin") == data
    assert out.generation and temporaries(gcs_emulator, gcs_bucket) == []
    assert gcs_front.counts["upload"] == 41
    assert gcs_front.counts["compose"] == 2 + 1  # two intermediates (32 + 9 parts), then the object
    assert gcs_front.counts["delete"] == 0  # each compose deleted its sources
    assert gcs_front.counts["list"] == 1  # and one listing found none left


def test_works_on_the_bare_emulator_and_small_payloads_take_one_request(
    gcs_bucket: str, gcs_emulator: Emulator
) -> None:
    data = os.urandom(3 * PART + 1)
    with writer(gcs_emulator.client_config, gcs_bucket, "bare.bin") as out:
        out.write(data)
    with writer(gcs_emulator.client_config, gcs_bucket, "small.bin") as small:
        small.write(b"tiny")
    assert gcs_emulator.read(gcs_bucket, "bare.bin") == data and gcs_emulator.read(gcs_bucket, "small.bin") == b"tiny"
    assert temporaries(gcs_emulator, gcs_bucket) == [] and out.generation and small.generation


def test_exception_inside_with_publishes_nothing_and_removes_parts(gcs_bucket: str, gcs_emulator: Emulator) -> None:
    with (
        pytest.raises(RuntimeError, match="diverged"),
        writer(gcs_emulator.client_config, gcs_bucket, "failed.bin") as out,
    ):
        out.write(os.urandom(10 * PART))
        assert temporaries(gcs_emulator, gcs_bucket)
        raise RuntimeError("diverged")
    assert gcs_emulator.names(gcs_bucket) == []


def test_dropped_writer_publishes_nothing_and_removes_parts(gcs_bucket: str, gcs_emulator: Emulator) -> None:
    out = writer(gcs_emulator.client_config, gcs_bucket, "dropped.bin")
    out.write(os.urandom(6 * PART))
    del out
    gc.collect()
    assert gcs_emulator.names(gcs_bucket) == []


def test_part_failures_are_retried_and_a_failing_part_aborts(gcs_bucket: str, gcs_emulator: Emulator) -> None:
    part_upload = r"POST /upload/.*part-00002&"
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match=part_upload, times=2)]) as front:
        data = os.urandom(5 * PART)
        with writer(front.client_config, gcs_bucket, "flaky.bin", retry=FAST_RETRY) as out:
            out.write(data)
        assert front.faults_injected["http_503"] == 2
    assert gcs_emulator.read(gcs_bucket, "flaky.bin") == data
    with (
        GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match=part_upload)]) as front,
        pytest.raises(UploadError, match="aborted"),
        writer(front.client_config, gcs_bucket, "doomed.bin", retry=replace(FAST_RETRY, deadline=1)) as out,
    ):
        out.write(os.urandom(5 * PART))
    assert gcs_emulator.names(gcs_bucket) == ["flaky.bin"]


def test_failed_compose_publishes_nothing(gcs_bucket: str, gcs_emulator: Emulator) -> None:
    with (
        GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="compose")]) as front,
        pytest.raises(Exception, match="permission"),
        writer(front.client_config, gcs_bucket, "refused.bin") as out,
    ):
        out.write(os.urandom(3 * PART))
    assert gcs_emulator.names(gcs_bucket) == []


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="part_size"):
        CompositeWriter("gs://bucket/x", client=Client(ClientConfig()), part_size=PART - 1)
