"""Concurrent whole-object downloads delivered in input order, with bounded buffering and checks.

Each object is read in one GET on a worker thread, checked against its size and crc32c, and handed
to the consumer in the order the URLs arrived. A byte budget bounds what is downloaded ahead of the
consumer; the oldest undelivered object may always proceed, so one object larger than the budget
still loads (alone) and the window never deadlocks.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ._client import Transport
from ._metadata import ObjectInfo, crc32c_base64
from ._retry import call_with_retry
from ._uri import parse_url
from .config import RetryConfig, TransferConfig
from .errors import IntegrityError, MissingObjectWarning, NotFoundError

_CRC32C_IN_HASH_HEADER = re.compile(r"crc32c=([A-Za-z0-9+/=]+)")


class _Cancelled(Exception):
    """The consumer went away while a download waited for buffer space."""


class ByteBudget:
    """Counts bytes buffered ahead of the consumer; waits while a newcomer would exceed the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._head = 0
        self._closed = False
        self._cond = threading.Condition()

    def acquire(self, nbytes: int, seq: int) -> None:
        """Reserve ``nbytes`` for item ``seq``; the oldest undelivered item never waits."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or seq == self._head or self._used + nbytes <= self.limit)
            if self._closed:
                raise _Cancelled
            self._used += nbytes

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._used -= nbytes
            self._cond.notify_all()

    def advance(self, head: int) -> None:
        """Item ``head`` is now the oldest undelivered one."""
        with self._cond:
            self._head = head
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _reported_crc32c(headers: Any) -> str | None:
    match = _CRC32C_IN_HASH_HEADER.search(headers.get("x-goog-hash", ""))
    return match.group(1) if match else None


def _verify(url: str, data: bytes, info: ObjectInfo | None, reported_crc32c: str | None) -> None:
    if info is not None and len(data) != info.size:
        raise IntegrityError(f"{url}: got {len(data)} bytes, the listing said {info.size}", url=url)
    actual = crc32c_base64(data)
    for source, expected in (("GCS", reported_crc32c), ("the listing", info.crc32c if info else None)):
        if expected is not None and expected != actual:
            raise IntegrityError(
                f"{url}: crc32c of the downloaded bytes is {actual}, {source} says {expected}", url=url
            )


def fetch_object(
    transport: Transport,
    url: str,
    info: ObjectInfo | None,
    retry: RetryConfig,
    budget: ByteBudget,
    seq: int,
) -> tuple[bytes, int]:
    """Download one object's stored bytes (pinned to ``info.generation`` when known), verified.

    Returns the bytes and the budget reserved for them, which the caller releases.
    """
    bucket, name = parse_url(url, allow_prefix=False)
    path = transport.object_path(bucket, name, media=True)
    params: dict[str, Any] = {"alt": "media"}
    if info is not None:
        params["generation"] = info.generation

    def attempt() -> tuple[bytes, int]:
        with transport.request("GET", path, url=url, params=params, stream=True) as response:
            length = response.headers.get("Content-Length")
            reserved = min(int(length), budget.limit) if length is not None else budget.limit
            budget.acquire(reserved, seq)
            try:
                # Stored bytes exactly: no transparent gunzip, so the crc32c applies.
                data = response.raw.read(decode_content=False)
                _verify(url, data, info, _reported_crc32c(response.headers))
            except BaseException:
                budget.release(reserved)
                raise
            return data, reserved

    try:
        return call_with_retry(attempt, retry, url=url)
    except NotFoundError as exc:
        if info is None:
            raise
        raise NotFoundError(
            f"{url} generation {info.generation} no longer exists: the object was deleted or "
            "overwritten after it was listed",
            url=url,
            status=exc.status,
        ) from exc


def load_in_order(
    items: Iterable[tuple[str, ObjectInfo | None]],
    transport: Transport,
    transfer: TransferConfig,
    retry: RetryConfig,
    *,
    skip_missing: bool,
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(url, bytes)`` for each item in input order, ``max_in_flight`` requests at a time."""
    budget = ByteBudget(transfer.max_buffered_bytes)
    window: deque[tuple[str, Future[tuple[bytes, int]]]] = deque()
    executor = ThreadPoolExecutor(transfer.max_in_flight, thread_name_prefix="torchdata-gcs-load")
    delivered = 0

    def deliver() -> Iterator[tuple[str, bytes]]:
        nonlocal delivered
        url, future = window.popleft()
        delivered += 1
        try:
            data, reserved = future.result()
        except NotFoundError:
            if not skip_missing:
                raise
            warnings.warn(f"skipping {url}: it no longer exists", MissingObjectWarning, stacklevel=4)
            return
        finally:
            budget.advance(delivered)
        budget.release(reserved)
        yield url, data

    try:
        for seq, (url, info) in enumerate(items):
            window.append((url, executor.submit(fetch_object, transport, url, info, retry, budget, seq)))
            while len(window) > 2 * transfer.max_in_flight or (window and window[0][1].done()):
                yield from deliver()
        while window:
            yield from deliver()
    finally:
        budget.close()
        for _, future in window:
            future.cancel()
        executor.shutdown(wait=False, cancel_futures=True)
