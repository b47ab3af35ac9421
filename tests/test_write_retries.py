"""Retried writes never overwrite or delete what they should not: with the first answer to every write
lost (carried out, then answered 503), every write of the library still succeeds with the right result,
and none is sent again without what makes GCS apply it at most once (a generation precondition, a
delete of one generation, an XML multipart upload's ID)."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import torchdata_gcs  # noqa: F401 - registers the DataPipes
from torchdata_gcs import PreconditionFailedError, RetryConfig, TransientError, WriteConfig, checkpoint
from torchdata_gcs._engines.upload import CompositeWriter
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

pytestmark = pytest.mark.timeout(180)

FAST_RETRY = RetryConfig(initial_delay=0.01, max_delay=0.05)
KiB = 1024


@pytest.fixture
def lossy(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    """A front that loses the answer to the first attempt of every write."""
    with GCSFront(gcs_emulator.endpoint, lose_write_answers=True) as front:
        yield front


def temporaries(emulator: Emulator, bucket: str) -> list[str]:
    return [name for name in emulator.names(bucket) if name.startswith(TEMPORARY_PREFIX)]


def test_the_front_loses_first_answers_and_names_unconditional_resends(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket("lossy-front")
    with GCSFront(gcs_emulator.endpoint, lose_write_answers=True) as front:
        client = Client(front.client_config, RetryConfig(initial_delay=0.01, retry_unconditional_writes=True))
        client.create("lossy-front", "a", b"one")  # lost, carried out; sent again as it was
        assert gcs_emulator.read("lossy-front", "a") == b"one"
        generation = client.create("lossy-front", "b", b"two", if_generation_match=0)  # 412 on the resend: ours
        assert client.delete("lossy-front", "b", generation=generation)  # 404 on the resend: gone, as asked
    assert front.faults_injected["lost_answer"] == 3
    assert [line.split("?")[0] for line in front.unconditional_resends] == ["POST /upload/storage/v1/b/lossy-front/o"]
    assert gcs_emulator.names("lossy-front") == ["a"]


def test_a_write_without_precondition_is_sent_once_and_says_so(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket("sent-once")
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match="upload", times=1)]) as front:
        client = Client(front.client_config, FAST_RETRY)
        with pytest.raises(TransientError, match=r"not sent again: .*retry_unconditional_writes=True"):
            client.create("sent-once", "a", b"one")
        assert front.counts["upload"] == 1
        client.create("sent-once", "b", b"two", if_generation_match=0)  # a precondition: retried as ever
    assert gcs_emulator.names("sent-once") == ["b"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_flight", [1, 8])  # 1: what the URL holds is asked without the part's own slot
def test_the_composite_writer_survives_lost_answers(gcs_emulator: Emulator, lossy: GCSFront, in_flight: int) -> None:
    bucket = f"lossy-composite-{in_flight}"
    gcs_emulator.create_bucket(bucket)
    data = random.Random(1).randbytes(34 * 256 * KiB + 5)  # 35 parts: an intermediate level
    settings = {"client": Client(lossy.client_config, FAST_RETRY), "part_size": 256 * KiB}
    for _ in range(2):  # a new object, then over it
        with CompositeWriter(f"gs://{bucket}/big.bin", max_parts_in_flight=in_flight, **settings) as writer:
            writer.write(data)
        assert gcs_emulator.read(bucket, "big.bin") == data
    assert lossy.unconditional_resends == []
    assert temporaries(gcs_emulator, bucket) == []


@pytest.mark.parametrize("strategy", ["multipart", "compose"])
def test_checkpoint_save_survives_lost_answers(gcs_emulator: Emulator, lossy: GCSFront, strategy: str) -> None:
    bucket = f"lossy-save-{strategy}"
    gcs_emulator.create_bucket(bucket)
    config = lossy.client_config
    write = WriteConfig(strategy=strategy, part_size=5 * 1024 * KiB if strategy == "multipart" else 256 * KiB)
    big = {"w": bytes(random.Random(2).randbytes(12 * 1024 * KiB))}
    for obj in ({"step": 1}, {"step": 2}, big, {"step": 3}):  # small and large, each over the last
        checkpoint.save(obj, f"gs://{bucket}/ckpt.pt", client=config, retry=FAST_RETRY, write=write)
        assert checkpoint.load(f"gs://{bucket}/ckpt.pt", client=config) == obj
    assert checkpoint.remove(f"gs://{bucket}/ckpt.pt", client=config, retry=FAST_RETRY)
    assert lossy.unconditional_resends == []
    assert gcs_emulator.names(bucket) == []


def test_compose_shards_survives_lost_answers(gcs_emulator: Emulator, lossy: GCSFront) -> None:
    objects = {f"d/{i:03d}": f"object {i}".encode() * (i % 7) for i in range(70)}
    gcs_emulator.seed("lossy-shards", objects)
    pipe = (
        IterableWrapper(["gs://lossy-shards/d/"])
        .list_files_by_gcs(client=lossy.client_config, with_metadata=True)
        .compose_shards_by_gcs(client=lossy.client_config, retry=FAST_RETRY)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to direct loads
        delivered = [(url, stream.read()) for url, stream in pipe]
    assert delivered == [(f"gs://lossy-shards/{name}", data) for name, data in objects.items()]
    assert pipe.stats.composes == 3
    assert lossy.unconditional_resends == []
    assert temporaries(gcs_emulator, "lossy-shards") == []


def test_fsspec_writes_survive_lost_answers(gcs_emulator: Emulator, lossy: GCSFront) -> None:
    gcs_emulator.create_bucket("lossy-fs")
    fs = GCSFileSystem(client=lossy.client_config, retry=FAST_RETRY, skip_instance_cache=True)
    fs.pipe("gs://lossy-fs/a", b"first")
    fs.pipe("gs://lossy-fs/a", b"second")  # over it
    fs.pipe("gs://lossy-fs/new", b"only if new", mode="create")
    fs.cp("gs://lossy-fs/a", "gs://lossy-fs/b")
    fs.cp("gs://lossy-fs/a", "gs://lossy-fs/b")  # over it
    fs.mv("gs://lossy-fs/b", "gs://lossy-fs/c")
    assert fs.cat("gs://lossy-fs/a") == fs.cat("gs://lossy-fs/c") == b"second"
    fs.rm("gs://lossy-fs/a")  # its first delete succeeded, its answer was lost: no FileNotFoundError
    fs.rm_file("gs://lossy-fs/c")
    fs.pipe({"gs://lossy-fs/dir/x": b"x", "gs://lossy-fs/dir/y": b"y"})
    fs.rm("gs://lossy-fs/dir", recursive=True)
    assert gcs_emulator.names("lossy-fs") == ["new"]
    assert lossy.unconditional_resends == []


def test_a_delete_finds_an_object_replaced_meanwhile_again(gcs_emulator: Emulator) -> None:
    gcs_emulator.seed("replaced-delete", {"a": b"one"})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_412", match="delete", times=1)]) as front:
        fs = GCSFileSystem(client=front.client_config, retry=FAST_RETRY, skip_instance_cache=True)
        fs.rm("gs://replaced-delete/a")  # 412 to the first: the live generation is asked again
        assert (front.counts["delete"], front.counts["metadata"]) == (2, 2)
    assert gcs_emulator.names("replaced-delete") == []


def test_a_publish_over_an_object_replaced_meanwhile_fails_and_keeps_it(gcs_emulator: Emulator) -> None:
    gcs_emulator.seed("replaced-publish", {"o": b"theirs"})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_412", match="compose", times=1)]) as front:
        writer = CompositeWriter(
            "gs://replaced-publish/o", client=Client(front.client_config, FAST_RETRY), part_size=256 * KiB
        )
        with (
            pytest.raises(PreconditionFailedError, match="replaced by another writer while this one published"),
            writer,
        ):
            writer.write(b"ours" * 100_000)
    assert gcs_emulator.read("replaced-publish", "o") == b"theirs"
    assert temporaries(gcs_emulator, "replaced-publish") == []
