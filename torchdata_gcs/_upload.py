"""Streaming writes: a binary file object whose bytes go out as the parts of an XML API multipart upload.

Parts are uploaded on the I/O loop as they fill, at most ``max_parts_in_flight`` held at once, so
memory stays near ``part_size x max_parts_in_flight`` whatever the object's size. Part sizes double
every ``PARTS_PER_SIZE`` parts, so 10,000 parts (GCS's limit) reach past GCS's 5 TiB object limit
from 5 MiB parts. The object is published only by a clean :meth:`MultipartWriter.close`; an exception
inside ``with``, a writer dropped without closing, or a part that fails after retries aborts the
upload, and nothing is published. A payload that fits one part goes out in a single request. After
completion the object's crc32c is compared with that of the bytes written; a mismatch deletes it.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections import deque
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar
from urllib.parse import quote
from xml.etree import ElementTree
from xml.sax.saxutils import escape

import google_crc32c

from ._aio import io_loop, wait_unless_on_io_loop
from ._client import transport_for
from ._download import LoadStats, _Job, _with_retry, new_job, reported_crc32c
from ._metadata import crc32c_base64
from ._objects import create_object, delete_object
from ._uri import parse_url
from .config import ClientConfig, RetryConfig, TransferConfig
from .errors import GCSError, IntegrityError, NotFoundError, UploadError

logger = logging.getLogger(__name__)

__all__ = ["MAX_PARTS", "MIN_PART_SIZE", "MultipartWriter", "part_size"]

T = TypeVar("T")

MIN_PART_SIZE = 5 * 1024 * 1024
"""GCS refuses smaller parts, except the last."""
MAX_PARTS = 10_000
PARTS_PER_SIZE = 1000
"""Parts of one size before the size doubles."""


def part_size(number: int, base: int, parts_per_size: int = PARTS_PER_SIZE) -> int:
    """Size of part ``number`` (from 1): ``base``, doubled every ``parts_per_size`` parts.

    >>> [part_size(n, 5, parts_per_size=2) for n in range(1, 7)]
    [5, 5, 10, 10, 20, 20]
    """
    return base << ((number - 1) // parts_per_size)


class MultipartWriter(io.RawIOBase):
    """Write one object as it is produced; publish it on a clean close, never otherwise.

    Example:
        >>> from torchdata_gcs.testing import Emulator, GCSFront
        >>> with Emulator() as emulator, GCSFront(emulator.endpoint) as front:
        ...     emulator.create_bucket("demo")
        ...     with MultipartWriter("gs://demo/big.bin", client=front.client_config, part_size=MIN_PART_SIZE) as writer:
        ...         _ = writer.write(b"x" * (6 * 1024 * 1024))
        ...         _ = writer.write(b"tail")
        ...     len(emulator.read("demo", "big.bin")), front.counts["upload"], front.open_uploads
        (6291460, 4, [])
    """

    def __init__(
        self,
        url: str,
        *,
        client: ClientConfig | None = None,
        retry: RetryConfig | None = None,
        part_size: int = 32 * 1024 * 1024,
        max_parts_in_flight: int = 4,
        parts_per_size: int = PARTS_PER_SIZE,
    ) -> None:
        super().__init__()
        self.check_settings(part_size, max_parts_in_flight)
        self.url = url
        self._bucket, self._name = parse_url(url, allow_prefix=False)
        client = client or ClientConfig()
        self._retry = retry or RetryConfig()
        self._transport = transport_for(client)
        self._job: _Job = new_job(client, TransferConfig(max_in_flight=max_parts_in_flight), self._retry, LoadStats())
        self._xml_path = f"{self._transport.endpoint}/{quote(self._bucket, safe='')}/{quote(self._name, safe='')}"
        self._base, self._parts_per_size, self._max_in_flight = part_size, parts_per_size, max_parts_in_flight
        self._buffer = bytearray()
        self._crc = 0
        self._size = 0
        self._upload_id: str | None = None
        self._sent = 0  # parts handed to the I/O loop
        self._pending: deque[Future[tuple[int, str]]] = deque()
        self._etags: dict[int, str] = {}
        self._state = "open"  # then "published" or "aborted"
        self.generation: int | None = None
        """The published object's generation, once closed cleanly."""

    @staticmethod
    def check_settings(part_size: int, max_parts_in_flight: int) -> None:
        """Raise ``ValueError`` for settings GCS or the writer cannot work with."""
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes (GCS's minimum), got {part_size}")
        if max_parts_in_flight < 1:
            raise ValueError(f"max_parts_in_flight must be at least 1, got {max_parts_in_flight}")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        if self._state != "open":
            raise ValueError(f"write to a {self._state} writer ({self.url})")
        chunk = data if isinstance(data, bytes) else bytes(data)
        self._crc = google_crc32c.extend(self._crc, chunk)
        self._size += len(chunk)
        self._buffer += chunk
        try:
            while len(self._buffer) > (size := part_size(self._sent + 1, self._base, self._parts_per_size)):
                part = bytes(self._buffer[:size])  # the last part is sent by close(), never here
                del self._buffer[:size]
                self._send_part(part)
        except BaseException:
            self.abort()
            raise
        return len(chunk)

    def close(self) -> None:
        """Publish the object (a no-op once published or aborted); on any failure abort and raise."""
        if self._state != "open":
            return
        try:
            if self._upload_id is None:
                self.generation = create_object(
                    self._transport, self._bucket, self._name, bytes(self._buffer), self._retry
                )
            else:
                self._send_part(bytes(self._buffer))
                while self._pending:
                    self._collect(self._pending.popleft())
                self.generation = self._complete()
        except BaseException:
            self.abort()
            raise
        self._state = "published"
        self._buffer = bytearray()
        super().close()

    def abort(self) -> None:
        """Give the upload up: nothing is published and the parts sent are discarded."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._buffer = bytearray()
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        if self._upload_id is not None:
            try:  # a writer collected on the I/O thread only schedules the abort
                wait_unless_on_io_loop(
                    _send(self._job, self.url, self._xml_path, "DELETE", {"uploadId": self._upload_id})
                )
            except NotFoundError:
                pass
            except Exception as exc:  # noqa: BLE001 - an upload left open is billed until GCS drops it
                logger.warning("could not abort the multipart upload of %s: %r", self.url, exc)
        super().close()

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if getattr(self, "_state", None) == "open":  # dropped without close(): never publish
            self.abort()

    # -- the protocol ----------------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, io_loop()).result()

    def _request(
        self, method: str, params: dict[str, Any], data: bytes | None = None
    ) -> tuple[Mapping[str, str], bytes]:
        return self._run(_send(self._job, self.url, self._xml_path, method, params, data))

    def _send_part(self, data: bytes) -> None:
        if self._upload_id is None:
            _, body = self._request("POST", {"uploads": ""})
            self._upload_id = ElementTree.fromstring(body).findtext("{*}UploadId")
        if self._sent == MAX_PARTS:
            raise UploadError(f"{self.url}: more than {MAX_PARTS} parts; use a larger part_size", url=self.url)
        while len(self._pending) >= self._max_in_flight:
            self._collect(self._pending.popleft())
        self._sent += 1
        put = _put_part(self._job, self.url, self._xml_path, self._sent, self._upload_id, data)
        self._pending.append(asyncio.run_coroutine_threadsafe(put, io_loop()))

    def _collect(self, future: Future[tuple[int, str]]) -> None:
        try:
            number, etag = future.result()
        except GCSError as exc:
            raise UploadError(f"{self.url}: a part failed ({exc}); the upload was aborted", url=self.url) from exc
        self._etags[number] = etag

    def _complete(self) -> int:
        parts = "".join(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{escape(etag)}</ETag></Part>"
            for number, etag in sorted(self._etags.items())
        )
        document = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        expected = crc32c_base64(self._crc)
        headers, _ = self._request("POST", {"uploadId": self._upload_id}, document)
        generation = int(headers["x-goog-generation"])
        if reported_crc32c(headers) != expected:
            delete_object(self._transport, self._bucket, self._name, self._retry, if_generation_match=generation)
            raise IntegrityError(
                f"{self.url}: the published object's crc32c is {reported_crc32c(headers)}, the bytes written "
                f"have {expected}; it was deleted",
                url=self.url,
            )
        return generation


# Module-level coroutines: a part in flight must not hold the writer, or a dropped writer (which
# aborts when collected) would stay alive until its parts finish.


async def _send(
    job: _Job, url: str, path: str, method: str, params: dict[str, Any], data: bytes | None = None
) -> tuple[Mapping[str, str], bytes]:
    """One XML API request, retried; its headers (case-insensitive) and body."""

    async def attempt() -> tuple[Mapping[str, str], bytes]:
        async with job.reader.send(method, url, path, params, data=data) as response:
            return response.headers.copy(), await response.read()

    return await _with_retry(job, url, attempt)


async def _put_part(job: _Job, url: str, path: str, number: int, upload_id: str | None, data: bytes) -> tuple[int, str]:
    headers, _ = await _send(job, url, path, "PUT", {"partNumber": number, "uploadId": upload_id}, data)
    return number, headers["ETag"]
