"""Parallel listing of one prefix: key ranges listed concurrently, re-split as listers go idle.

A sequential listing costs one round trip per 1,000 names. Here the key space under the prefix is
listed by up to ``concurrency`` tasks on the I/O loop, each owning a range ``[start, end)`` of names, requested
with ``startOffset``/``endOffset``. A lister that runs out of work steals: it splits the remaining
part of a busy range and takes the upper part (:class:`KeySpace` says where to cut). Splits are
rationed (``SPLIT_BUDGET``) so the whole listing stays within half again the requests of a sequential
one, counted for each listing alone; parallelism grows as pages come back, from the first one on.
Ranges stay in key order, and names are yielded in that order as soon as every earlier range is finished.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from itertools import pairwise, zip_longest
from typing import Any

from .._ops.client import Client
from .._ops.objects import list_page
from .._ops.paging import ITEM_FIELDS, PageTrail
from .._ops.urls import format_url
from .._transport.context import RequestContext
from .._transport.loop import iterate
from ..errors import ListingError

logger = logging.getLogger(__name__)

__all__ = ["KeySpace", "ListingStats", "list_prefix_async", "list_prefix_parallel", "split_point"]

CHARACTER_CLASSES = tuple(
    frozenset(chars) for chars in ("0123456789", "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
)
"""A digit (or letter) seen at a position stands for all of them there: ``0001999`` is followed by
``0002000``, which a space of only the characters seen so far could not name."""

STRIDE_PAGES = 4
"""A range with no upper bound is cut about this many pages (as the last page spanned) ahead, per
lister (the one splitting, and each one idle)."""

MIN_SPLIT_PAGES = 4.0
"""A bounded range is split only if about this many pages are left in it: a split costs a request."""

LEARN_SAMPLE = 16
"""Names per page whose characters grow the key space (see ``_Listing._learn``)."""

SPLIT_BUDGET = 0.5
"""Requests that may come back short, per full page listed so far: a listing costs at most
(1 + SPLIT_BUDGET) times the requests of a sequential one (see ``_Listing._affordable``)."""


# A busy range is split after the last name listed there, before the range's end. Names are read as
# numbers whose digits are the characters seen so far at each position, so numbered names
# (``img/000123.jpg``) are cut as the numbers they are: a bounded range is cut in the middle, an
# unbounded one a few pages' stride ahead of where it is. A split that lands in an empty stretch costs
# one request and shrinks the busy range, so the next split is better informed.
class KeySpace:
    """Names as numbers, so a range of names can be cut in the middle or extended by a stride.

    ``alphabets[i]`` holds the characters (sorted, distinct) that may stand at position ``i``. A
    name is read as a mixed-radix number with one digit per position, digit 0 marking the end of
    the name, so the number order is the name order (GCS's order) for every name it holds.
    """

    def __init__(self, alphabets: list[str]) -> None:
        self.alphabets = alphabets
        self._digits = [{char: index + 1 for index, char in enumerate(alphabet)} for alphabet in alphabets]
        self._radixes = [len(alphabet) + 1 for alphabet in alphabets]
        self.top = math.prod(self._radixes) - 1  # the value of the greatest name

    def holds(self, name: str) -> bool:
        """Whether every character of ``name`` is allowed at its position."""
        return len(name) <= len(self.alphabets) and all(char in self._digits[i] for i, char in enumerate(name))

    def value(self, name: str) -> int:
        total = 0
        for position, radix in enumerate(self._radixes):
            total = total * radix + (self._digits[position][name[position]] if position < len(name) else 0)
        return total

    def name(self, value: int) -> str | None:
        """The greatest name at or below ``value``; ``None`` if ``value`` is out of range."""
        if value < 0:
            return None
        digits = []
        for radix in reversed(self._radixes):
            value, digit = divmod(value, radix)
            digits.append(digit)
        if value != 0:
            return None
        chars = []
        for alphabet, digit in zip(self.alphabets, reversed(digits), strict=True):
            if digit == 0:  # the name ends here; what follows is a gap before the next name
                break
            chars.append(alphabet[digit - 1])
        return "".join(chars)


def split_point(low: str, high: str | None, space: KeySpace, stride: int = 0) -> str | None:
    """A name ``m`` with ``low < m < high``: the middle of the range, or ``low`` plus ``stride``.

    ``high=None`` means no upper bound; then ``stride`` (a distance in ``space``'s units, such as
    what the last page of names spanned) says how far beyond ``low`` to cut, or halfway to the
    greatest name ``space`` holds if a stride would pass it. Returns ``None`` when
    ``space`` holds no such name.

    >>> space = KeySpace(["0123456789", "0123456789"])
    >>> split_point("10", "30", space)
    '20'
    >>> split_point("10", None, space, stride=space.value("13") - space.value("10"))
    '13'
    >>> split_point("90", None, space, stride=space.value("60") - space.value("10"))  # past "99"
    '94'
    """
    if not space.holds(low) or (high is not None and not space.holds(high)):
        return None
    start = space.value(low)
    if high is not None:
        target = (start + space.value(high)) // 2
    else:  # a stride past the last name in the space: cut halfway to it instead
        target = start + stride if start + stride <= space.top else (start + space.top) // 2
    middle = space.name(target)
    if middle is None or not low < middle or (high is not None and not middle < high):
        return None
    return middle


@dataclass
class ListingStats:
    """What a listing cost: list requests sent (and how many came back full), ranges split off, objects,
    and named objects skipped because they do not exist (``skip_missing``)."""

    requests: int = 0
    full_pages: int = 0
    splits: int = 0
    objects: int = 0
    missing: int = 0


@dataclass(eq=False)
class _Range:
    """Names in ``[start, end)``; ``after`` is the last name listed so far.

    ``token`` continues ``query`` (``trail`` follows its pages), whose ``endOffset`` may lie beyond an
    ``end`` a split has since moved down: names past ``end`` are dropped and the range is done with that page.
    """

    start: str
    end: str | None
    after: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    busy: bool = False
    done: bool = False
    last_page_full: bool = False
    last_page_stride: int = 0
    pages: int = 0
    listed: int = 0
    token: str | None = None
    query: dict[str, Any] = field(default_factory=dict)
    trail: PageTrail | None = None


class _Listing:
    """The shared state of one parallel listing. Its listers are tasks on the I/O loop, so it needs no lock:
    state changes only between awaits, and whoever waits for a change awaits :meth:`next_change`."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        page_size: int,
        after: str | None,
        match_glob: str | None,
        item_fields: str | None = ITEM_FIELDS,
    ) -> None:
        self.match_glob = match_glob
        self.items = f"items({item_fields})" if item_fields is not None else "items"
        self.bucket = bucket
        self.prefix = prefix
        self.page_size = page_size
        self.url = format_url(bucket, prefix)
        self.ranges = [_Range(start=prefix, end=None, after=after if after is not None and after > prefix else None)]
        self.space = KeySpace([""])
        self.stats = ListingStats()  # may be shared with other listings: the budget counts this one's alone
        self.requests = 0
        self.objects = 0
        self.error: Exception | None = None
        self.stopped = False
        self.idle = 0  # listers waiting for work
        self._change = asyncio.Event()
        self._listers: list[asyncio.Task[None]] = []

    def _changed(self) -> None:
        """Wake everyone waiting for a change."""
        self._change.set()
        self._change = asyncio.Event()

    async def next_change(self) -> None:
        """Wait for the next change of the listing's state."""
        await self._change.wait()

    def start(self, client: Client, concurrency: int) -> None:
        """Start ``concurrency`` listers, each sending its requests under a context of ``client``'s of its own
        (its own concurrency slots: ``concurrency`` may exceed one context's)."""
        self._listers = [asyncio.create_task(self._work(client.call_context())) for _ in range(concurrency)]

    def stop(self) -> None:
        """Cancel the listers, requests in flight included."""
        self.stopped = True
        for lister in self._listers:
            lister.cancel()

    def finished(self) -> bool:
        return self.stopped or self.error is not None or all(r.done for r in self.ranges)

    async def claim(self) -> _Range | None:
        """A range to list: an unclaimed one, else one split off a busy range; ``None`` when all is done."""
        while not self.finished():
            for candidate in self.ranges:
                if not candidate.busy and not candidate.done:
                    candidate.busy = True
                    return candidate
            if self._affordable():
                victims = sorted(self.ranges, key=self._pages_left, reverse=True)
                for victim in victims:
                    stolen = self._split(victim)
                    if stolen is not None:
                        self.ranges.insert(self.ranges.index(victim) + 1, stolen)
                        self.stats.splits += 1
                        return stolen
            self.idle += 1
            try:
                await self.next_change()
            finally:
                self.idle -= 1
        return None

    def _affordable(self) -> bool:
        """Whether one more range keeps the listing within ``1 + SPLIT_BUDGET`` times a sequential one,
        however it ends: if every range not yet done (and the new one) needs one more request, and
        that request lists nothing, the requests sent must still fit :meth:`_sequential_floor`'s share."""
        open_ranges = sum(not listed.done for listed in self.ranges)
        return self.requests + open_ranges + 1 <= (1 + SPLIT_BUDGET) * self._sequential_floor()

    def _sequential_floor(self) -> int:
        """The fewest requests a sequential listing of the same prefix can need, from what is listed so far.

        It needs a request per ``page_size`` names at least. And the first range's requests are the very
        requests a sequential listing starts with (same query, same page tokens): while that range is not
        done, each of its pages came with a page token, so a sequential listing sends those, then at
        least one more, and one per ``page_size`` of the names listed beyond them. This is what lets the
        first split go out after the first page rather than after the fourth.
        """
        first, size = self.ranges[0], self.page_size
        floor = -(-self.objects // size)
        if not first.done:
            beyond = self.objects - first.listed
            floor = max(floor, first.pages + max(1, -(-beyond // size)))
        return floor

    def _pages_left(self, listed: _Range) -> float:
        """About how many pages a range has left to list: 0 if it cannot be split, inf if unbounded."""
        if not (listed.busy and not listed.done and listed.last_page_full and listed.after is not None):
            return 0.0
        if listed.end is None:
            return math.inf
        cut = len(self.prefix)  # every bound in play starts with the prefix: measure what follows it
        low, high = listed.after[cut:], listed.end[cut:]
        if not (listed.last_page_stride and self.space.holds(low) and self.space.holds(high)):
            return 0.0
        return (self.space.value(high) - self.space.value(low)) / listed.last_page_stride

    def _split(self, victim: _Range) -> _Range | None:
        """Cut ``victim`` after what it has listed; the upper part is returned, claimed."""
        if self._pages_left(victim) < MIN_SPLIT_PAGES:
            return None
        cut = len(self.prefix)
        low, high = victim.after[cut:], None if victim.end is None else victim.end[cut:]  # type: ignore[index]  # one with pages left has listed a page: after is set
        # The open end is cut further ahead the more listers are idle; they then split what is left.
        stride = STRIDE_PAGES * (1 + self.idle) * victim.last_page_stride
        suffix = split_point(low, high, self.space, stride=stride)
        if suffix is None:
            return None
        stolen = _Range(start=self.prefix + suffix, end=victim.end, busy=True)
        victim.end = stolen.start
        return stolen

    async def list_range(self, owned: _Range, context: RequestContext) -> None:
        """List ``owned`` page by page until it is done (its end may shrink meanwhile)."""
        while not (self.stopped or owned.done):
            if owned.token is None:
                owned.query = {
                    "prefix": self.prefix,
                    "startOffset": owned.after if owned.after is not None else owned.start,
                    "maxResults": self.page_size,
                    "projection": "noAcl",
                    "fields": f"{self.items},nextPageToken",
                }
                if owned.end is not None:
                    owned.query["endOffset"] = owned.end
                if self.match_glob is not None:
                    owned.query["matchGlob"] = self.match_glob
                params, owned.trail = owned.query, PageTrail(self.url)
            else:
                params = {**owned.query, "pageToken": owned.token}
            page = await list_page(context, self.bucket, params, url=self.url)
            items = page.get("items", [])
            logger.debug("listed %d objects of %s from %r", len(items), self.url, params["startOffset"])
            self.stats.requests += 1
            self.requests += 1
            fresh = [  # a resumed listing repeats ``after``; a split may have cut the end
                item
                for item in items
                if (owned.after is None or item["name"] > owned.after)
                and (owned.end is None or item["name"] < owned.end)
            ]
            owned.items.extend(fresh)
            owned.pages += 1
            owned.listed += len(fresh)
            self.stats.objects += len(fresh)
            self.objects += len(fresh)
            if fresh:
                owned.after = fresh[-1]["name"]
                self._learn(fresh)
            owned.last_page_full = len(fresh) >= self.page_size
            if owned.last_page_full:
                owned.last_page_stride = self._stride(fresh[0]["name"], fresh[-1]["name"])
            self.stats.full_pages += owned.last_page_full
            assert owned.trail is not None  # made with the query
            owned.token = owned.trail.follow_json(page)
            past_end = owned.end is not None and bool(items) and items[-1]["name"] >= owned.end
            if owned.token is None or past_end:
                owned.done, owned.busy = True, False
            self._changed()

    def _stride(self, first: str, last: str) -> int:
        """How far one page of names reached, in the key space splits are made in."""
        cut = len(self.prefix)
        return self.space.value(last[cut:]) - self.space.value(first[cut:])

    def _learn(self, items: list[dict[str, Any]]) -> None:
        """Grow the key space to every character seen at each position in a sample of a page's names
        (its first and last among them; strides are measured anew). A character class seen once stands
        for all of it, so a sample finds what a whole page would at a fraction of the cost, and a name
        the space misses is never cut at, only not split near."""
        cut = len(self.prefix)
        known = self.space.alphabets
        sample = [*items[:: max(1, len(items) // LEARN_SAMPLE)], items[-1]]
        columns = list(zip_longest(*(item["name"][cut:] for item in sample), fillvalue=""))
        width = max(len(known), len(columns) + 1)  # + 1: room for names between names
        columns += [()] * (width - len(columns))
        alphabets = []
        for position, column in enumerate(columns):
            chars = set(column).union(known[position] if position < len(known) else "")
            chars.discard("")
            chars.update(*(family for family in CHARACTER_CLASSES if not chars.isdisjoint(family)))
            alphabets.append("".join(sorted(chars)))
        if alphabets == known:
            return
        self.space = KeySpace(alphabets)
        for listed in self.ranges:
            listed.last_page_stride = 0  # measured in the old space

    async def _work(self, context: RequestContext) -> None:
        try:
            while (owned := await self.claim()) is not None:
                await self.list_range(owned, context)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self.error = self.error or exc
            self._changed()


async def list_prefix_async(
    client: Client,
    bucket: str,
    prefix: str,
    page_size: int,
    concurrency: int,
    stats: ListingStats | None = None,
    after: str | None = None,
    match_glob: str | None = None,
    item_fields: str | None = ITEM_FIELDS,
) -> AsyncGenerator[list[dict[str, Any]], None]:
    """The object resources under ``prefix`` (after ``after``, if given), in name order, in batches;
    with ``match_glob``, only those GCS finds that glob selects (GCS's ``matchGlob``). Each resource holds
    ``item_fields`` (``None``: all its fields but its ACL). To be iterated on the I/O loop.

    ``concurrency`` tasks list; each batch is what became ready in order since the last one.
    ``stats``, when given, is updated as the listing goes (requests, splits, objects). Closing the
    generator (or cancelling its consumer) cancels the listing.
    """
    listing = _Listing(bucket, prefix, page_size, after, match_glob, item_fields)
    if stats is not None:
        listing.stats = stats
    listing.start(client, concurrency)
    try:
        position, previous = 0, ""
        while True:
            while not (
                listing.error is not None
                or position >= len(listing.ranges)
                or listing.ranges[position].items
                or listing.ranges[position].done
            ):
                await listing.next_change()
            if listing.error is not None:
                raise listing.error
            if position >= len(listing.ranges):
                return
            current = listing.ranges[position]
            ready, current.items = current.items, []  # hand over what is in order, keep nothing
            if not ready:
                position += 1  # done
                continue
            names = [item["name"] for item in ready]
            # GCS lists in name order; anything else is not trusted.
            if names[0] <= previous or any(a >= b for a, b in pairwise(names)):
                raise ListingError(
                    f"listing of {listing.url} came back out of order near {names[0]!r}", url=listing.url
                )
            previous = names[-1]
            yield ready
    finally:
        listing.stop()


def list_prefix_parallel(
    client: Client,
    bucket: str,
    prefix: str,
    page_size: int,
    concurrency: int,
    stats: ListingStats | None = None,
    after: str | None = None,
    match_glob: str | None = None,
    item_fields: str | None = ITEM_FIELDS,
) -> Iterator[list[dict[str, Any]]]:
    """:func:`list_prefix_async` for a blocking caller, each batch handed over as it is ready; closing
    the iterator, or Ctrl-C while it waits, cancels the listing."""
    return iterate(
        list_prefix_async(client, bucket, prefix, page_size, concurrency, stats, after, match_glob, item_fields)
    )
