"""The tar format of shards: what we write, Python's tarfile reads, and what tarfile writes (ustar, pax and
GNU long names), we read; samples grouped by key; damaged archives and indexes named with their offset."""

from __future__ import annotations

import io
import tarfile

import pytest

from torchdata_gcs import IntegrityError
from torchdata_gcs._engines.tar_format import (
    END,
    Member,
    Sample,
    decode_index,
    encode_index,
    header,
    padding,
    read_members,
    samples_of,
    split_key,
)

NAMES = ["000001.jpg", "000001.json", "dir/000002.seg.png", "x" * 150 + "/000003.txt", "ünïcode/000004.cls"]


def ours(names: list[str]) -> bytes:
    return (
        b"".join(header(name, len(name.encode())) + name.encode() + padding(len(name.encode())) for name in names) + END
    )


def test_what_we_write_tarfile_reads_and_we_read_back_with_offsets() -> None:
    archive = ours(NAMES)
    with tarfile.open(fileobj=io.BytesIO(archive)) as read:
        assert [(m.name, read.extractfile(m).read()) for m in read.getmembers()] == [(n, n.encode()) for n in NAMES]  # type: ignore[union-attr]  # regular files only
    members = list(read_members(io.BytesIO(archive).read, "gs://b/s.tar"))
    assert [member.name for member, _ in members] == NAMES
    for member, data in members:
        assert data == member.name.encode() == archive[member.offset : member.offset + member.size]


@pytest.mark.parametrize("form", [tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_we_read_what_tarfile_writes(form: int) -> None:
    names = NAMES if form != tarfile.USTAR_FORMAT else [n for n in NAMES if len(n) < 100 and n.isascii()]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=form) as write:
        write.addfile(tarfile.TarInfo("dir"))  # an empty regular file
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = len(name.encode())
            write.addfile(info, io.BytesIO(name.encode()))
    got = [(member.name, data) for member, data in read_members(io.BytesIO(out.getvalue()).read, "w")]
    assert got == [("dir", b"")] + [(name, name.encode()) for name in names]


def test_samples_group_consecutive_members_of_one_key() -> None:
    members = read_members(io.BytesIO(ours(NAMES)).read, "s")
    assert [(sample.key, sorted(data)) for sample, data in samples_of(members, "s")] == [
        ("000001", ["jpg", "json"]),
        ("dir/000002", ["seg.png"]),
        ("x" * 150 + "/000003", ["txt"]),
        ("ünïcode/000004", ["cls"]),
    ]
    assert split_key("a/b.c/000123.seg.png") == ("a/b.c/000123", "seg.png")


def test_damaged_archives_and_bad_members_are_named_with_their_offset() -> None:
    archive = bytearray(ours(NAMES))
    with pytest.raises(IntegrityError, match=r"gs://b/s.tar: not a tar archive at byte 0: .*ends inside a member"):
        list(read_members(io.BytesIO(archive[:600]).read, "gs://b/s.tar"))
    with pytest.raises(IntegrityError, match=r"at byte 5120: the archive stops without its end blocks"):
        list(read_members(io.BytesIO(archive[:5120]).read, "gs://b/s.tar"))
    archive[1024 + 10] ^= 1  # the second header
    with pytest.raises(IntegrityError, match=r"at byte 1024: a header whose checksum does not match"):
        list(read_members(io.BytesIO(bytes(archive)).read, "gs://b/s.tar"))
    for names, why in ((["000001.jpg", ".hidden"], r"'\.hidden' at byte 1024 has no sample key"),
                       (["1.jpg", "1.jpg"], r"'1.jpg' at byte 1024 repeats 'jpg' of sample '1'")):  # fmt: skip
        with pytest.raises(IntegrityError, match=why):
            list(samples_of(read_members(io.BytesIO(ours(names)).read, "t"), "t"))


def test_an_index_round_trips_and_one_of_another_shard_is_refused() -> None:
    samples = [Sample("000001", (Member("000001.jpg", 512, 10), Member("000001.json", 1536, 11)))]
    assert decode_index("i", encode_index(4096, samples), 4096) == samples
    with pytest.raises(IntegrityError, match="i: not an index of this shard"):
        decode_index("i", encode_index(4096, samples), 8192)
    with pytest.raises(IntegrityError, match="outside the 1024-byte shard"):
        decode_index("i", encode_index(1024, samples), 1024)
