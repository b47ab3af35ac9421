"""What a listing tells about an object, kept so later reads can be pinned and verified."""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

import google_crc32c

__all__ = ["ObjectInfo", "crc32c_base64"]


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


def crc32c_base64(data: bytes | memoryview) -> str:
    """CRC32C of ``data`` encoded as GCS reports it."""
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode("ascii")
