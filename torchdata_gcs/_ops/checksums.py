"""What a listing tells about an object, kept so later reads can be pinned and verified."""

from __future__ import annotations

import base64
import ctypes
import functools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import google_crc32c

from ..errors import IntegrityError

__all__ = [
    "COPIED_PIECE",
    "REQUIRED_FIELDS",
    "SMALL_PIECE",
    "ObjectInfo",
    "check_crc32c",
    "crc32c_base64",
    "crc32c_extend",
    "crc32c_of_concatenation",
    "crc32c_value",
    "hash_header",
    "reported_crc32c",
    "verify_bytes",
]


class ObjectInfo(NamedTuple):
    """Size, generation and checksum of one object version, as GCS listed it.

    A named tuple: cheap to build for millions of listed objects, immutable and picklable.

    Attributes:
        size: length in bytes.
        generation: the object version; reads pinned to it fail if the object was overwritten.
        crc32c: base64 of the big-endian CRC32C of the stored bytes, as GCS reports it.
        storage_class: ``"STANDARD"``, ``"NEARLINE"``, ``"COLDLINE"`` or ``"ARCHIVE"``; ``None`` if
            not known (the object was described without it).
    """

    size: int
    generation: int
    crc32c: str | None = None
    storage_class: str | None = None

    @classmethod
    def from_json(cls, resource: dict[str, Any]) -> ObjectInfo:
        """Build from a JSON API object resource (``size`` and ``generation`` arrive as strings)."""
        return cls(
            int(resource["size"]), int(resource["generation"]), resource.get("crc32c"), resource.get("storageClass")
        )


REQUIRED_FIELDS = ("size", "generation")
"""The fields of a JSON API object resource that :meth:`ObjectInfo.from_json` needs."""


def crc32c_base64(data: bytes | int) -> str:
    """CRC32C of ``data`` (or a CRC32C value already computed) encoded as GCS reports it."""
    value = data if isinstance(data, int) else google_crc32c.value(data)
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


COPIED_PIECE = 1024 * 1024
"""Where google_crc32c's C library cannot be called directly, a buffer other than ``bytes`` is hashed
in copies of at most this many bytes."""

SMALL_PIECE = 16 * 1024
"""A buffer up to this size is hashed in a copy: a call of the C library by address costs more."""


@functools.cache
def _library_extend() -> Callable[[int, int, int], int] | None:
    """``crc32c_extend(crc, address, length)`` of the C library that google_crc32c's Linux wheels ship beside
    the package (``google_crc32c.libs/libcrc32c-*.so``), called through ctypes, which releases the interpreter
    lock during the call; ``None`` where no such library is found (other wheel layouts, a source build)."""
    for library in sorted(Path(google_crc32c.__file__).parent.parent.glob("google_crc32c.libs/libcrc32c*.so*")):
        try:
            extend = ctypes.CDLL(str(library)).crc32c_extend
        except (OSError, AttributeError):
            continue
        extend.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
        extend.restype = ctypes.c_uint32
        return extend
    return None


def crc32c_extend(crc: int, data: bytes | bytearray | memoryview) -> int:
    """``crc`` extended by the bytes of ``data``: ``bytes``, or any C-contiguous buffer (a ``bytearray``, a
    ``memoryview`` or slice of one, an ``mmap``), read in place. ``google_crc32c.extend`` takes ``bytes``
    only; a writable buffer larger than :data:`SMALL_PIECE` goes to its C library by address instead, with
    no copy; any other (or any buffer, where that library is not found) in copies of :data:`COPIED_PIECE`.

    >>> crc = crc32c_extend(0, b"hello ")
    >>> crc32c_extend(crc, memoryview(bytearray(b"world"))) == google_crc32c.value(b"hello world")
    True
    """
    if isinstance(data, bytes):
        return int(google_crc32c.extend(crc, data))
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("crc32c_extend needs a C-contiguous buffer")
    view = view.cast("B")
    if not view:
        return crc
    extend = _library_extend()
    if extend is not None and not view.readonly and len(view) > SMALL_PIECE:
        return int(extend(crc, ctypes.addressof(ctypes.c_char.from_buffer(view)), len(view)))
    for start in range(0, len(view), COPIED_PIECE):
        crc = google_crc32c.extend(crc, bytes(view[start : start + COPIED_PIECE]))
    return crc


def crc32c_value(encoded: str) -> int:
    """The CRC32C value of GCS's base64 encoding; the inverse of :func:`crc32c_base64`."""
    return int.from_bytes(base64.b64decode(encoded), "big")


def check_crc32c(url: str, actual: str, expected: dict[str, str | None]) -> None:
    """Raise ``IntegrityError`` unless every known checksum in ``expected`` equals ``actual``.

    ``expected`` maps where a checksum came from (``"GCS"``, ``"the listing"``) to its base64 value.
    """
    for source, value in expected.items():
        if value is not None and value != actual:
            raise IntegrityError(f"{url}: crc32c of the downloaded bytes is {actual}, {source} says {value}", url=url)


def _header_values(headers: Any, name: str) -> list[str]:
    """Every line of header ``name``: a transport's headers and ``http.client``'s keep repeated lines apart,
    while ``requests`` joins them with commas (which the caller splits anyway)."""
    for get_all in ("getall", "get_all"):
        method = getattr(headers, get_all, None)
        if method is not None:
            return list(method(name, None) or [])
    value = headers.get(name)
    return [] if value is None else [value]


def reported_crc32c(headers: Any) -> str | None:
    """The crc32c that GCS's ``x-goog-hash`` answer header reports, or ``None`` when it reports none.

    GCS may send ``crc32c=`` and ``md5=`` on one line, comma-separated, or as separate header lines
    in any order; every line and every value is read. Two different crc32c values raise
    ``IntegrityError``.

    >>> reported_crc32c({"x-goog-hash": "md5=XrY7u+Ae7tCTyyK7j1rNww==, crc32c=yZRlqg=="})
    'yZRlqg=='
    >>> from multidict import CIMultiDict
    >>> headers = CIMultiDict([("X-Goog-Hash", "md5=XrY7u+Ae7tCTyyK7j1rNww=="), ("x-goog-hash", "crc32c=yZRlqg==")])
    >>> reported_crc32c(headers)
    'yZRlqg=='
    >>> reported_crc32c({}) is None
    True
    """
    found: set[str] = set()
    for line in _header_values(headers, "x-goog-hash"):
        for item in line.split(","):
            kind, _, value = item.strip().partition("=")
            if kind.strip().lower() == "crc32c" and value.strip():
                found.add(value.strip())
    if len(found) > 1:
        raise IntegrityError(f"GCS reported several different crc32c values: {sorted(found)}")
    return found.pop() if found else None


def hash_header(crc32c: int) -> dict[str, str]:
    """The request header that asks GCS to refuse a body whose crc32c is not ``crc32c``.

    >>> hash_header(0)
    {'x-goog-hash': 'crc32c=AAAAAA=='}
    """
    return {"x-goog-hash": f"crc32c={crc32c_base64(crc32c)}"}


_POLYNOMIAL = 0x82F63B78
"""CRC32C's (Castagnoli's) polynomial, bit-reversed: bit 31 of a register is the coefficient of x^0."""


def _multiply(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial, both in the bit-reversed form the CRC register holds."""
    product, bit = 0, 1 << 31  # x^0
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLYNOMIAL if b & 1 else b >> 1  # b * x
    return product


def _powers_of_x() -> list[int]:
    """x^(2^k) modulo the polynomial for k = 0..66: enough for any length GCS stores, in bits."""
    powers = [1 << 30]  # x^1
    for _ in range(66):
        powers.append(_multiply(powers[-1], powers[-1]))
    return powers


_X_TO_2_TO_THE = _powers_of_x()


def _shift(crc: int, length: int) -> int:
    """``crc`` multiplied by x^(8 * length): what ``length`` bytes after the message do to its register,
    in one multiplication per bit of ``length`` instead of a pass over that many bytes."""
    bits, k = 8 * length, 0
    while bits:
        if bits & 1:
            crc = _multiply(_X_TO_2_TO_THE[k], crc)
        bits >>= 1
        k += 1
    return crc


def crc32c_of_concatenation(pieces: Iterable[tuple[int, int]]) -> int:
    """CRC32C of pieces laid end to end, from each piece's ``(crc32c, length)`` alone.

    CRC32C's initial and final inversions cancel in ``crc(A + B) == crc(A) * x^(8 * len(B)) ^ crc(B)`` (modulo
    its polynomial), so a composite's checksum follows from its sources' listed checksums without their
    bytes, in O(log len(B)) per piece.

    >>> crc32c_of_concatenation([(google_crc32c.value(b"hello "), 6), (google_crc32c.value(b"world"), 5)]) == (
    ...     google_crc32c.value(b"hello world")
    ... )
    True
    """
    crc = 0
    for piece_crc, length in pieces:
        crc = _shift(crc, length) ^ piece_crc
    return crc


def verify_bytes(url: str, parts: Sequence[bytes], size: int | None, crc32cs: dict[str, str | None]) -> None:
    """Raise ``IntegrityError`` unless the object made of ``parts`` has ``size`` bytes and matches every
    known crc32c (``crc32cs`` maps a checksum's source, such as ``"GCS"``, to its base64 value)."""
    length = sum(map(len, parts))
    if size is not None and length != size:
        raise IntegrityError(f"{url}: got {length} bytes, expected {size}", url=url)
    if any(value is not None for value in crc32cs.values()):
        crc = 0
        for part in parts:
            crc = crc32c_extend(crc, part)
        check_crc32c(url, crc32c_base64(crc), crc32cs)
