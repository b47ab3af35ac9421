"""A write's outcome is what GCS did, not what its answer seemed to say: a single-request upload is checked
against the crc32c GCS reports for what it stored, an upload whose every answer is cut off is looked for
before it is declared failed, and a DELETE answered with a page that is not GCS's does not count as done."""

from __future__ import annotations

import io
import time

import pytest
import torch

from torchdata_gcs import IntegrityError, RetryConfig, TransientError, checkpoint
from torchdata_gcs._ops.client import Client
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

pytestmark = pytest.mark.timeout(120)

FAST_RETRY = RetryConfig(max_attempts=4, initial_delay=0.01, max_delay=0.05, deadline=5)


def saved(state: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def test_a_small_save_stored_damaged_raises_and_leaves_nothing_to_load(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    """One bit of the upload flipped on the way, by a server that does not check the crc32c sent with it
    (GCS would refuse it with 400; the emulator stores it): the crc32c reported back is compared."""
    url = f"gs://{gcs_bucket}/small.pt"
    gcs_front.set_faults([Fault("corrupt", match="upload", times=1)])
    started = time.monotonic()
    with pytest.raises(IntegrityError, match="it was deleted"):
        checkpoint.save({"w": torch.arange(1000.0)}, url, client=gcs_front.client_config, retry=FAST_RETRY)
    assert time.monotonic() - started < 30
    assert gcs_front.faults_injected["corrupt"] == 1 and gcs_front.counts["upload"] == 1
    assert gcs_emulator.names(gcs_bucket) == []  # the damaged version was deleted, by its generation
    gcs_front.set_faults([])
    checkpoint.save({"w": torch.arange(1000.0)}, url, client=gcs_front.client_config, retry=FAST_RETRY)
    assert torch.equal(checkpoint.load(url, client=gcs_front.client_config)["w"], torch.arange(1000.0))


def test_every_single_request_write_compares_the_crc32c_gcs_reports(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    client = Client(gcs_front.client_config, FAST_RETRY)
    gcs_front.set_faults([Fault("corrupt", match="upload", times=1)])
    with pytest.raises(IntegrityError, match=r"crc32c is .*, the bytes written have"):
        client.create(gcs_bucket, "marker", b"x" * 1000, if_generation_match=0)
    assert gcs_emulator.names(gcs_bucket) == []


def test_a_save_whose_every_answer_is_cut_off_finds_its_object(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    """The first upload replaces the checkpoint; its answer, and those of every retry (412), are cut off
    mid-body. The object holds exactly the bytes written, so the save succeeded."""
    url = f"gs://{gcs_bucket}/ckpt.pt"
    gcs_emulator.upload(gcs_bucket, "ckpt.pt", saved({"w": torch.zeros(3)}))
    gcs_front.set_faults([Fault("http_503", match="upload")])  # never carried out: a failure, nothing replaced
    with pytest.raises(TransientError):
        checkpoint.save({"w": torch.ones(3)}, url, client=gcs_front.client_config, retry=FAST_RETRY)
    assert torch.equal(checkpoint.load(url, client=gcs_front.client_config)["w"], torch.zeros(3))

    gcs_front.set_faults([Fault("truncate", match="upload")])
    started = time.monotonic()
    generation = checkpoint.save({"w": torch.ones(3)}, url, client=gcs_front.client_config, retry=FAST_RETRY)
    assert time.monotonic() - started < 30
    assert gcs_front.faults_injected["truncate"] == FAST_RETRY.max_attempts  # every answer was cut
    live = Client(gcs_emulator.client_config, FAST_RETRY).head(gcs_bucket, "ckpt.pt", "generation")
    assert live is not None and generation == int(live["generation"])
    assert torch.equal(checkpoint.load(url, client=gcs_front.client_config)["w"], torch.ones(3))


def test_a_delete_answered_with_an_html_page_is_not_done(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    """GCS answers a delete 204 with no body; a 200 with a captive portal's page says nothing of the object."""
    gcs_emulator.upload(gcs_bucket, "a.pt", b"a")
    fs = GCSFileSystem(client=gcs_front.client_config, retry=FAST_RETRY, skip_instance_cache=True)
    gcs_front.set_faults([Fault("html_200", match="delete")])
    started = time.monotonic()
    with pytest.raises(TransientError, match="not counted as deleted"):
        checkpoint.remove(f"gs://{gcs_bucket}/a.pt", client=gcs_front.client_config, retry=FAST_RETRY)
    with pytest.raises(TransientError, match="not counted as deleted"):
        fs.rm(f"gs://{gcs_bucket}/a.pt")
    assert time.monotonic() - started < 30
    assert gcs_emulator.names(gcs_bucket) == ["a.pt"]
    gcs_front.set_faults([Fault("html_200", match="delete", times=1)])  # once: the retry deletes it
    assert checkpoint.remove(f"gs://{gcs_bucket}/a.pt", client=gcs_front.client_config, retry=FAST_RETRY)
    assert gcs_emulator.names(gcs_bucket) == [] and gcs_front.faults_injected["html_200"] == 2 * 4 + 1


def test_batched_deletes_answered_with_an_html_page_are_not_done(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    """Inside a batch each call's own answer counts: a 200 with a page is not GCS's, so the call goes alone."""
    for name in ("a", "b"):
        gcs_emulator.upload(gcs_bucket, name, name.encode())
    fs = GCSFileSystem(client=gcs_front.client_config, retry=FAST_RETRY, skip_instance_cache=True)
    gcs_front.set_faults([Fault("html_200", match="delete")])
    with pytest.raises(TransientError, match="not counted as deleted"):
        fs.rm([f"gs://{gcs_bucket}/a", f"gs://{gcs_bucket}/b"])
    assert gcs_front.counts["batch"] == 1 and gcs_emulator.names(gcs_bucket) == ["a", "b"]
    gcs_front.set_faults([Fault("html_200", match="delete", times=2)])  # the batched calls: each goes again alone
    fs.rm([f"gs://{gcs_bucket}/a", f"gs://{gcs_bucket}/b"])
    assert gcs_emulator.names(gcs_bucket) == []
