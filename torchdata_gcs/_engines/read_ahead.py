"""Read-ahead of planned byte ranges: the spans a load plan reads (one item, or neighbours fetched
together), fetched ahead of their reader in plan order within a byte budget, each item checked against
the crc32c saved with it before it is handed out. DCP's reader is built on it."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass, field
from typing import Any

from .._ops.checksums import ObjectInfo, check_crc32c, crc32c_base64, crc32c_extend, crc32c_of_concatenation
from .._ops.reads import read_ranges_into
from .._transport.context import RequestContext
from .._transport.loop import submit, wait
from .._transport.retry import reread_while_damaged
from ..errors import IntegrityError
from .ranges import MIN_RANGE
from .shared_spans import Sharing, publish_after, take_or_read

__all__ = ["ReadAhead", "Span"]

RANGES_PER_BUDGET = 32
"""GETs a full read-ahead budget is split into (see :attr:`ReadAhead.range_size`)."""


@dataclass
class Span:
    """A byte range ``[start, end)`` of one file that the load plan reads: one item, or neighbours fetched together."""

    url: str
    start: int
    end: int
    future: ConcurrentFuture[int] | None = None
    buffer: bytearray | None = None
    checked: bool = False  # its items were checked once fetched: later reads of it are not checked again

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class ReadAhead:
    """The spans one load plan reads, fetched ahead of DCP in the order it reads them, at most ``budget`` bytes
    held at once (one span larger than that is still fetched, alone).

    DCP reads the spans in the order given (the reader hands it the plan in file order), so reaching span ``k``
    frees every span before it. A read that finds its span already freed (some other order) fetches it again:
    correctness never depends on the order.
    """

    describe: Callable[[str], ObjectInfo]  # a file's size, generation and crc32c (one metadata request)
    spans: list[Span]
    budget: int
    context: RequestContext
    checksums: dict[str, list[tuple[int, int, int]]]  # per file: (offset, length, crc32c) of each item saved with one
    sharing: Sharing | None = None  # spans other ranks of this machine read too: fetched by one, taken by the others
    infos: dict[str, ObjectInfo] = field(default_factory=dict, init=False)
    fetched: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict, init=False)  # {start: (size, crc)}
    _by_url: dict[str, list[int]] = field(default_factory=dict, init=False)
    _cursor: int = field(default=0, init=False)  # the span DCP reads now
    _launched: int = field(default=0, init=False)  # spans before this one were started (or skipped)
    _held: int = field(default=0, init=False)
    _again: Span | None = field(default=None, init=False)  # a span read again, out of plan order
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)  # torch reads from one thread today

    def __post_init__(self) -> None:
        for index, span in enumerate(self.spans):
            self._by_url.setdefault(span.url, []).append(index)

    @property
    def range_size(self) -> int:
        """How much one GET reads: at most ``part_size``, and small enough that the budget's worth of
        spans goes out as :data:`RANGES_PER_BUDGET` concurrent GETs (a connection's throughput, not the
        memory allowed, then bounds how fast a load goes)."""
        return max(MIN_RANGE, min(self.context.part_size, self.budget // RANGES_PER_BUDGET))

    def info(self, url: str) -> ObjectInfo:
        """The file's size, generation and crc32c, looked up once per load: every read is pinned to it."""
        if url not in self.infos:
            self.infos[url] = self.describe(url)
        return self.infos[url]

    def view(self, url: str, position: int, limit: int) -> memoryview | None:
        """Up to ``limit`` bytes at ``position`` if a planned span holds them (waiting for its fetch), else ``None``."""
        with self._lock:
            return self._view(url, position, limit)

    def _view(self, url: str, position: int, limit: int) -> memoryview | None:
        index = self._find(url, position)
        if index is None:
            return None
        if index >= self._cursor:
            self._advance(index)
            span = self.spans[index]
        else:
            span = self._read_again(self.spans[index])
        data = self._wait(span)
        offset = position - span.start
        return memoryview(data)[offset : offset + min(limit, span.end - position)]

    def _find(self, url: str, position: int) -> int | None:
        """The planned span holding ``position``: the current one or the next (the usual cases), else the first
        at or after the cursor, else the last before it."""
        for index in (self._cursor, self._cursor + 1):
            if index < len(self.spans):
                span = self.spans[index]
                if span.url == url and span.start <= position < span.end:
                    return index
        before = None
        for index in self._by_url.get(url, ()):
            span = self.spans[index]
            if span.start <= position < span.end:
                if index >= self._cursor:
                    return index
                before = index
        return before

    def _advance(self, index: int) -> None:
        for span in self.spans[self._cursor : index]:
            self._release(span)
        self._cursor = index
        self._launched = max(self._launched, index)
        while self._launched < len(self.spans):
            span = self.spans[self._launched]
            if self._held and self._held + span.size > self.budget:
                break
            self._start(span)
            self._held += span.size
            self._launched += 1

    def _start(self, span: Span, alone: bool = False) -> None:
        info = self.info(span.url)
        if span.end > info.size:
            raise IntegrityError(
                f"{span.url} has {info.size} bytes, but the checkpoint's metadata places an item at "
                f"[{span.start}, {span.end}): the file does not belong to this checkpoint",
                url=span.url,
            )
        buffer = span.buffer = bytearray(span.size)
        span.checked = False

        def read() -> Coroutine[Any, Any, int]:
            return read_ranges_into(
                self.context, span.url, info.generation, span.start, memoryview(buffer), self.range_size
            )

        shared = None if alone or self.sharing is None else self.sharing.ranges.get((span.url, span.start, span.end))
        if shared is None:
            span.future = submit(read())
        elif shared.fetcher == self.sharing.rank:  # type: ignore[union-attr]  # shared is only found in a sharing
            span.future = submit(publish_after(read(), shared, buffer))
        else:
            span.future = submit(take_or_read(shared, memoryview(buffer), read, self.context.retry.deadline))

    def _release(self, span: Span) -> None:
        if span.future is not None:
            span.future.cancel()
            self._held -= span.size
        span.future, span.buffer = None, None

    def _read_again(self, span: Span) -> Span:
        again = self._again
        if again is None or (again.url, again.start, again.end) != (span.url, span.start, span.end):
            again = self._again = Span(span.url, span.start, span.end)
            self._start(again)
        return again

    def _wait(self, span: Span) -> bytearray:
        """The span's bytes, every item in it checked against the crc32c saved with it (read again while damaged,
        as retries allow): no byte reaches DCP, and so the caller's tensors, unchecked. DCP reads a span in many
        pieces; its items are checked at the first."""
        if span.checked:
            assert span.buffer is not None
            return span.buffer
        in_flight = True  # the first read was started ahead

        def read() -> int:
            nonlocal in_flight
            if not in_flight:
                self._start(span, alone=True)
            in_flight = False
            assert span.future is not None
            return wait(span.future)

        def check(crc: int) -> int:
            self._check_items(span, crc)
            return crc

        crc = reread_while_damaged(read, check, self.context.retry, span.url, self.context.stats.count_retry)
        span.checked = True
        self.fetched.setdefault(span.url, {}).setdefault(span.start, (span.size, crc))
        assert span.buffer is not None
        return span.buffer

    def _check_items(self, span: Span, crc: int) -> None:
        """Check each item in the span: one that fills it by the crc32c computed as its bytes arrived, others
        (small neighbours sharing a request) one by one."""
        assert span.buffer is not None
        items = self.checksums.get(span.url, [])
        for offset, length, expected in items[bisect.bisect_left(items, (span.start, 0, 0)) :]:
            if offset + length > span.end:
                break
            whole = offset == span.start and length == span.size
            piece = memoryview(span.buffer)[offset - span.start : offset - span.start + length]
            actual = crc if whole else crc32c_extend(0, piece)
            if actual != expected:
                raise IntegrityError(
                    f"{span.url}: the item at [{offset}, {offset + length}) has crc32c {crc32c_base64(actual)}, "
                    f"saved with {crc32c_base64(expected)}",
                    url=span.url,
                )

    def verify_whole_files(self) -> None:
        """Check the crc32c of every file read whole (the spans fetched tile it): GCS keeps a checksum per
        object only, so a file read in part is checked by the length of each range alone."""
        for url, pieces in self.fetched.items():
            info = self.infos[url]
            position, tiles = 0, []
            for start in sorted(pieces):
                length, crc = pieces[start]
                if start != position:
                    break
                tiles.append((crc, length))
                position += length
            if position == info.size and info.crc32c is not None:
                check_crc32c(url, crc32c_base64(crc32c_of_concatenation(tiles)), {"GCS": info.crc32c})

    def close(self) -> None:
        for span in self.spans:
            self._release(span)
        if self._again is not None and self._again.future is not None:
            self._again.future.cancel()
        self._again = None
