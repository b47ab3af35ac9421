"""Hit rates of cache eviction policies over the epochs of one dataset: a simulation, no GCS, no disk.

    .venv/bin/python -m benchmarks.cache_policy [--objects 10000] [--epochs 5] [--seed 0] [--verify] [--json PATH]

Objects of one size are each read once per epoch, in the same order every epoch or reshuffled every epoch
(``epoch_order``, as the datasets deal it), through a cache holding a fraction of them (0.25, 0.5, 0.6,
0.75). Policies: LRU; FIFO; keep when full (admit while there is room, then nothing: ``LocalCache``'s
rule); the same where ``evict_idle_after`` is half an epoch or 1.5 epochs (an entry unread that long is
evicted to make room); Belady's OPT (evict what is next read furthest in the future, or pass the incoming
object by if that is it); OPT knowing only the current and the next epoch's orders (what ``epoch_order``
gives from the seed). Prints the mean hit rate of the epochs after the first per policy, order and size,
as Markdown tables, then the JSON. ``--verify`` first checks OPT against an exhaustive search on small traces.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable

from torchdata_gcs._engines.epoch_order import epoch_order

FRACTIONS = (0.25, 0.5, 0.6, 0.75)
IDLE_EPOCHS = (0.5, 1.5)  # evict_idle_after as a share of an epoch's duration, for epochs longer than it
ORDERS = {"same order": False, "reshuffled": True}
NEVER = float("inf")


def trace(count: int, epochs: int, seed: int, shuffle: bool) -> list[int]:
    """Every read of the run, epoch after epoch, in the order the datasets deal them."""
    return [item for epoch in range(epochs) for item in epoch_order(count, seed, epoch, shuffle)]


def next_reads(reads: list[int], horizon: Callable[[int], int] | None = None) -> list[float]:
    """For each read, the position of the next read of the same object (``NEVER`` if none, or if it lies at or
    beyond ``horizon(position)``: a future known only that far)."""
    following: list[float] = [NEVER] * len(reads)
    seen: dict[int, int] = {}
    for position in range(len(reads) - 1, -1, -1):
        item = reads[position]
        later = seen.get(item)
        if later is not None and (horizon is None or later < horizon(position)):
            following[position] = later
        seen[item] = position
    return following


def lru(reads: list[int], capacity: int) -> list[bool]:
    """Least recently read out first; every miss admitted."""
    return _oldest_out(reads, capacity, read_renews=True)


def fifo(reads: list[int], capacity: int) -> list[bool]:
    """First admitted out first, whatever was read since; every miss admitted."""
    return _oldest_out(reads, capacity, read_renews=False)


def _oldest_out(reads: list[int], capacity: int, *, read_renews: bool) -> list[bool]:
    """Every miss admitted, the oldest entry out when full: oldest by last read if ``read_renews``, else by
    admission."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for item in reads:
        if item in cache:
            if read_renews:
                cache.move_to_end(item)
            hits.append(True)
            continue
        hits.append(False)
        if len(cache) >= capacity:
            cache.popitem(last=False)
        cache[item] = None
    return hits


def keep_when_full(reads: list[int], capacity: int, idle_after: float = NEVER) -> list[bool]:
    """Admit while there is room; when full, admit a miss only in place of an entry unread for ``idle_after``
    reads or more (the least recently read one), else pass it by."""
    cache: OrderedDict[int, int] = OrderedDict()  # item -> position of its last read, least recent first
    hits = []
    for now, item in enumerate(reads):
        if item in cache:
            cache.move_to_end(item)
            cache[item] = now
            hits.append(True)
            continue
        hits.append(False)
        if len(cache) >= capacity:
            oldest, last = next(iter(cache.items()))
            if now - last < idle_after:
                continue
            del cache[oldest]
        cache[item] = now
    return hits


def belady(reads: list[int], capacity: int, following: list[float]) -> list[bool]:
    """Evict the entry read again furthest in the future (``following``), or pass the incoming object by when
    its own next read is at least as far."""
    cache: dict[int, float] = {}  # item -> position of its next read
    furthest: list[tuple[float, int]] = []  # (-next read, item), stale ones skipped when they surface
    hits = []
    for position, item in enumerate(reads):
        upcoming = following[position]
        if item in cache:
            hits.append(True)
        else:
            hits.append(False)
            if len(cache) >= capacity:
                while cache.get(furthest[0][1]) != -furthest[0][0]:
                    heapq.heappop(furthest)
                if upcoming >= -furthest[0][0]:
                    continue
                del cache[heapq.heappop(furthest)[1]]
        cache[item] = upcoming
        heapq.heappush(furthest, (-upcoming, item))
    return hits


def best_possible(reads: list[int], capacity: int) -> int:
    """The most hits any policy gets on ``reads`` (exhaustive search, for small traces): what OPT must get."""

    @functools.cache
    def best(position: int, cache: frozenset[int]) -> int:
        if position == len(reads):
            return 0
        item = reads[position]
        if item in cache:
            return 1 + best(position + 1, cache)
        if len(cache) < capacity:
            return max(best(position + 1, cache), best(position + 1, cache | {item}))
        return max(best(position + 1, cache), *(best(position + 1, cache - {out} | {item}) for out in cache))

    return best(0, frozenset())


def verify(cases: int = 200) -> None:
    """OPT against the exhaustive search on ``cases`` small traces: epochs of a few objects, and random reads."""
    import random

    for case in range(cases):
        draw = random.Random(case)
        count = draw.randint(3, 6)
        capacity = draw.randint(1, count - 1)
        reads = trace(count, 3, case, True) if case % 2 else [draw.randrange(count) for _ in range(14)]
        got, best = sum(belady(reads, capacity, next_reads(reads))), best_possible(reads, capacity)
        if got != best:
            raise SystemExit(f"OPT got {got} hits where {best} are possible: {reads}, capacity {capacity}")
    print(f"OPT matched the exhaustive search on {cases} small traces")


def policies(count: int) -> dict[str, Callable[[list[int], int], list[bool]]]:
    """Each policy as a function of the reads and the capacity (in objects)."""
    return {
        "LRU": lru,
        "FIFO": fifo,
        "keep when full": keep_when_full,
        **{
            f"keep when full, idle after {epochs:g} epochs": functools.partial(
                keep_when_full, idle_after=epochs * count
            )
            for epochs in IDLE_EPOCHS
        },
        "OPT (Belady)": lambda reads, capacity: belady(reads, capacity, next_reads(reads)),
        "OPT knowing the next epoch's order": lambda reads, capacity: belady(
            reads, capacity, next_reads(reads, horizon=lambda position: (position // count + 2) * count)
        ),
    }


def simulate(count: int, epochs: int, seed: int) -> list[dict[str, object]]:
    results = []
    for order, shuffle in ORDERS.items():
        reads = trace(count, epochs, seed, shuffle)
        for fraction in FRACTIONS:
            capacity = round(count * fraction)
            for policy, run in policies(count).items():
                hits = run(reads, capacity)
                by_epoch = [round(sum(hits[e * count : (e + 1) * count]) / count, 6) for e in range(epochs)]
                results.append(
                    {
                        "policy": policy,
                        "order": order,
                        "fraction": fraction,
                        "capacity": capacity,
                        "hit_rate_by_epoch": by_epoch,
                        "hit_rate_after_first": round(statistics.mean(by_epoch[1:]), 6),
                    }
                )
    return results


def tables(results: list[dict[str, object]], epochs: int) -> str:
    """One Markdown table per order: a row per policy, a column per cache size."""
    out = []
    for order in ORDERS:
        out.append(f"\n{order}: mean hit rate of epochs 2-{epochs}, cache size as a fraction of the data\n")
        out.append("| policy | " + " | ".join(f"{f:g}" for f in FRACTIONS) + " |")
        out.append("| --- |" + " ---: |" * len(FRACTIONS))
        rows: dict[str, list[str]] = {}
        for r in results:
            if r["order"] == order:
                rows.setdefault(str(r["policy"]), []).append(f"{r['hit_rate_after_first']:.1%}")
        out += [f"| {policy} | " + " | ".join(cells) + " |" for policy, cells in rows.items()]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000, help="objects in the dataset")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="the shuffle's seed, as given to the datasets")
    parser.add_argument("--json", help="also write the JSON here")
    parser.add_argument("--verify", action="store_true", help="check OPT against an exhaustive search first")
    args = parser.parse_args()
    if args.epochs < 2 or args.objects < 4:
        parser.error("at least 2 epochs and 4 objects")
    if args.verify:
        verify()
    started = time.perf_counter()
    results = simulate(args.objects, args.epochs, args.seed)
    seconds = time.perf_counter() - started
    print(f"{args.objects:,} objects of one size, {args.epochs} epochs, seed {args.seed}; simulated in {seconds:.1f} s")
    print(tables(results, args.epochs))
    report = {"objects": args.objects, "epochs": args.epochs, "seed": args.seed, "results": results}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
