"""The download engine over a second transport, in memory: answers whose bodies arrive at exact byte
boundaries, or break off mid-body, which the emulator cannot be made to send. Shows that engines see only
the transport seam (``GCSClient(transport=...)``); the emulator tests stay the contract."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import google_crc32c
import pytest
from multidict import CIMultiDict

from torchdata_gcs import ClientConfig, GCSClient, RetryConfig, TransferConfig
from torchdata_gcs._engines.download import fetch_object
from torchdata_gcs._ops.checksums import ObjectInfo, crc32c_base64
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.loop import run
from torchdata_gcs.errors import IntegrityError

DATA = bytes((i * 7 + 3) % 251 for i in range(1000))
CRC = crc32c_base64(google_crc32c.value(DATA))
URL = "gs://bucket/dir/object.bin"


@dataclasses.dataclass
class Canned:
    """One answer: its status, headers, body in the pieces it arrives in, and after how many pieces the
    connection breaks (``None``: never)."""

    status: int
    headers: dict[str, str]
    pieces: list[bytes]
    break_after: int | None = None


class MemoryResponse:
    """A canned answer as the transport seam's ``Response``."""

    def __init__(self, canned: Canned) -> None:
        self.status = canned.status
        self.headers = CIMultiDict(canned.headers)
        self._pieces = deque(canned.pieces)
        self._left = canned.break_after

    async def _next(self) -> bytes:
        await asyncio.sleep(0)  # each piece arrives on its own turn of the loop, as from a socket
        if self._left == 0:
            raise ConnectionResetError("connection reset by peer")
        if not self._pieces:
            return b""
        if self._left is not None:
            self._left -= 1
        return self._pieces.popleft()

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])

    async def readinto(self, buffer: memoryview) -> int:
        piece = await self._next()
        count = min(len(piece), len(buffer))
        buffer[:count] = piece[:count]
        if count < len(piece):
            self._pieces.appendleft(piece[count:])
        return count

    async def chunks(self) -> AsyncIterator[bytes]:
        while piece := await self._next():
            yield piece


class MemoryTransport:
    """Gives the canned answers in order and records each request's method, target and headers."""

    def __init__(self, *answers: Canned) -> None:
        self.answers = deque(answers)
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    @asynccontextmanager
    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None,
        *,
        url: str,
        json: Any = None,
        data: Any = None,
        answer_timeout: float | None = None,
    ) -> AsyncIterator[MemoryResponse]:
        self.requests.append((method, target, dict(headers or {})))
        yield MemoryResponse(self.answers.popleft())

    async def close(self) -> None:
        pass


def pieces_at(data: bytes, *cuts: int) -> list[bytes]:
    """``data`` cut at the given offsets."""
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def whole(data: bytes, crc: str = CRC, **more: str) -> dict[str, str]:
    return {
        "Content-Length": str(len(data)),
        "x-goog-hash": f"md5=AAAA, crc32c={crc}",
        "x-goog-generation": "7",
        **more,
    }


def fetch(transport: MemoryTransport, info: ObjectInfo | None, retry: RetryConfig | None = None) -> bytes:
    config = ClientConfig(endpoint="http://in-memory.invalid", anonymous=True)
    retry = retry or RetryConfig(initial_delay=0.001, max_delay=0.001, deadline=10)
    context = Client(GCSClient(config, retry=retry, transport=transport)).context()
    loaded, _ = run(fetch_object(context, URL, info, 0))
    assert isinstance(loaded, (bytes, list))
    return loaded if isinstance(loaded, bytes) else b"".join(loaded)


def test_a_body_in_odd_pieces_arrives_whole_and_checked() -> None:
    transport = MemoryTransport(Canned(200, whole(DATA), pieces_at(DATA, 1, 4, 511, 997, 999)))
    assert fetch(transport, ObjectInfo(len(DATA), 7, CRC)) == DATA
    ((method, target, _),) = transport.requests
    assert (method, target) == (
        "GET",
        "http://in-memory.invalid/download/storage/v1/b/bucket/o/dir%2Fobject.bin?alt=media&generation=7",
    )


def test_an_object_of_unknown_size_is_asked_for_its_first_part_and_read_to_the_end() -> None:
    answer = Canned(
        206, {**whole(DATA), "Content-Range": f"bytes 0-{len(DATA) - 1}/{len(DATA)}"}, pieces_at(DATA, 3, 5)
    )
    transport = MemoryTransport(answer)
    assert fetch(transport, None) == DATA
    assert transport.requests[0][2]["Range"] == f"bytes=0-{TransferConfig().part_size - 1}"


def test_a_body_cut_off_mid_way_is_read_again() -> None:
    broken = Canned(200, whole(DATA), pieces_at(DATA, 100, 333), break_after=2)
    transport = MemoryTransport(broken, Canned(200, whole(DATA), pieces_at(DATA, 999)))
    assert fetch(transport, ObjectInfo(len(DATA), 7, CRC)) == DATA
    assert len(transport.requests) == 2


def test_a_damaged_body_is_never_handed_out() -> None:
    damaged = bytearray(DATA)
    damaged[600] ^= 0x10
    bad = Canned(200, whole(DATA), pieces_at(bytes(damaged), 599, 601))
    transport = MemoryTransport(bad, Canned(200, whole(DATA), pieces_at(DATA, 600)))
    assert fetch(transport, ObjectInfo(len(DATA), 7, CRC)) == DATA  # read again, and only the good bytes given
    assert len(transport.requests) == 2

    always_bad = MemoryTransport(*(dataclasses.replace(bad) for _ in range(3)))
    with pytest.raises(IntegrityError, match=f"crc32c of the downloaded bytes is .*, GCS says {CRC}"):
        fetch(always_bad, ObjectInfo(len(DATA), 7, CRC), RetryConfig(initial_delay=0.001, max_attempts=3, deadline=10))
    assert len(always_bad.requests) == 3
