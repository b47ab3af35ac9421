"""An object of unknown size is asked for its first part only: the answer names the object's size,
ends where the part ends (so no connection is dropped mid-answer), and an empty object answers 416."""

from __future__ import annotations

import gzip
import os
import time

import pytest
import requests

from tests.test_gcs_protocol import BUCKET, upload_gzip_encoded
from torchdata_gcs import GCSFileLoaderIterDataPipe, RetryConfig, TransferConfig
from torchdata_gcs.testing import Emulator, GCSFront

MiB = 1024 * 1024
FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)
PART = 256 * 1024


def load(front: GCSFront, urls: list[str], part_size: int = PART) -> list[bytes]:
    """The objects at ``urls``, their sizes unknown to the loader (nothing listed)."""
    pipe = GCSFileLoaderIterDataPipe(
        urls, client=front.client_config, transfer=TransferConfig(part_size=part_size), retry=FAST_RETRY
    )
    return [stream.read() for _, stream in pipe]


@pytest.mark.parametrize("only_promised_headers", [False, True])
def test_an_object_larger_than_a_part_drops_no_connection_and_sends_no_unranged_get(
    gcs_emulator: Emulator, gcs_bucket: str, only_promised_headers: bool
) -> None:
    data = os.urandom(12 * MiB + 12345)
    gcs_emulator.seed(gcs_bucket, {"big.bin": data})
    # a capped bandwidth keeps the front sending while the client reads: an answer the client leaves
    # early is seen, never hidden in socket buffers
    with GCSFront(gcs_emulator.endpoint, bandwidth=64 * MiB, only_promised_headers=only_promised_headers) as front:
        assert load(front, [f"gs://{gcs_bucket}/big.bin"], part_size=MiB) == [data]
        assert front.counts["get"] == 0
        assert front.counts["range_get"] == 13
        assert front.abandoned_answers == 0


def test_an_empty_object_of_unknown_size_loads_through_a_416(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"empty": b"", "small": b"hello"})
    with GCSFront(gcs_emulator.endpoint, only_promised_headers=True) as front:
        urls = [f"gs://{gcs_bucket}/empty", f"gs://{gcs_bucket}/small"]
        assert load(front, urls) == [b"", b"hello"]
        assert (front.counts["range_get"], front.counts["get"]) == (2, 0)


def test_the_front_answers_a_range_of_an_empty_object_416_naming_its_size(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """As GCS does (the official client takes ``Content-Range: bytes */0`` on a 416 as an empty object)."""
    gcs_emulator.seed(gcs_bucket, {"empty": b""})
    with GCSFront(gcs_emulator.endpoint) as front:
        answer = requests.get(
            f"{front.endpoint}/download/storage/v1/b/{gcs_bucket}/o/empty",
            params={"alt": "media"},
            headers={"Range": "bytes=0-99"},
            timeout=30,
        )
    assert (answer.status_code, answer.headers.get("Content-Range")) == (416, "bytes */0")
    assert answer.json()["error"]["code"] == 416


def test_a_server_that_ignores_range_still_loads_every_object_whole(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {"empty": b"", "small": os.urandom(1000), "big": os.urandom(3 * PART + 17)}
    gcs_emulator.seed(gcs_bucket, objects)
    with GCSFront(gcs_emulator.endpoint, ignore_range=True) as front:
        assert load(front, [f"gs://{gcs_bucket}/{name}" for name in objects]) == list(objects.values())
        assert front.counts["range_get"] == 3 and front.abandoned_answers == 0


def test_a_gzip_encoded_object_of_unknown_size_loads_its_stored_bytes_in_ranges(gcs_emulator: Emulator) -> None:
    """Media reads ask for gzip, so GCS serves the stored bytes and honours Range on them."""
    gcs_emulator.create_bucket(BUCKET)
    text = b"".join(b"line %d of a log that compresses\n" % i for i in range(400_000))
    stored = gzip.compress(text, compresslevel=1)
    assert len(stored) > 2 * PART
    upload_gzip_encoded(gcs_emulator, "log.txt.gz", stored)
    with GCSFront(gcs_emulator.endpoint, only_promised_headers=True) as front:
        assert load(front, [f"gs://{BUCKET}/log.txt.gz"]) == [stored]
        assert front.counts["get"] == 0 and front.counts["range_get"] == -(-len(stored) // PART)


def test_the_front_counts_an_answer_its_client_left_mid_body(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"big.bin": os.urandom(16 * MiB)})
    with GCSFront(gcs_emulator.endpoint, bandwidth=32 * MiB) as front:
        url = f"{front.endpoint}/download/storage/v1/b/{gcs_bucket}/o/big.bin?alt=media"
        with requests.get(url, stream=True, timeout=30) as answer:
            assert len(answer.raw.read(1024)) == 1024
        deadline = time.monotonic() + 10
        while front.abandoned_answers == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert front.abandoned_answers == 1
