"""What a listing tells about an object, kept so later reads can be pinned and verified."""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

import google_crc32c

from .errors import IntegrityError

__all__ = ["ObjectInfo", "check_crc32c", "crc32c_base64"]


class ObjectInfo(NamedTuple):
    """Size, generation and checksum of one object version, as GCS listed it.

    A named tuple: cheap to build for millions of listed objects, immutable and picklable.

    Attributes:
        size: length in bytes.
        generation: the object version; reads pinned to it fail if the object was overwritten.
        crc32c: base64 of the big-endian CRC32C of the stored bytes, as GCS reports it.
    """

    size: int
    generation: int
    crc32c: str | None = None

    @classmethod
    def from_json(cls, resource: dict[str, Any]) -> ObjectInfo:
        """Build from a JSON API object resource (``size`` and ``generation`` arrive as strings)."""
        return cls(int(resource["size"]), int(resource["generation"]), resource.get("crc32c"))


def crc32c_base64(data: bytes | int) -> str:
    """CRC32C of ``data`` (or a CRC32C value already computed) encoded as GCS reports it."""
    value = data if isinstance(data, int) else google_crc32c.value(data)
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def check_crc32c(url: str, actual: str, expected: dict[str, str | None]) -> None:
    """Raise ``IntegrityError`` unless every known checksum in ``expected`` equals ``actual``.

    ``expected`` maps where a checksum came from (``"GCS"``, ``"the listing"``) to its base64 value.
    """
    for source, value in expected.items():
        if value is not None and value != actual:
            raise IntegrityError(f"{url}: crc32c of the downloaded bytes is {actual}, {source} says {value}", url=url)
