"""gcsfs's ``merge`` and ``mv_file``, over HTTP to the emulator: ``merge`` concatenates objects by one GCS
compose, ``mv_file`` moves one object; both are safe to retry when an answer is lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from torchdata_gcs import RetryConfig
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fs(gcs_emulator: Emulator) -> Iterator[GCSFileSystem]:
    """Through the front, which answers a compose of a missing source 404 as GCS does (the emulator: 500)."""
    with GCSFront(gcs_emulator.endpoint) as front:
        yield GCSFileSystem(client=front.client_config, skip_instance_cache=True)


def test_merge_concatenates_in_the_order_given_and_replaces_the_target(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe({f"{gcs_bucket}/part-{i}": bytes([65 + i]) * (i + 1) for i in range(3)})
    fs.pipe_file(f"{gcs_bucket}/all", b"old")
    fs.merge(f"gs://{gcs_bucket}/all", [f"gs://{gcs_bucket}/part-2", f"{gcs_bucket}/part-0", f"{gcs_bucket}/part-1"])
    assert fs.cat_file(f"{gcs_bucket}/all") == b"CCCABB"
    assert fs.size(f"{gcs_bucket}/all") == 6


def test_merge_refuses_what_one_compose_cannot_do(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe_file(f"{gcs_bucket}/a", b"a")
    with pytest.raises(ValueError, match="1 to 32"):
        fs.merge(f"{gcs_bucket}/all", [f"{gcs_bucket}/a"] * 33)
    with pytest.raises(ValueError, match="1 to 32"):
        fs.merge(f"{gcs_bucket}/all", [])
    with pytest.raises(ValueError, match="bucket only"):
        fs.merge(f"{gcs_bucket}/all", [f"{gcs_bucket}/a", "other-bucket/b"])
    with pytest.raises(FileNotFoundError):
        fs.merge(f"{gcs_bucket}/all", [f"{gcs_bucket}/a", f"{gcs_bucket}/missing"])
    assert not fs.exists(f"{gcs_bucket}/all")


def test_mv_file_moves_one_object(fs: GCSFileSystem, gcs_bucket: str) -> None:
    fs.pipe_file(f"{gcs_bucket}/from.txt", b"moved")
    fs.mv_file(f"gs://{gcs_bucket}/from.txt", f"gs://{gcs_bucket}/sub/to.txt")
    assert fs.cat_file(f"{gcs_bucket}/sub/to.txt") == b"moved"
    assert not fs.exists(f"{gcs_bucket}/from.txt")
    with pytest.raises(FileNotFoundError):
        fs.mv_file(f"{gcs_bucket}/from.txt", f"{gcs_bucket}/again.txt")


def test_merge_and_mv_file_with_lost_answers_resend_nothing_unconditionally(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    with GCSFront(gcs_emulator.endpoint, lose_write_answers=True) as front:
        fs = GCSFileSystem(client=front.client_config, retry=RetryConfig(initial_delay=0.01), skip_instance_cache=True)
        fs.pipe({f"{gcs_bucket}/a": b"al", f"{gcs_bucket}/b": b"pha"})
        fs.merge(f"{gcs_bucket}/ab", [f"{gcs_bucket}/a", f"{gcs_bucket}/b"])
        fs.mv_file(f"{gcs_bucket}/ab", f"{gcs_bucket}/alpha")
        assert front.faults_injected["lost_answer"] >= 4
        assert front.unconditional_resends == []
    assert gcs_emulator.read(gcs_bucket, "alpha") == b"alpha"
    assert sorted(gcs_emulator.names(gcs_bucket)) == ["a", "alpha", "b"]
