"""MemoryStream: an object held as parts reads like one file."""

from __future__ import annotations

import io

from torchdata_gcs._streams import MemoryStream


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
