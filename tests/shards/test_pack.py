"""pack: objects under a prefix written as WebDataset tar shards through the emulator (real HTTP), read back
bit-exact with Python's tarfile and our reader, grouped by key, indexed at the right offsets, the same bytes on
every run, resumed after a failure or a SIGKILL without rewriting complete shards, and every bad input refused."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import google_crc32c
import pytest
import requests

from tests.doc_blocks import doc_block
from torchdata_gcs import AccessDeniedError, InvalidURIError, NotFoundError, RetryConfig, TransferConfig, WriteConfig
from torchdata_gcs._engines.tar_format import Sample, decode_index, header, padding, read_members, samples_of
from torchdata_gcs.shards import PackReport, pack
from torchdata_gcs.testing import Emulator, Fault, GCSFront

KiB, MiB = 1024, 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def seed_pairs(emulator: Emulator, bucket: str, count: int, size: int, prefix: str = "src/") -> dict[str, bytes]:
    """``count`` samples of random bytes: ``NNNNNN.jpg`` of about ``size`` bytes and a small ``NNNNNN.json``."""
    rng = random.Random(count)
    objects = {}
    for i in range(count):
        objects[f"{prefix}{i:06d}.jpg"] = rng.randbytes(size + rng.randrange(0, 700))
        objects[f"{prefix}{i:06d}.json"] = json.dumps({"i": i}).encode()
    emulator.seed(bucket, objects)
    return objects


def shards(emulator: Emulator, bucket: str, folder: str) -> dict[str, bytes]:
    """The shards and indexes under ``folder``, by name relative to it."""
    return {n[len(folder) :]: emulator.read(bucket, n) for n in emulator.names(bucket) if n.startswith(folder)}


def generations(emulator: Emulator, bucket: str, names: list[str]) -> dict[str, int]:
    base = f"{emulator.endpoint}/storage/v1/b/{bucket}/o/"
    return {name: int(requests.get(base + quote(name, safe=""), timeout=10).json()["generation"]) for name in names}


def tar_length(sample: Sample) -> int:
    return sum(len(header(m.name, m.size)) + m.size + len(padding(m.size)) for m in sample.members)


def check_shards(
    stored: dict[str, bytes], objects: dict[str, bytes], prefix: str, shard_size: int, *, by_stem: bool
) -> None:
    """Every shard read back with tarfile and with read_members, members at their indexed offsets, samples grouped
    by key, the shards holding every object in name order, each filled greedily up to ``shard_size``."""
    names = sorted(n for n in stored if n.endswith(".tar"))
    assert names == [f"shard-{i:06d}.tar" for i in range(len(names))]
    assert sorted(stored) == sorted(names + [n + ".idx" for n in names])
    expected = sorted((name[len(prefix) :], data) for name, data in objects.items())
    got: list[tuple[str, bytes]] = []
    first_samples = []
    for name in names:
        shard = stored[name]
        with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
            in_tar = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]  # regular files only
        members = list(read_members(io.BytesIO(shard).read, name))
        assert [(m.name, data) for m, data in members] == in_tar
        index = decode_index(name + ".idx", stored[name + ".idx"], len(shard))
        assert [replace(m, crc32c=None) for sample in index for m in sample.members] == [m for m, _ in members]
        for sample in index:  # the bytes at each member's offset are the object's bytes, their crc32c the index's
            for member in sample.members:
                assert shard[member.offset : member.offset + member.size] == objects[prefix + member.name]
                assert member.crc32c == google_crc32c.value(objects[prefix + member.name])
        grouped = [(s.key, [m.name for m in s.members]) for s, _ in samples_of(iter(members), name)]
        if by_stem:
            assert [(s.key, [m.name for m in s.members]) for s in index] == grouped
        else:
            assert [[m.name for m in s.members] for s in index] == [[n] for n, _ in in_tar]
        assert len(shard) <= shard_size or len(index) == 1
        first_samples.append(tar_length(index[0]))
        got += in_tar
    assert got == expected
    for name, following in zip(names, first_samples[1:], strict=False):  # greedy: the next sample did not fit
        assert len(stored[name]) + following > shard_size


def test_pack_reads_back_bit_exact_grouped_by_stem(gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str):
    objects = seed_pairs(gcs_emulator, gcs_bucket, 40, 20 * KiB)
    extra = {"src/deep/" + "d" * 120 + "/000001.seg.png": b"long name", "src/ünï/000002.cls": b"7", "src/z.txt": b""}
    gcs_emulator.seed(gcs_bucket, extra)
    objects.update(extra)
    report = pack(
        f"gs://{gcs_bucket}/src", f"gs://{gcs_bucket}/out/", shard_size="200KiB", client=gcs_front.client_config
    )
    stored = shards(gcs_emulator, gcs_bucket, "out/")
    check_shards(stored, objects, "src/", 200 * KiB, by_stem=True)
    assert report.shards_written == len(stored) // 2 > 3
    assert (report.shards_skipped, report.samples, report.objects) == (0, 43, 83)
    assert report.bytes == sum(map(len, objects.values()))
    index = decode_index("i", stored["shard-000000.tar.idx"], len(stored["shard-000000.tar"]))
    assert [(s.key, [m.name for m in s.members]) for s in index[:2]] == [
        ("000000", ["000000.jpg", "000000.json"]),
        ("000001", ["000001.jpg", "000001.json"]),
    ]


def test_group_by_none_makes_each_object_a_sample(gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str):
    objects = seed_pairs(gcs_emulator, gcs_bucket, 10, 3 * KiB)
    report = pack(
        f"gs://{gcs_bucket}/src/",
        f"gs://{gcs_bucket}/out",
        shard_size=10_000,
        group_by=None,
        client=gcs_front.client_config,
    )
    check_shards(shards(gcs_emulator, gcs_bucket, "out/"), objects, "src/", 10_000, by_stem=False)
    assert report.samples == report.objects == 20


def test_a_sample_larger_than_the_shard_size_is_a_shard_alone(gcs_emulator: Emulator, gcs_bucket: str):
    objects = {"src/a.bin": b"a" * 3000, "src/b.bin": os.urandom(9000), "src/b.txt": b"b", "src/c.bin": b"c" * 10}
    gcs_emulator.seed(gcs_bucket, objects)
    pack(f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/", shard_size=4096, client=gcs_emulator.client_config)
    stored = shards(gcs_emulator, gcs_bucket, "out/")
    check_shards(stored, objects, "src/", 4096, by_stem=True)
    assert len(stored) == 6  # a; b (9 KiB, alone); c


def test_packing_twice_gives_the_same_bytes_and_a_rerun_uploads_nothing(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
):
    seed_pairs(gcs_emulator, gcs_bucket, 30, 8 * KiB)
    config = gcs_front.client_config
    for folder in ("one/", "two/"):
        pack(f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/{folder}", shard_size="100KiB", client=config)
    one, two = shards(gcs_emulator, gcs_bucket, "one/"), shards(gcs_emulator, gcs_bucket, "two/")
    assert one == two and len(one) > 4
    before = gcs_front.counts
    again = pack(f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/one/", shard_size="100KiB", client=config)
    after = gcs_front.counts
    assert (again.shards_written, again.shards_skipped, again.objects) == (0, len(one) // 2, 0)
    assert after["upload"] == before["upload"] and after["range_get"] == before["range_get"]
    assert shards(gcs_emulator, gcs_bucket, "one/") == one


@pytest.mark.parametrize(
    ("fault", "error"),
    [  # the fourth shard's upload refused (while the fifth fills); an object of the fourth shard gone mid-way
        (Fault("http_403", match=r"shard-000003\.tar([?&]|$)"), AccessDeniedError),
        (Fault("http_404", match=r"GET .*000033\.jpg"), NotFoundError),
    ],
)
def test_a_failed_pack_publishes_no_partial_shard_and_resumes_after_the_complete_ones(
    gcs_emulator: Emulator, gcs_bucket: str, fault: Fault, error: type[Exception]
) -> None:
    objects = seed_pairs(gcs_emulator, gcs_bucket, 60, 100 * KiB)
    src, out, size = f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/", 1 * MiB
    write = WriteConfig(part_size=5 * MiB)
    pack(src, f"gs://{gcs_bucket}/reference/", shard_size=size, client=gcs_emulator.client_config)
    reference = shards(gcs_emulator, gcs_bucket, "reference/")
    with GCSFront(gcs_emulator.endpoint, faults=[fault]) as front, pytest.raises(error):
        pack(src, out, shard_size=size, client=front.client_config, write=write)
    done = shards(gcs_emulator, gcs_bucket, "out/")
    complete = sorted(n for n in done if n.endswith(".idx"))
    assert "shard-000003.tar" not in done and "shard-000002.tar.idx" in complete
    assert all(n.removesuffix(".idx") in done for n in complete)
    assert {n: done[n] for n in done} == {n: reference[n] for n in done}  # no partial shard published
    kept = generations(gcs_emulator, gcs_bucket, [f"out/{n.removesuffix('.idx')}" for n in complete])
    with GCSFront(gcs_emulator.endpoint) as front:
        report = pack(src, out, shard_size=size, client=front.client_config, write=write)
    assert report.shards_skipped == len(complete)
    assert generations(gcs_emulator, gcs_bucket, list(kept)) == kept
    assert shards(gcs_emulator, gcs_bucket, "out/") == reference
    check_shards(reference, objects, "src/", size, by_stem=True)


def test_a_changed_source_rewrites_its_shards_and_a_missing_index_is_written_alone(
    gcs_emulator: Emulator, gcs_bucket: str
):
    objects = seed_pairs(gcs_emulator, gcs_bucket, 30, 10 * KiB)
    src, out, config = f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/", gcs_emulator.client_config
    pack(src, out, shard_size="64KiB", client=config)
    names = sorted(n for n in shards(gcs_emulator, gcs_bucket, "out/") if n.endswith(".tar"))
    before = generations(gcs_emulator, gcs_bucket, [f"out/{n}" for n in names])
    changed = "src/000000.jpg"  # in the first shard: the same size, other bytes
    objects[changed] = bytes(reversed(objects[changed]))
    gcs_emulator.upload(gcs_bucket, changed, objects[changed])
    gcs_emulator.delete(gcs_bucket, f"out/{names[-1]}.idx")  # as a pack killed between a shard and its index
    report = pack(src, out, shard_size="64KiB", client=config)
    assert (report.shards_written, report.shards_skipped) == (1, len(names) - 1)
    after = generations(gcs_emulator, gcs_bucket, [f"out/{n}" for n in names])
    assert after[f"out/{names[0]}"] != before[f"out/{names[0]}"]
    assert {n: g for n, g in after.items() if n != f"out/{names[0]}"} == {
        n: g for n, g in before.items() if n != f"out/{names[0]}"
    }
    check_shards(shards(gcs_emulator, gcs_bucket, "out/"), objects, "src/", 64 * KiB, by_stem=True)


KILLED_PACK = """
import sys
from torchdata_gcs import ClientConfig, WriteConfig
from torchdata_gcs.shards import pack
pack(sys.argv[1], sys.argv[2], shard_size=sys.argv[3], client=ClientConfig(endpoint=sys.argv[4], anonymous=True),
     write=WriteConfig(part_size=5 * 1024 * 1024))
"""


def test_a_pack_killed_mid_way_resumes_to_the_same_shards(gcs_emulator: Emulator, gcs_bucket: str):
    objects = seed_pairs(gcs_emulator, gcs_bucket, 96, 360 * KiB)
    src, size = f"gs://{gcs_bucket}/src/", "6MiB"
    pack(src, f"gs://{gcs_bucket}/reference/", shard_size=size, client=gcs_emulator.client_config)
    reference = shards(gcs_emulator, gcs_bucket, "reference/")
    assert len(reference) >= 6
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with GCSFront(gcs_emulator.endpoint, latency=0.02, bandwidth=3_000_000) as slow:
        command = [sys.executable, "-c", KILLED_PACK, src, f"gs://{gcs_bucket}/out/", size, slow.endpoint]
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while not any(n.endswith(".idx") for n in gcs_emulator.names(gcs_bucket) if n.startswith("out/")):
                assert child.poll() is None, child.stderr.read().decode()[-2000:]  # type: ignore[union-attr]  # piped
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert child.poll() is None  # killed while shards are in flight, not after the end
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        finally:
            child.kill()
            child.stderr.close()  # type: ignore[union-attr]  # piped
    left = shards(gcs_emulator, gcs_bucket, "out/")
    complete = sorted(n.removesuffix(".idx") for n in left if n.endswith(".idx"))
    assert 1 <= len(complete) < len(reference) // 2
    assert {n: left[n] for n in left} == {n: reference[n] for n in left}  # nothing partial under out/
    kept = generations(gcs_emulator, gcs_bucket, [f"out/{n}" for n in complete])
    with GCSFront(gcs_emulator.endpoint) as front:
        report = pack(src, f"gs://{gcs_bucket}/out/", shard_size=size, client=front.client_config)
    assert report.shards_skipped >= len(complete)
    assert report.shards_written + report.shards_skipped == len(reference) // 2
    assert generations(gcs_emulator, gcs_bucket, list(kept)) == kept  # complete shards not uploaded again
    assert shards(gcs_emulator, gcs_bucket, "out/") == reference
    check_shards(reference, objects, "src/", 6 * MiB, by_stem=True)
    others = [n for n in gcs_emulator.names(gcs_bucket) if not n.startswith(("src/", "out/", "reference/"))]
    assert all(n.startswith(".torchdata-gcs-tmp/") for n in others), others  # what `torchdata-gcs clean` removes


def test_every_bad_input_is_refused_before_anything_is_written(gcs_emulator: Emulator, gcs_bucket: str):
    config = gcs_emulator.client_config
    gcs_emulator.seed(gcs_bucket, {"src/a.jpg": b"a", "src/shards/x.bin": b"x"})
    with pytest.raises(NotFoundError, match=r"nothing to pack: no object under gs://.*/srcc/ \(an empty source"):
        pack(f"gs://{gcs_bucket}/srcc/", f"gs://{gcs_bucket}/out/", client=config)
    with pytest.raises(FileNotFoundError):
        pack("gs://no-such-bucket-here/src/", f"gs://{gcs_bucket}/out/", client=config)
    for destination in ("src/shards/", "src", "src/"):
        with pytest.raises(InvalidURIError, match="is inside the source"):
            pack(f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/{destination}", client=config)
    with pytest.raises(InvalidURIError, match="is inside the source"):
        pack(f"gs://{gcs_bucket}", f"gs://{gcs_bucket}/out/", client=config)
    for bad in ("5 GBs", "GB", "0MiB", 0, -1, True, 2.5):
        with pytest.raises(ValueError, match="shard_size"):
            pack(f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/", shard_size=bad, client=config)  # type: ignore[arg-type]  # refused at run time
    with pytest.raises(ValueError, match="group_by: expected 'stem' or None"):
        pack(f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/", group_by="key", client=config)  # type: ignore[arg-type]  # refused at run time
    with pytest.raises(InvalidURIError, match="not a glob"):
        pack(f"gs://{gcs_bucket}/src/*.jpg", f"gs://{gcs_bucket}/out/", client=config)
    assert [n for n in gcs_emulator.names(gcs_bucket) if not n.startswith("src/")] == []


@pytest.mark.parametrize(
    ("names", "why"),
    [
        (["src/0.jpg", "src/d/.hidden"], r"'d/\.hidden' has no sample key"),
        (["src/s.a", "src/s.b/t.jpg", "src/s.c"], r"the members of sample 's' are not adjacent"),
    ],
)
def test_names_that_make_no_sample_are_refused(gcs_emulator: Emulator, gcs_bucket: str, names: list[str], why: str):
    gcs_emulator.seed(gcs_bucket, dict.fromkeys(names, b"x"))
    with pytest.raises(ValueError, match=why):
        pack(f"gs://{gcs_bucket}/src/", f"gs://{gcs_bucket}/out/", client=gcs_emulator.client_config)
    assert [n for n in gcs_emulator.names(gcs_bucket) if n.startswith("out/")] == []


def test_progress_gets_reports_and_the_last_is_the_result(gcs_emulator: Emulator, gcs_bucket: str):
    seed_pairs(gcs_emulator, gcs_bucket, 20, KiB)
    seen: list[PackReport] = []
    report = pack(
        f"gs://{gcs_bucket}/src/",
        f"gs://{gcs_bucket}/out/",
        shard_size="8KiB",
        client=gcs_emulator.client_config,
        transfer=TransferConfig(max_in_flight=4),
        retry=RetryConfig(initial_delay=0.01),
        progress=seen.append,
    )
    assert seen[-1] == report and seen[0].objects <= report.objects == 40
    assert "40 objects (20 samples" in report.describe()


def test_the_readme_example_runs(gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    gcs_emulator.seed("my-bucket", {"train/000001.jpg": b"jpg", "train/000001.json": b"{}"})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    exec(doc_block("from torchdata_gcs.shards import pack"), {})
    assert "shard-000000.tar" in {n.rpartition("/")[2] for n in gcs_emulator.names("my-bucket")}
