"""MemoryStream and PartStream: an object held as parts, or read ahead part by part, reads like one file
and pickles."""

from __future__ import annotations

import io
import pickle
from concurrent.futures import Future

import google_crc32c
import pytest

from torchdata_gcs import IntegrityError
from torchdata_gcs._engines.streams import MemoryStream, PartStream
from torchdata_gcs._ops.checksums import crc32c_base64

DATA = bytes(range(256)) * 40  # 10,240 bytes


class TinyChunks:
    """A part source that answers in chunks of 7 bytes (as a network may); picklable."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fetched: list[int] = []

    def fetch(self, start: int, length: int) -> Future[list[bytes]]:
        self.fetched.append(start)
        future: Future[list[bytes]] = Future()
        piece = self.data[start : start + length]
        future.set_result([piece[i : i + 7] for i in range(0, len(piece), 7)])
        return future


def part_stream(data: bytes, expected: str | None = None) -> PartStream:
    checksums = {"GCS": expected or crc32c_base64(google_crc32c.value(data))}
    return PartStream("gs://b/o", len(data), 1024, 4096, TinyChunks(data), checksums, None, [data[:5]])


def test_reads_fill_across_parts_and_seek_anywhere() -> None:
    stream = MemoryStream([b"ab", bytearray(b"cde"), memoryview(b"f")])
    buffer = bytearray(4)
    assert stream.readinto(buffer) == 4 and buffer == b"abcd"  # not cut short at a part boundary
    assert stream.read(10) == b"ef" and stream.read(1) == b""
    stream.seek(-4, io.SEEK_END)
    assert stream.read(3) == b"cde" and stream.tell() == 5
    stream.seek(1)
    assert stream.read() == b"bcdef"
    assert io.BufferedReader(MemoryStream([b"x" * 5, b"y" * 5])).read(7) == b"xxxxxyy"


def test_a_part_stream_fills_reads_across_chunks_and_pickles_where_it_stands() -> None:
    stream = part_stream(DATA)
    assert stream.read(1000) == DATA[:1000]  # not cut short at a 7-byte chunk
    assert stream.peek()[:1] == DATA[1000:1001] and stream.readline() == DATA[1000 : DATA.index(b"\n", 1000) + 1]
    position = DATA.index(b"\n", 1000) + 1
    copy = pickle.loads(pickle.dumps(stream))
    assert copy.read() == DATA[position:] and stream.read() == DATA[position:]
    with pytest.raises(IntegrityError, match="crc32c"):
        part_stream(DATA, expected=crc32c_base64(0)).read()
    with pytest.raises(IntegrityError, match="crc32c"):  # a copy taken halfway still checks the whole object
        halfway = part_stream(DATA, expected=crc32c_base64(0))
        halfway.read(3000)
        pickle.loads(pickle.dumps(halfway)).read()
    closed = part_stream(DATA)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(closed)


def test_a_memory_stream_pickles_where_it_stands() -> None:
    stream = MemoryStream([b"ab", memoryview(b"cde")])
    stream.read(3)
    copy = pickle.loads(pickle.dumps(stream))
    assert copy.tell() == 3 and copy.read() == b"de" and copy.peek() == b""
