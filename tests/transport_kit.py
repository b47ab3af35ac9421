"""A second transport for ``GCSClient(transport=...)``: urllib3's blocking client, each call on a thread, recording
every request it sends. Another HTTP stack than the library's own, so a test can tell that every request of a
front end went through the transport it was given."""

from __future__ import annotations

import asyncio
import json as json_module
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import urllib3
from multidict import CIMultiDict

PIECE = 64 * 1024


class ThreadedResponse:
    """urllib3's answer as the transport seam's ``Response``: each read runs on a thread."""

    def __init__(self, answer: urllib3.BaseHTTPResponse) -> None:
        self._answer = answer
        self.status = answer.status
        self.headers = CIMultiDict(answer.headers.items())

    async def read(self) -> bytes:
        return await asyncio.to_thread(self._answer.read)

    async def readinto(self, buffer: memoryview) -> int:
        return await asyncio.to_thread(self._answer.readinto, buffer)

    async def chunks(self) -> AsyncIterator[bytes]:
        while piece := await asyncio.to_thread(self._answer.read, PIECE):
            yield piece


MARK = ("X-Sent-By", "recording-transport")
"""A header every request of a :class:`RecordingTransport` carries, so a server can tell them from others."""


class RecordingTransport:
    """Sends each request with urllib3 on a thread, marked with :data:`MARK`, and keeps ``(method, target)`` of
    each in :attr:`sent`."""

    def __init__(self) -> None:
        self._pool = urllib3.PoolManager(maxsize=32, retries=False)
        self._lock = threading.Lock()
        self.sent: list[tuple[str, str]] = []

    def __reduce__(self) -> Any:
        raise TypeError("a RecordingTransport holds connections: it stays in the process that made it")

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
    ) -> AsyncIterator[ThreadedResponse]:
        headers = {**(headers or {}), MARK[0]: MARK[1]}
        body: bytes | None = None
        if json is not None:
            body = json_module.dumps(json).encode()
            headers["Content-Type"] = "application/json"
        elif isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
        elif data is not None:
            body = b"".join(bytes(piece) for piece in data)
        with self._lock:
            self.sent.append((method, target))
        answer = await asyncio.to_thread(
            self._pool.request,
            method,
            target,
            body=body,
            headers=headers,
            preload_content=False,
            decode_content=False,  # the stored bytes, which the checksums cover
            redirect=False,
            timeout=answer_timeout or 60,
        )
        try:
            yield ThreadedResponse(answer)
        finally:
            answer.drain_conn()
            answer.release_conn()

    async def close(self) -> None:
        self._pool.clear()
