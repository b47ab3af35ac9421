"""Rounds of list requests a parallel listing takes, by shape and size of the prefix: no wire, no clock.

    .venv/bin/python -m benchmarks.listing_rounds [--shapes numbered hashed] [--objects 10000 100000] [-v]

A listing's time at a given latency is about its rounds: a sequential one takes a round per page of 1,000
names, a parallel one as many as its ramp and its tail need. Here every list request waits until the listing
has settled (each of its tasks waits), then every request of that round is answered at once from a
``ListingIndex`` of the names (the pages a ``GCSFront`` snapshot serves), through the transport seam
(``GCSClient(transport=...)``) to ``list_prefix_async`` on the I/O loop. The count is the same on a quiet
machine and a busy one, so split policies can be compared exactly. Prints rounds, requests per page of a
sequential listing, ranges split off, and with ``-v`` the requests of every round.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from json import dumps
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from torchdata_gcs import ClientConfig, GCSClient
from torchdata_gcs._engines.parallel_listing import ListingStats, list_prefix_async
from torchdata_gcs._ops.client import Client
from torchdata_gcs._transport.loop import run
from torchdata_gcs.testing._list_index import ListingIndex

SETTLE = 200
"""Turns of the loop with no request answered after which the listing counts as settled."""


def shape(kind: str, count: int) -> list[str]:
    """``count`` names under ``p/`` of one kind: numbered, hashed (hex), in four folders, mostly in one folder,
    UUID-like, or words of 3 to 12 letters."""
    draw = random.Random(count)
    if kind == "numbered":
        return [f"p/{i:07d}.jpg" for i in range(count)]
    if kind == "hashed":
        return sorted(f"p/{hashlib.sha1(str(i).encode()).hexdigest()[:16]}.jpg" for i in range(count))
    if kind == "folders":
        return sorted(
            f"p/{folder}/{i:06d}.jpg" for folder in ("extra", "test", "train", "val") for i in range(count // 4)
        )
    if kind == "skewed":
        few = count // 90
        return [f"p/a/{i:07d}" for i in range(count - 9 * few)] + [
            f"p/{c}/{i:05d}" for c in "bcdefghij" for i in range(few)
        ]
    if kind == "uuid":
        return sorted(f"p/{draw.getrandbits(128):032x}" for _ in range(count))
    if kind == "words":
        letters = "abcdefghijklmnopqrstuvwxyz"
        words: set[str] = set()
        while len(words) < count:
            words.add("p/" + "".join(draw.choice(letters) for _ in range(draw.randint(3, 12))) + ".txt")
        return sorted(words)
    raise ValueError(f"unknown shape {kind!r}")


class _Answer:
    status = 200

    def __init__(self, body: bytes) -> None:
        self.headers = {"Content-Type": "application/json"}
        self._body = body

    async def read(self) -> bytes:
        return self._body


class RoundsTransport:
    """Answers list requests from ``index`` a round at a time (see the module's docstring)."""

    def __init__(self, index: ListingIndex) -> None:
        self.index = index
        self.waiting: list[asyncio.Future[None]] = []
        self.widths: list[int] = []  # requests answered in each round

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
    ) -> AsyncIterator[_Answer]:
        answered = asyncio.get_running_loop().create_future()
        self.waiting.append(answered)
        await answered
        page = self.index.page(dict(parse_qsl(urlsplit(target).query)))
        yield _Answer(dumps(page).encode())

    async def close(self) -> None:
        pass

    async def answer_rounds(self) -> None:
        """Answer every waiting request whenever the listing has settled; runs until cancelled."""
        while True:
            for _ in range(SETTLE):
                await asyncio.sleep(0)
            if self.waiting:
                self.widths.append(len(self.waiting))
                for answered in self.waiting:
                    answered.set_result(None)
                self.waiting = []


async def rounds_of(names: list[str], concurrency: int, page_size: int) -> tuple[list[int], ListingStats]:
    """The requests of each round of one listing of ``p/`` over ``names``, and its stats; checks the names."""
    transport = RoundsTransport(ListingIndex({"name": name, "size": "0"} for name in names))
    config = ClientConfig(endpoint="http://rounds.invalid", anonymous=True)
    rounds = GCSClient(config, transport=transport)  # type: ignore[arg-type]  # its answers have what a page needs
    client, stats, listed = Client(rounds), ListingStats(), []
    answering = asyncio.ensure_future(transport.answer_rounds())
    try:
        async for batch in list_prefix_async(client, "bucket", "p/", page_size, concurrency, stats):
            listed += [item["name"] for item in batch]
    finally:
        answering.cancel()
    assert listed == names, "the listing is not the names, in order"
    return transport.widths, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kinds = ["numbered", "hashed", "folders", "skewed", "uuid", "words"]
    parser.add_argument("--shapes", nargs="+", default=kinds, choices=kinds)
    parser.add_argument("--objects", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("-v", "--verbose", action="store_true", help="print the requests of every round")
    args = parser.parse_args()
    print("| shape | names | rounds | sequential rounds | requests / sequential | ranges split off |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind in args.shapes:
        for count in args.objects:
            names = shape(kind, count)
            widths, stats = run(rounds_of(names, args.concurrency, args.page_size))
            pages = max(1, -(-len(names) // args.page_size))
            print(f"| {kind} | {count:,} | {len(widths)} | {pages} | {stats.requests / pages:.2f} | {stats.splits} |")
            if args.verbose:
                print(f"<!-- requests per round: {widths} -->")


if __name__ == "__main__":
    main()
