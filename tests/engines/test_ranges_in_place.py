"""An object read in ranges lands in one buffer of its size, each range put in place by the transport and
hashed there: bit-exact through every way of reading it, a cut range resumed from the byte it reached,
damaged bytes never handed out, and held once in memory."""

from __future__ import annotations

import os
import re
import textwrap

import google_crc32c
import pytest

from tests.children import run_child
from torchdata_gcs import GCSFileLoaderIterDataPipe, RetryConfig, TransferConfig
from torchdata_gcs.errors import IntegrityError
from torchdata_gcs.testing import Emulator, Fault, GCSFront

MiB = 1024 * 1024
PART = 256 * 1024
PINNED = r"generation="  # the ranges after an object's first answer (which names its size and generation)
PATIENT = RetryConfig(max_attempts=8, initial_delay=0.01, max_delay=0.05)


def loader(front: GCSFront, urls: list[str]) -> GCSFileLoaderIterDataPipe:
    return GCSFileLoaderIterDataPipe(
        urls, client=front.client_config, transfer=TransferConfig(part_size=PART), retry=PATIENT
    )


@pytest.fixture
def objects(gcs_emulator: Emulator, gcs_bucket: str) -> dict[str, bytes]:
    data = {f"big/{i}.bin": os.urandom(size) for i, size in enumerate([3 * MiB + 4321, 8 * PART, PART + 1])}
    gcs_emulator.seed(gcs_bucket, data)
    return {f"gs://{gcs_bucket}/{name}": value for name, value in data.items()}


def test_ranged_objects_are_exact_through_read_readinto_and_partial_reads(
    gcs_emulator: Emulator, objects: dict[str, bytes]
) -> None:
    urls = sorted(objects)
    with GCSFront(gcs_emulator.endpoint) as front:
        assert [(url, stream.read()) for url, stream in loader(front, urls)] == [(url, objects[url]) for url in urls]
        for url, stream in loader(front, urls):
            target = bytearray(len(objects[url]) + 10)
            assert stream.readinto(target) == len(objects[url])
            assert target[: len(objects[url])] == objects[url]
        for url, stream in loader(front, urls):
            head = stream.read(1000)
            stream.seek(PART - 3)
            middle = stream.read(7)
            stream.seek(1000)
            between = stream.read(PART - 1003)
            stream.seek(PART + 4)
            assert head + between + middle + stream.read() == objects[url]
        assert front.counts["get"] == 0 and front.counts["range_get"] >= 3 * sum(
            -(-len(v) // PART) for v in objects.values()
        )


def test_a_range_cut_mid_body_resumes_from_the_byte_it_reached(
    gcs_emulator: Emulator, objects: dict[str, bytes]
) -> None:
    urls = sorted(objects)
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("truncate", match=PINNED, times=3)], record=True) as front:
        assert [(url, stream.read()) for url, stream in loader(front, urls)] == [(url, objects[url]) for url in urls]
        assert front.faults_injected["truncate"] == 3
        starts = [
            int(match.group(1))
            for request in front.recorded
            for value in request.header("Range")
            if (match := re.fullmatch(r"bytes=(\d+)-\d+", value))
        ]
    # a truncated answer carries half its range: the next GET starts there, off the parts' boundaries
    assert any(start % PART for start in starts), starts


def test_a_damaged_range_is_read_again_and_never_handed_out(gcs_emulator: Emulator, objects: dict[str, bytes]) -> None:
    urls = sorted(objects)
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("corrupt", match=PINNED, times=2)]) as front:
        pipe = loader(front, urls)
        assert [(url, stream.read()) for url, stream in pipe] == [(url, objects[url]) for url in urls]
        assert front.faults_injected["corrupt"] == 2
        assert pipe.stats.retries >= 1  # found by the whole object's crc32c (GCS keeps none per range), read again


def test_a_damaged_range_fails_the_object_when_retries_run_out(
    gcs_emulator: Emulator, objects: dict[str, bytes]
) -> None:
    url = sorted(objects)[0]
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("corrupt", match="range_get")]) as front:
        pipe = GCSFileLoaderIterDataPipe(
            [url],
            client=front.client_config,
            transfer=TransferConfig(part_size=PART),
            retry=RetryConfig(max_attempts=2, initial_delay=0.01, max_delay=0.02),
        )
        with pytest.raises(IntegrityError, match="crc32c"):
            list(pipe)


CHILD = textwrap.dedent(
    """
    import json, sys
    import google_crc32c
    from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe, TransferConfig

    spec = json.load(sys.stdin)
    client = ClientConfig(endpoint=spec["endpoint"], anonymous=True)
    transfer = TransferConfig(part_size=spec["part"])

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

    [stream.read() for _, stream in GCSFileLoaderIterDataPipe([spec["warm"]], client=client, transfer=transfer)]
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset the peak
    baseline = status("VmRSS")
    for _, stream in GCSFileLoaderIterDataPipe([spec["url"]], client=client, transfer=transfer):
        data = stream.read()
    print(json.dumps({"growth": status("VmHWM") - baseline, "size": len(data), "crc": google_crc32c.value(data)}))
    """
)


def test_a_large_object_read_whole_is_held_once(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    size = 96 * MiB
    data = os.urandom(size)
    gcs_emulator.seed(gcs_bucket, {"whole.bin": data, "warm.bin": os.urandom(2 * MiB)})
    spec = {
        "endpoint": gcs_emulator.endpoint,
        "part": 8 * MiB,
        "url": f"gs://{gcs_bucket}/whole.bin",
        "warm": f"gs://{gcs_bucket}/warm.bin",
    }
    result = run_child(CHILD, spec)
    assert (result["size"], result["crc"]) == (size, google_crc32c.value(data))
    # the object's one buffer, plus the transport's in-flight pieces; ranges joined would hold it twice
    assert result["growth"] < 1.5 * size, f"peak RSS grew {result['growth'] / MiB:.0f} MiB for {size // MiB} MiB"
