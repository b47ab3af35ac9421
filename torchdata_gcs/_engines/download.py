"""Concurrent object downloads delivered in input order, with bounded buffering and checks.

Reads run as coroutines on the process's I/O loop (``_transport/loop.py``); the consumer thread submits objects
ahead of itself and takes them back in order. An object up to ``part_size`` is one GET; a larger
one is read as concurrent ranges into one buffer, each range resuming from the byte it reached,
all pinned to one generation. Every object is checked by length and crc32c. A byte budget bounds
what is downloaded ahead of the consumer; the oldest undelivered object may always proceed, so one
object larger than the budget still loads (alone) and the window never deadlocks.
"""

from __future__ import annotations

import asyncio
import functools
import io
import logging
import sys
import time
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TypeVar, cast

from .._ops.checksums import (
    REQUIRED_FIELDS,
    ObjectInfo,
    check_crc32c,
    crc32c_base64,
    crc32c_of_concatenation,
    verify_bytes,
)
from .._ops.client import Client
from .._ops.objects import object_resource
from .._ops.reads import MediaAnswer, learn_version, media_answer, read_ranges_into, version_gone
from .._ops.urls import parse_url
from .._transport.context import RequestContext, with_retry
from .._transport.http import is_missing_bucket
from .._transport.loop import Handoff, Slot, close_at_exit
from .._transport.retry import reread_while_damaged_async
from ..errors import GCSError, IntegrityError, MissingObjectWarning, NotFoundError
from .local_cache import LOCK_POLL, CacheEntry, CacheStore, LocalCache, store_of
from .ranges import VersionRanges
from .streams import FilledBytes, MemoryStream, PartStream

logger = logging.getLogger(__name__)

__all__ = [
    "CachedReads",
    "as_stream",
    "deliver_in_order",
    "fetch_object",
    "load_in_order",
    "load_one",
]

T = TypeVar("T")

HANDOFF_UNITS = 16
"""Units handed to the I/O loop together once the window is half full (see :func:`deliver_in_order`)."""

STREAM_AHEAD_PARTS = 4
"""An object larger than the byte budget is read at most this many parts ahead of its reader."""


Loaded = bytes | list[bytes] | list[memoryview] | PartStream
"""An object's bytes (whole, or in the chunks of its one GET, or views into a composite's chunks), or a
stream over one too large for the byte budget."""


def as_stream(url: str, data: Loaded) -> IO[bytes]:
    """A loaded object as a binary stream named by its URL (seekable unless streamed); it pickles, so it
    crosses from DataLoader workers to the main process."""
    if isinstance(data, bytes):
        stream = io.BytesIO(data)  # shares the bytes
        stream.name = url  # BytesIO takes attributes; its pickle keeps them
        return stream
    return cast(IO[bytes], MemoryStream(data, url) if isinstance(data, list) else data)


def fetch_object(context: RequestContext, url: str, info: ObjectInfo | None, seq: int) -> Awaitable[tuple[Loaded, int]]:
    """Download one object's stored bytes, verified, pinned to one generation (the listed one, if known).

    An object larger than ``part_size`` is read as concurrent ranges straight into one ``bytes`` of its
    size; one larger than the byte budget comes back as a :class:`PartStream` that reads ahead within its
    share of the budget and gives it back when closed, or, held until verified, in one ``bytes``. Returns
    the bytes (or stream) and the budget reserved for bytes, which the consumer releases.
    """
    return _ObjectRead(context, url, info, seq).run()


class _ObjectRead:
    """One :func:`fetch_object` call's state. An object rather than closures: hundreds are in flight
    at once, and each closure cell and function object is more for the garbage collector to walk."""

    __slots__ = (
        "buffer",
        "checksums",
        "context",
        "filled",
        "filled_crc",
        "info",
        "params",
        "path",
        "reserved",
        "seq",
        "url",
    )

    def __init__(self, context: RequestContext, url: str, info: ObjectInfo | None, seq: int) -> None:
        bucket, name = parse_url(url, allow_prefix=False)
        self.context, self.url, self.info, self.seq = context, url, info, seq
        self.path = context.session.media_path(bucket, name)
        self.params: dict[str, Any] = (
            {"alt": "media"} if info is None else {"alt": "media", "generation": info.generation}
        )
        self.checksums = {"GCS": None, "the listing": info.crc32c if info is not None else None}
        self.reserved = 0
        self.buffer: FilledBytes | None = None  # the one buffer an object read in ranges is held in
        self.filled = self.filled_crc = 0  # bytes the first answer put there, and their crc32c

    async def run(self) -> tuple[Loaded, int]:
        context, url, info, params = self.context, self.url, self.info, self.params
        try:
            if info is not None and info.size > context.part_size:
                size, parts = info.size, []
                self.reserved = self.share(size)
                await context.budget.acquire(self.reserved, self.seq)
            else:
                try:
                    first, size = await with_retry(context, url, self.first_answer)
                except NotFoundError as exc:
                    if info is None or is_missing_bucket(exc):
                        raise
                    raise version_gone(url, params, exc) from exc
                if sum(map(len, first)) == size:
                    return (first[0] if len(first) == 1 else first), self.reserved
                parts = first
                if "generation" not in params or self.checksums["GCS"] is None:  # the answer did not say: ask
                    await learn_version(context, url, params, self.checksums)
            if self.streamed(size):
                return self.stream(size, parts), self.reserved
            return await self.assemble(size), self.reserved
        except BaseException:
            if self.reserved:
                context.budget.release(self.reserved)
            raise

    async def assemble(self, size: int) -> bytes:
        """The whole object as one ``bytes``, held once: the rest after what the first answer put in
        place, read as concurrent ranges straight into place, checked against the crc32c combined from
        the ranges' own, without another pass. Damaged bytes are read again, all of them, as retries allow."""
        context, url = self.context, self.url
        buffer = self.buffer or FilledBytes(size)
        self.buffer = None
        start, first_crc = self.filled, self.filled_crc

        async def read_rest() -> int:
            generation = int(self.params["generation"])
            return await read_ranges_into(context, url, generation, start, buffer.view[start:], context.part_size)

        def check(rest: int) -> bytes:
            nonlocal start, first_crc
            crc = crc32c_of_concatenation([(first_crc, start), (rest, size - start)])
            start = first_crc = 0  # if damaged, all of it again
            check_crc32c(url, crc32c_base64(crc), self.checksums)
            return buffer.take()

        return await reread_while_damaged_async(read_rest, check, context.retry, url, context.stats.count_retry)

    def streamed(self, size: int) -> bool:
        """Whether an object of ``size`` bytes is handed out as a stream that reads ahead, not held whole
        (one larger than the budget, unless bytes are to be held until verified)."""
        return size > self.context.budget.limit and not self.context.hold_until_verified

    def share(self, size: int) -> int:
        """Budget to hold for an object: all of it, or a stream's read-ahead."""
        return (
            min(self.context.budget.limit, STREAM_AHEAD_PARTS * self.context.part_size) if self.streamed(size) else size
        )

    def stream(self, size: int, first: list[bytes]) -> PartStream:
        context, loop, allowance = self.context, asyncio.get_running_loop(), self.reserved

        def give_back() -> None:
            loop.call_soon_threadsafe(context.budget.release, allowance)

        source = VersionRanges(context, self.url, self.params)
        return PartStream(self.url, size, context.part_size, allowance, source, self.checksums, give_back, first)

    async def check_whole(self, chunks: list[bytes]) -> None:
        """Check a whole object's bytes; with no checksum from GCS or the listing, ask its metadata
        first (GCS sends one with every read, so this costs a request only where an answer lacks it)."""
        if self.checksums["GCS"] is None and self.checksums["the listing"] is None:
            await learn_version(self.context, self.url, self.params, self.checksums)
        verify_bytes(self.url, chunks, self.info.size if self.info is not None else None, self.checksums)

    async def first_answer(self) -> tuple[list[bytes], int]:
        """The whole object, or its first part (in chunks); and the object's size.

        An object of unknown size (nothing listed) is asked for its first part only (``Range``): a 206
        names the object's size in ``Content-Range`` and ends where the part ends, so its connection is
        kept for the next request; a 416 says that there is no byte 0 (GCS's answer for an empty object);
        a 200 (something on the way ignored ``Range``) carries the whole object.
        """
        context = self.context
        first_part = _first_part(context.part_size) if self.info is None else None
        try:
            async with media_answer(context, self.url, self.path, self.params, first_part) as answer:
                return await self.take_first_answer(answer, ranged=first_part is not None)
        except GCSError as exc:
            if first_part is None or exc.status != 416:
                raise
            return [b""], 0

    async def take_first_answer(self, answer: MediaAnswer, *, ranged: bool) -> tuple[list[bytes], int]:
        """Read :meth:`first_answer`'s answer (to a request for the first part if ``ranged``)."""
        context = self.context
        self.checksums["GCS"] = answer.crc32c
        if answer.generation is not None:
            self.params.setdefault("generation", answer.generation)
        total = answer.object_size(context.part_size)
        if total is None:  # size unknown until the end: read the answer whole
            chunks = await answer.read_at_most(sys.maxsize)
            received = sum(map(len, chunks))
            context.stats.bytes += received
            if not self.reserved:
                self.reserved = received
                await context.reserve_while_sending(received, self.seq)
            await self.check_whole(chunks)
            return chunks, received
        if not self.reserved:
            self.reserved = self.share(total)
            await context.reserve_while_sending(self.reserved, self.seq)
        # The whole object, or if larger than a part its first part (the rest is then read as ranges of
        # the same generation). A 206 is read to its end (one byte more is asked to see the end), which
        # keeps its connection. A 200 to a Range came from something that ignores Range (ranges would
        # get the whole object again): it is read whole unless larger than the byte budget. Any other
        # 200 is dropped after its first part. Chunks are kept as they came, or for an object held whole
        # and read in ranges put straight into its one buffer: joining them would hold the object twice.
        whole = answer.status == 200 and ranged and not self.streamed(total)
        expected = total if whole else min(total, context.part_size)
        if expected < total and not self.streamed(total):
            self.buffer, chunks = FilledBytes(total), []
            target = self.buffer.view[:expected]
            received, self.filled_crc = await answer.read_into(target, to_the_end=answer.status == 206)
            self.filled = received
        else:
            chunks = await answer.read_at_most(expected + 1 if answer.status == 206 else expected)
            received = sum(map(len, chunks))
        context.stats.bytes += received
        if received != expected:
            raise IntegrityError(
                f"{self.url}: the first answer held {received} bytes, expected {expected}", url=self.url
            )
        if received == total:
            await self.check_whole(chunks)  # bad bytes: retried
            return chunks, received
        return chunks, total


@functools.lru_cache(maxsize=16)
def _first_part(part_size: int) -> dict[str, str]:
    """The headers that ask for an object's first part (shared by every such request, never changed)."""
    return {"Range": f"bytes=0-{part_size - 1}"}


Outcome = tuple[str, "Loaded | NotFoundError"]
"""One object's result: its bytes, or the ``NotFoundError`` that the consumer raises or skips."""


@dataclass(frozen=True)
class Ready:
    """Outcomes known when their unit is made (objects read from the local cache): delivered in their turn
    without a trip to the I/O loop."""

    outcomes: list[Outcome]


Unit = Callable[["RequestContext", int], Awaitable[tuple[list[Outcome], int]]] | Ready
"""Loads a run of consecutive objects given the request context and its sequence number; returns their outcomes
in order and the budget to give back once they are delivered. Or, :class:`Ready`, the outcomes themselves."""


async def load_one(url: str, info: ObjectInfo | None, context: RequestContext, seq: int) -> tuple[list[Outcome], int]:
    """One object as a :data:`Unit`: a stream keeps its budget share until it is closed."""
    try:
        data, reserved = await fetch_object(context, url, info, seq)
    except NotFoundError as exc:
        if is_missing_bucket(exc):  # never a missing object to skip
            raise
        return [(url, exc)], 0
    return [(url, data)], 0 if isinstance(data, PartStream) else reserved


def deliver_in_order(
    units: Iterable[Unit], context: RequestContext, window_size: int, *, skip_missing: bool
) -> Iterator[tuple[str, Loaded]]:
    """:func:`_deliver_in_order`, closed at exit if it is still open then (its requests cancelled)."""
    return close_at_exit(_deliver_in_order(units, context, window_size, skip_missing=skip_missing))


def _deliver_in_order(
    units: Iterable[Unit], context: RequestContext, window_size: int, *, skip_missing: bool
) -> Generator[tuple[str, Loaded], None, None]:
    """Run ``units`` on the I/O loop, ``window_size`` ahead of the consumer, and yield their
    ``(url, bytes or stream)`` in order; a missing object raises, or with ``skip_missing`` warns.

    The window is filled from ``units`` before an object is given out, even one that is already
    loaded: what the consumer has not taken downloads while it works on what it took. New units reach
    the loop in batches (:class:`Handoff`): at once while fewer than half the window is on the loop,
    else every :data:`HANDOFF_UNITS`, and all before the consumer waits. The budget of a delivered
    object is given back at once (:meth:`ByteBudget.give_back`), the loop woken only for a read that
    waits for it, so nothing ever waits on what the consumer holds.
    """
    handoff = Handoff()
    stats = context.stats
    window: deque[Slot[tuple[list[Outcome], int]]] = deque()
    delivered = 0

    def keep_the_loop_busy() -> None:
        """Hand new units over once fewer than half the window is on the loop, or a batch is ready."""
        if len(window) - len(handoff) < window_size // 2 or len(handoff) >= HANDOFF_UNITS:
            handoff.flush()

    def deliver() -> Iterator[tuple[str, Loaded]]:
        nonlocal delivered
        future = window.popleft()
        delivered += 1
        if not future.done():
            handoff.flush()
        waited = time.perf_counter()
        try:
            outcomes, held = future.result()
        finally:
            stats.wait_seconds += time.perf_counter() - waited
        if context.budget.give_back(held, delivered):  # a read waits for room: wake it now
            handoff.call(context.budget.wake)
            handoff.flush()
        keep_the_loop_busy()
        for url, data in outcomes:
            if isinstance(data, NotFoundError):
                if not skip_missing:
                    raise data
                stats.missing += 1
                warnings.warn(f"skipping {url}: it no longer exists", MissingObjectWarning, stacklevel=4)
                continue
            stats.objects += 1
            yield url, data

    try:
        for seq, unit in enumerate(units):
            if isinstance(unit, Ready):  # read already (from the local cache): nothing for the loop to do
                window.append(Slot.holding((unit.outcomes, 0)))
            else:
                window.append(handoff.submit(unit(context, seq)))  # type: ignore[arg-type]  # a Unit returns a coroutine, typed as an Awaitable
                keep_the_loop_busy()
            if len(window) > window_size:
                yield from deliver()
        handoff.flush()
        while window:
            yield from deliver()
    finally:
        handoff.cancel(window)
        handoff.call(context.budget.close)
        handoff.flush()
        logger.debug("loaded %d objects: %s", stats.objects, stats)


def load_in_order(
    items: Iterable[tuple[str, ObjectInfo | None]],
    client: Client,
    *,
    skip_missing: bool,
    cache: LocalCache | None = None,
) -> Iterator[tuple[str, Loaded]]:
    """Yield ``(url, bytes or stream)`` for each item in input order, ``max_in_flight`` requests at a time; with
    a ``cache``, each object from it where its version is there, else from GCS (and then kept)."""
    context = client.context()
    reads = CachedReads(cache, context) if cache is not None else None
    units = (functools.partial(load_one, url, info) if reads is None else reads.unit(url, info) for url, info in items)
    return deliver_in_order(units, context, 2 * client.transfer.max_in_flight, skip_missing=skip_missing)


class CachedReads:
    """Objects read through a :class:`LocalCache`: an entry found is read on the consumer's thread as its unit
    is made (small ones; larger ones in a thread of their own), so a cached epoch sends no request; a missing
    one is downloaded by one process of the node while the others wait for it (the entry's lock), then kept."""

    def __init__(self, cache: LocalCache, context: RequestContext) -> None:
        self.store: CacheStore = store_of(cache)
        self.context = context
        self.wait_for_others = context.retry.deadline  # then download it anyway

    def entry(self, url: str, info: ObjectInfo | None) -> CacheEntry | None:
        """The object's entry, if it may be cached: a known version, and no larger than the byte budget."""
        if not self.store.usable:
            return None
        entry = CacheEntry.of(url, info)
        return entry if entry is not None and entry.size <= self.context.budget.limit else None

    def unit(self, url: str, info: ObjectInfo | None) -> Unit:
        """The object's unit: its cached bytes, or a download that keeps them."""
        return self.found(url, info) or self.loading(url, info)

    def found(self, url: str, info: ObjectInfo | None) -> Unit | None:
        """A unit holding the object's bytes, read from its entry now, if it is there (and small: larger ones
        are read by :meth:`loading`'s unit, off the consumer's thread)."""
        entry = self.entry(url, info)
        if entry is None or entry.size > self.context.part_size:
            return None
        data = self.store.read(entry)
        if data is None:
            return None
        self._hit(data)
        return Ready([(url, data)])

    def loading(self, url: str, info: ObjectInfo | None) -> Unit:
        """A unit that reads the object from its entry once no other process is downloading it, else from GCS,
        and keeps it. A URL without its listed version costs a metadata request first: which version is live
        decides which entry may serve it."""
        if info is None and self.store.usable:
            return functools.partial(self._describe_and_load, url)
        entry = self.entry(url, info)
        if entry is None:
            return functools.partial(load_one, url, info)
        return functools.partial(self._load, entry, url, info)

    def _hit(self, data: bytes) -> None:
        self.store.count(hit=True)
        self.context.stats.cache_hits += 1
        self.context.stats.cache_bytes += len(data)

    async def _read(self, entry: CacheEntry) -> bytes | None:
        if entry.size <= self.context.part_size:
            return self.store.read(entry)
        return await asyncio.to_thread(self.store.read, entry)

    async def _load(
        self, entry: CacheEntry, url: str, info: ObjectInfo | None, context: RequestContext, seq: int
    ) -> tuple[list[Outcome], int]:
        locked = await self._lock(entry)
        try:
            data = await self._read(entry)  # another process may have kept it meanwhile
            if data is not None:
                self._hit(data)
                return [(url, data)], 0
            self.store.count(hit=False)
            context.stats.cache_misses += 1
            outcomes, held = await load_one(url, info, context, seq)
            await self.keep(entry, outcomes[0][1])
            return outcomes, held
        finally:
            if locked:
                self.store.unlock(entry)

    async def _describe_and_load(self, url: str, context: RequestContext, seq: int) -> tuple[list[Outcome], int]:
        bucket, name = parse_url(url, allow_prefix=False)
        resource = await object_resource(context, bucket, name, "size,generation,crc32c", required=REQUIRED_FIELDS)
        info = None if resource is None else ObjectInfo.from_json(resource)  # missing: load_one says so
        entry = self.entry(url, info)
        if entry is None:
            return await load_one(url, info, context, seq)
        return await self._load(entry, url, info, context, seq)

    async def _lock(self, entry: CacheEntry) -> bool:
        """Take the entry's lock, waiting while another process (or task) holds it; ``False`` if the wait
        outlasted the retry deadline or locks failed: then the object is downloaded without it."""
        deadline = time.monotonic() + self.wait_for_others
        try:
            while not self.store.try_lock(entry):
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(LOCK_POLL)
        except OSError as exc:
            self.store.warn("its locks failed", exc)
            return False
        return True

    async def keep(self, entry: CacheEntry | None, data: object) -> None:
        """Keep an object's verified bytes (whole or in parts; a stream or an error is not kept)."""
        if entry is None or not isinstance(data, (bytes, list)):
            return
        parts = [data] if isinstance(data, bytes) else data
        await asyncio.to_thread(self.store.keep, entry, parts)  # file writes hold up no request of the loop
