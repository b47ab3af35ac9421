"""Parallel listing of one prefix: key ranges listed concurrently, re-split as listers go idle.

A sequential listing costs one round trip per 1,000 names. Here the key space under the prefix is
listed by up to ``concurrency`` threads, each owning a range ``[start, end)`` of names, requested
with ``startOffset``/``endOffset``. A lister that runs out of work steals: it splits the remaining
part of a busy range (after the last name listed there, before the range's end) and takes the
upper part. Names are read as numbers over the characters seen so far (:class:`KeySpace`): a
bounded range is cut in the middle, an unbounded one a few pages' stride ahead of where it is. A
split that lands in an empty stretch costs one request and shrinks the busy range, so the next
split is better informed. Splits are
rationed (``SPLIT_BUDGET``) so the whole listing stays within 1.5x the requests of a sequential one;
parallelism grows as full pages come back. Ranges stay in key order, and names are yielded in that
order as soon as every earlier range is finished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._client import Transport
from ._retry import call_with_retry
from ._uri import format_url
from .config import RetryConfig
from .errors import GCSError

logger = logging.getLogger(__name__)

__all__ = ["KeySpace", "ListingStats", "list_prefix_parallel", "split_point"]

ITEM_FIELDS = "name,size,generation,crc32c"
"""The object fields a listing asks for (``fields=`` trims everything else from the answers)."""

STRIDE_PAGES = 4
"""A range with no upper bound is cut about this many pages (as the last page spanned) ahead."""

SPLIT_BUDGET = 0.5
"""Splits allowed per full page listed so far. Each range ends in at most one short page and a
split is taken only while ``splits + 1 < SPLIT_BUDGET * full_pages``, so a listing costs at most
(1 + SPLIT_BUDGET) times the requests of a sequential one."""


class KeySpace:
    """Names as numbers, so a range of names can be cut in the middle or extended by a stride.

    Each name is read as a base ``len(alphabet) + 1`` number of ``width`` digits, digit 0 marking
    the end of the name, so the number order is the name order (GCS's order) for names made of
    ``alphabet`` and no longer than ``width``.
    """

    def __init__(self, alphabet: list[str], width: int) -> None:  # alphabet: sorted, distinct
        self.alphabet = alphabet
        self.width = width
        self._digit = {char: index + 1 for index, char in enumerate(alphabet)}
        self._base = len(alphabet) + 1

    def holds(self, name: str) -> bool:
        """Whether ``name`` is made of the alphabet and fits the width."""
        return len(name) <= self.width and all(char in self._digit for char in name)

    def value(self, name: str) -> int:
        total = 0
        for position in range(self.width):
            total = total * self._base + (self._digit[name[position]] if position < len(name) else 0)
        return total

    def name(self, value: int) -> str | None:
        """The greatest name at or below ``value``; ``None`` if ``value`` is out of range."""
        if not 0 <= value < self._base**self.width:
            return None
        digits = []
        for _ in range(self.width):
            value, digit = divmod(value, self._base)
            digits.append(digit)
        chars = []
        for digit in reversed(digits):
            if digit == 0:  # the name ends here; what follows is a gap before the next name
                break
            chars.append(self.alphabet[digit - 1])
        return "".join(chars)


def split_point(low: str, high: str | None, space: KeySpace, stride: int = 0) -> str | None:
    """A name ``m`` with ``low < m < high``: the middle of the range, or ``low`` plus ``stride``.

    ``high=None`` means no upper bound; then ``stride`` (a distance in ``space``'s units, such as
    what the last page of names spanned) says how far beyond ``low`` to cut. Returns ``None`` when
    ``space`` holds no such name.

    >>> space = KeySpace(["0", "1", "2", "3"], width=2)
    >>> split_point("0", "3", space)
    '11'
    >>> split_point("00", None, space, stride=space.value("03") - space.value("00"))
    '03'
    """
    if not space.holds(low) or (high is not None and not space.holds(high)):
        return None
    start = space.value(low)
    target = (start + space.value(high)) // 2 if high is not None else start + stride
    middle = space.name(target)
    if middle is None or not low < middle or (high is not None and not middle < high):
        return None
    return middle


@dataclass
class ListingStats:
    """What a listing cost: list requests sent (and how many came back full), ranges split off, objects."""

    requests: int = 0
    full_pages: int = 0
    splits: int = 0
    objects: int = 0


@dataclass(eq=False)
class _Range:
    """Names in ``[start, end)``; ``after`` is the last name listed so far.

    ``token`` continues the query that started at ``query_start`` with end ``token_end``; once a
    split moves ``end``, the listing restarts at ``after`` with the new end instead.
    """

    start: str
    end: str | None
    after: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    busy: bool = False
    done: bool = False
    last_page_full: bool = False
    last_page_stride: int = 0
    token: str | None = None
    token_end: str | None = None
    query_start: str = ""


class _Listing:
    """The shared state of one parallel listing, guarded by one condition variable."""

    def __init__(self, transport: Transport, bucket: str, prefix: str, retry: RetryConfig, page_size: int) -> None:
        self.transport = transport
        self.bucket = bucket
        self.prefix = prefix
        self.retry = retry
        self.page_size = page_size
        self.url = format_url(bucket, prefix)
        self.ranges = [_Range(start=prefix, end=None)]
        self.space = KeySpace([], 1)
        self.stats = ListingStats()
        self.error: BaseException | None = None
        self.stopped = False
        self.changed = threading.Condition()

    def finished(self) -> bool:
        return self.stopped or self.error is not None or all(r.done for r in self.ranges)

    def claim(self) -> _Range | None:
        """A range to list: an unclaimed one, else one split off a busy range; ``None`` when all is done."""
        with self.changed:
            while not self.finished():
                for candidate in self.ranges:
                    if not candidate.busy and not candidate.done:
                        candidate.busy = True
                        return candidate
                affordable = self.stats.splits + 1 < SPLIT_BUDGET * self.stats.full_pages
                for index, victim in enumerate(self.ranges if affordable else ()):
                    stolen = self._split(victim)
                    if stolen is not None:
                        self.ranges.insert(index + 1, stolen)
                        self.stats.splits += 1
                        return stolen
                self.changed.wait()
            return None

    def _split(self, victim: _Range) -> _Range | None:
        if not (victim.busy and not victim.done and victim.last_page_full and victim.after is not None):
            return None
        cut = len(self.prefix)  # every bound in play starts with the prefix: split what follows it
        low, high = victim.after[cut:], None if victim.end is None else victim.end[cut:]
        suffix = split_point(low, high, self.space, stride=STRIDE_PAGES * victim.last_page_stride)
        if suffix is None:
            return None
        stolen = _Range(start=self.prefix + suffix, end=victim.end, busy=True)
        victim.end = stolen.start
        return stolen

    def list_range(self, owned: _Range) -> None:
        """List ``owned`` page by page until it is done (its end may shrink meanwhile)."""
        path = self.transport.bucket_objects_path(self.bucket)
        while True:
            with self.changed:
                if self.stopped or owned.done:
                    return
                if owned.token is None or owned.token_end != owned.end:
                    owned.query_start = owned.after if owned.after is not None else owned.start
                    owned.token = None
                end = owned.end
                params: dict[str, Any] = {
                    "prefix": self.prefix,
                    "startOffset": owned.query_start,
                    "maxResults": self.page_size,
                    "projection": "noAcl",
                    "fields": f"items({ITEM_FIELDS}),nextPageToken",
                }
                if end is not None:
                    params["endOffset"] = end
                if owned.token is not None:
                    params["pageToken"] = owned.token
            page = call_with_retry(
                lambda: self.transport.get_json(path, url=self.url, params=params), self.retry, url=self.url
            )
            items = page.get("items", [])
            logger.debug("listed %d objects of %s from %r", len(page.get("items", ())), self.url, params["startOffset"])
            with self.changed:
                self.stats.requests += 1
                fresh = [  # a restart repeats ``after``; a split may have cut the end
                    item
                    for item in items
                    if (owned.after is None or item["name"] > owned.after)
                    and (owned.end is None or item["name"] < owned.end)
                ]
                owned.items.extend(fresh)
                self.stats.objects += len(fresh)
                if fresh:
                    owned.after = fresh[-1]["name"]
                    self._learn(fresh)
                owned.last_page_full = len(items) >= self.page_size
                if owned.last_page_full and len(fresh) > 1:
                    owned.last_page_stride = self._stride(fresh[0]["name"], fresh[-1]["name"])
                self.stats.full_pages += owned.last_page_full
                owned.token, owned.token_end = page.get("nextPageToken"), end
                past_end = owned.end is not None and bool(items) and items[-1]["name"] >= owned.end
                if owned.token is None or past_end:
                    owned.done, owned.busy = True, False
                self.changed.notify_all()

    def _stride(self, first: str, last: str) -> int:
        """How far one page of names reached, in the key space splits are made in."""
        cut = len(self.prefix)
        return self.space.value(last[cut:]) - self.space.value(first[cut:])

    def _learn(self, items: list[dict[str, Any]]) -> None:
        """Grow the key space to every character and length seen (strides are measured anew in it)."""
        suffixes = [item["name"][len(self.prefix) :] for item in items]
        alphabet = set(self.space.alphabet).union(*suffixes)
        width = max(self.space.width, *(len(suffix) + 1 for suffix in suffixes))
        if len(alphabet) != len(self.space.alphabet) or width != self.space.width:
            self.space = KeySpace(sorted(alphabet), width)
            for listed in self.ranges:
                listed.last_page_stride = 0  # measured in the old space

    def work(self) -> None:
        try:
            while (owned := self.claim()) is not None:
                self.list_range(owned)
        except BaseException as exc:  # handed to the consumer, which raises it
            with self.changed:
                self.error = self.error or exc
                self.changed.notify_all()


def list_prefix_parallel(
    transport: Transport,
    bucket: str,
    prefix: str,
    retry: RetryConfig,
    page_size: int,
    concurrency: int,
    stats: ListingStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Every object resource under ``prefix``, in name order, listed by ``concurrency`` threads.

    ``stats``, when given, is updated as the listing goes (requests, splits, objects).
    """
    listing = _Listing(transport, bucket, prefix, retry, page_size)
    if stats is not None:
        listing.stats = stats
    workers = [
        threading.Thread(target=listing.work, name="torchdata-gcs-list", daemon=True) for _ in range(concurrency)
    ]
    for worker in workers:
        worker.start()
    try:
        position, previous = 0, ""
        while True:
            with listing.changed:
                listing.changed.wait_for(
                    lambda: listing.error is not None
                    or position >= len(listing.ranges)
                    or bool(listing.ranges[position].items)
                    or listing.ranges[position].done
                )
                if listing.error is not None:
                    raise listing.error
                if position >= len(listing.ranges):
                    return
                current = listing.ranges[position]
                ready, current.items = current.items, []  # hand over what is in order, keep nothing
                if not ready and current.done:
                    position += 1
            for item in ready:
                if item["name"] <= previous:  # GCS lists in name order; anything else is not trusted
                    raise GCSError(f"listing of {listing.url} came back out of order at {item['name']!r}", url=listing.url)
                previous = item["name"]
                yield item
    finally:
        with listing.changed:
            listing.stopped = True
            listing.changed.notify_all()
