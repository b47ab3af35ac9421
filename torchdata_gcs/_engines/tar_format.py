"""The tar format as WebDataset shards use it: members read one by one from a stream (ustar headers, with pax
and GNU long names), grouped into samples by key, written with fixed headers so a shard's bytes depend on its
contents alone, and the index of member offsets written beside a shard (``shard.tar.idx``) for random access.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import IntegrityError

__all__ = [
    "BLOCK",
    "END",
    "INDEX_SUFFIX",
    "Member",
    "Sample",
    "decode_index",
    "encode_index",
    "header",
    "padding",
    "read_members",
    "samples_of",
    "split_key",
]

BLOCK = 512
END = bytes(2 * BLOCK)
"""What ends an archive: two blocks of zeros."""
INDEX_SUFFIX = ".idx"
"""The index of ``shard.tar`` is ``shard.tar.idx``."""
_INDEX_FORMAT = "torchdata-gcs-tar-index/1"
_FILE_TYPES = (b"0", b"\0", b"7")  # regular files (and contiguous ones, read alike)


@dataclasses.dataclass(frozen=True)
class Member:
    """A file in a shard: its name, where its bytes start in the shard, and how many there are."""

    name: str
    offset: int
    size: int
    crc32c: int | None = None


@dataclasses.dataclass(frozen=True)
class Sample:
    """The members of one key, in shard order: ``{"__key__": key, ext: bytes, ...}`` once read."""

    key: str
    members: tuple[Member, ...]

    @property
    def span(self) -> tuple[int, int]:
        """The bytes of the shard from its first member's data to its last member's end."""
        return self.members[0].offset, self.members[-1].offset + self.members[-1].size


def split_key(name: str) -> tuple[str, str]:
    """A member's sample key and extension, as WebDataset splits them: at the first dot of the file name
    (``"a/000123.seg.png"`` is key ``"a/000123"``, extension ``"seg.png"``)."""
    folder, base = posixpath.split(name)
    stem, dot, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension if dot else ""


def header(name: str, size: int) -> bytes:
    """The header blocks of a regular file: ustar, with a pax record first where the name does not fit
    (longer than 100 bytes, or not ASCII). Mode 0644, owner 0, time 0: the shard's bytes depend on its
    members alone."""
    encoded = name.encode("utf-8")
    if len(encoded) <= 100 and encoded.isascii():
        return _ustar(encoded, size, b"0")
    body = b" path=" + encoded + b"\n"
    length = len(body) + 1
    while length != len(str(length)) + len(body):  # the record's length counts its own digits
        length = len(str(length)) + len(body)
    record = str(length).encode() + body
    return (
        _ustar(b"././@PaxHeader", len(record), b"x") + record + padding(len(record)) + _ustar(encoded[:100], size, b"0")
    )


def _ustar(name: bytes, size: int, kind: bytes) -> bytes:
    block = bytearray(BLOCK)
    block[0 : len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def padding(size: int) -> bytes:
    """The zeros that fill a member's last block."""
    return bytes(-size % BLOCK)


def read_members(read: Callable[[int], bytes], where: str) -> Iterator[tuple[Member, bytes]]:
    """Every regular file of the tar archive ``read(n)`` returns the bytes of (up to ``n`` at a time, none at
    its end), with its bytes; ``IntegrityError`` naming ``where`` and the byte offset for a damaged or cut
    archive."""

    def take(count: int) -> bytes:
        data = read(count)
        if len(data) in (0, count):
            return data
        gathered = bytearray(data)
        while len(gathered) < count:
            more = read(count - len(gathered))
            if not more:
                break
            gathered += more
        return bytes(gathered)

    offset = 0
    long_name: str | None = None
    while True:
        block = take(BLOCK)
        if block == bytes(BLOCK):
            return
        if not block:
            raise _damaged(where, offset, "the archive stops without its end blocks (cut short?)")
        if len(block) < BLOCK:
            raise _damaged(where, offset, f"the archive ends inside a header ({len(block)} of {BLOCK} bytes)")
        kind, size = _check_header(block, where, offset)
        data = take(size + len(padding(size)))
        if len(data) < size + len(padding(size)):
            stored = size + len(padding(size))
            raise _damaged(where, offset, f"the archive ends inside a member ({len(data)} of its {stored} bytes)")
        data_offset, offset = offset + BLOCK, offset + BLOCK + len(data)
        if kind in (b"x", b"L"):
            long_name = _long_name(kind, data[:size], where, data_offset) or long_name
        elif kind in _FILE_TYPES:
            name = long_name if long_name is not None else _name(block)
            long_name = None
            yield Member(name, data_offset, size), data[:size]
        else:
            long_name = None  # folders, links, global headers: no sample member


def samples_of(members: Iterator[tuple[Member, bytes]], where: str) -> Iterator[tuple[Sample, dict[str, bytes]]]:
    """Consecutive members of one key as one sample, with their bytes by extension (WebDataset's grouping);
    ``IntegrityError`` naming ``where`` and the offset for a member without a key or a key's extension twice."""
    key, grouped, data = "", list[Member](), dict[str, bytes]()
    for member, content in members:
        member_key, extension = split_key(member.name)
        if not posixpath.basename(member_key):
            raise IntegrityError(
                f"{where}: member {member.name!r} at byte {member.offset - BLOCK} has no sample key", url=where
            )
        if member_key != key and grouped:
            yield Sample(key, tuple(grouped)), data
            grouped, data = [], {}
        if extension in data:
            raise IntegrityError(
                f"{where}: member {member.name!r} at byte {member.offset - BLOCK} repeats {extension!r} of"
                f" sample {member_key!r}",
                url=where,
            )
        key = member_key
        grouped.append(member)
        data[extension] = content
    if grouped:
        yield Sample(key, tuple(grouped)), data


def _check_header(block: bytes, where: str, offset: int) -> tuple[bytes, int]:
    try:
        stored = int(block[148:156].split(b"\0")[0].strip() or b"0", 8)
        size = int(block[124:136].split(b"\0")[0].strip() or b"0", 8)
    except ValueError:
        raise _damaged(where, offset, "a header whose checksum or size is not a number") from None
    if stored != sum(block[:148]) + 256 + sum(block[156:]):
        raise _damaged(where, offset, "a header whose checksum does not match")
    return block[156:157], size


def _name(block: bytes) -> str:
    name = block[0:100].split(b"\0")[0]
    prefix = block[345:500].split(b"\0")[0] if block[257:262] == b"ustar" else b""
    return (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")


def _long_name(kind: bytes, data: bytes, where: str, offset: int) -> str | None:
    if kind == b"L":
        return data.split(b"\0")[0].decode("utf-8", "surrogateescape")
    for line in data.split(b"\n"):  # pax records: "<length> <key>=<value>"
        _, _, record = line.partition(b" ")
        key, equals, value = record.partition(b"=")
        if equals and key == b"path":
            return value.decode("utf-8", "surrogateescape")
    return None


def _damaged(where: str, offset: int, why: str) -> IntegrityError:
    return IntegrityError(f"{where}: not a tar archive at byte {offset}: {why}", url=where)


def encode_index(size: int, samples: list[Sample], crc32c: str | None = None) -> bytes:
    """The index of a shard of ``size`` bytes (and ``crc32c``, as GCS reports it) holding ``samples``: JSON,
    one line per sample, each member as ``[name, offset, size]`` and its crc32c where known."""
    head = {"format": _INDEX_FORMAT, "size": size, "samples": len(samples), "crc32c": crc32c}
    lines = [json.dumps(head)]
    lines += [
        json.dumps(
            [
                sample.key,
                [[m.name, m.offset, m.size, *([] if m.crc32c is None else [m.crc32c])] for m in sample.members],
            ]
        )
        for sample in samples
    ]
    return ("\n".join(lines) + "\n").encode()


def decode_index(where: str, data: bytes, size: int, crc32c: str | None = None) -> list[Sample]:
    """The samples an index lists, checked to describe a shard of ``size`` bytes (and ``crc32c``, where both
    the index and the caller know it)."""
    try:
        first, *rest = data.decode().splitlines()
        head: dict[str, Any] = json.loads(first)
        if head["format"] != _INDEX_FORMAT or head["size"] != size or head["samples"] != len(rest):
            raise ValueError(f"it describes another shard or format: {first[:200]}")
        if None not in (crc32c, head.get("crc32c")) and head["crc32c"] != crc32c:
            raise ValueError(f"it describes a shard of crc32c {head['crc32c']}, this one has {crc32c}")
        samples = [Sample(key, tuple(Member(*member) for member in members)) for key, members in map(json.loads, rest)]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{where}: not an index of this shard ({exc})", url=where) from None
    if any(m.offset < 0 or m.offset + m.size > size for sample in samples for m in sample.members):
        raise IntegrityError(f"{where}: an index member lies outside the {size}-byte shard", url=where)
    return samples
