"""crc32c over any buffer, read in place: equal to google_crc32c's on the same bytes."""

from __future__ import annotations

import array
import mmap
import random

import google_crc32c
import pytest

from torchdata_gcs._ops import checksums
from torchdata_gcs._ops.checksums import COPIED_PIECE, crc32c_extend

DATA = random.Random(0).randbytes(3 * COPIED_PIECE + 12_345)


def test_the_wheels_c_library_is_found_on_linux() -> None:
    assert checksums._library_extend() is not None


@pytest.mark.parametrize(
    "make",
    [
        bytes,
        bytearray,
        lambda data: memoryview(bytearray(data)),
        lambda data: memoryview(data),  # read-only, not bytes: hashed in bounded copies
    ],
    ids=["bytes", "bytearray", "memoryview", "readonly-memoryview"],
)
def test_equal_to_google_crc32c_on_every_kind_of_buffer_and_slice(make: object) -> None:
    buffer = make(DATA)  # type: ignore[operator]
    assert crc32c_extend(0, buffer) == google_crc32c.value(DATA)
    assert crc32c_extend(12345, buffer) == google_crc32c.extend(12345, DATA)
    view = memoryview(buffer)
    for start, end in [(0, 1), (7, 1_000_003), (COPIED_PIECE - 1, 2 * COPIED_PIECE + 5), (len(DATA) - 3, len(DATA))]:
        assert crc32c_extend(99, view[start:end]) == google_crc32c.extend(99, DATA[start:end])


def test_pieces_extend_to_the_whole() -> None:
    buffer = memoryview(bytearray(DATA))
    crc = 0
    for start in range(0, len(buffer), 65_536):
        crc = crc32c_extend(crc, buffer[start : start + 65_536])
    assert crc == google_crc32c.value(DATA)


def test_empty_buffers_leave_the_crc_as_it_was() -> None:
    for empty in (b"", bytearray(), memoryview(bytearray(10))[5:5], memoryview(b"")):
        assert crc32c_extend(0x1234, empty) == 0x1234


def test_other_buffers_are_read_as_their_bytes() -> None:
    numbers = array.array("i", range(1000))
    assert crc32c_extend(0, numbers) == google_crc32c.value(numbers.tobytes())
    with mmap.mmap(-1, len(DATA)) as mapping:
        mapping[:] = DATA
        assert crc32c_extend(0, mapping) == google_crc32c.value(DATA)


def test_a_non_contiguous_buffer_is_refused() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        crc32c_extend(0, memoryview(bytearray(DATA))[::2])


def test_without_the_c_library_buffers_are_hashed_in_bounded_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksums, "_library_extend", lambda: None)
    assert crc32c_extend(0, bytearray(DATA)) == google_crc32c.value(DATA)
    assert crc32c_extend(0, memoryview(bytearray(DATA))[5:-5]) == google_crc32c.value(DATA[5:-5])
