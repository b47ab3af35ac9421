"""``torchdata-gcs bench``: measure listing, loading and composing on a prefix and suggest settings from what
was measured."""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from .._ops.checksums import ObjectInfo
from .._ops.urls import TEMPORARY_PREFIX, parse_url
from ..config import ClientConfig, TransferConfig
from ..datapipes.composing import GCSShardComposerIterDataPipe
from ..datapipes.loading import GCSFileLoaderIterDataPipe
from ..errors import ComposeFallbackWarning, NotFoundError
from .listing import listed_with_stats
from .options import client_config
from .sizes import human_size

__all__ = ["MAX_IN_FLIGHT", "bench"]

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 1024  # TransferConfig's upper bound
_FASTER = 1.2  # a ratio of throughputs below this is within noise for a short measurement


@dataclass
class _Step:
    """What one measured step did: objects in how many seconds, and at what cost."""

    name: str
    objects: int
    seconds: float
    complete: bool  # False: stopped by the time limit
    size: int | None = None  # bytes delivered; None for a listing
    requests: int = 0
    throttled: int | None = None  # 429 answers; None for a listing
    note: str = ""

    @property
    def rate(self) -> float:
        """Objects per second."""
        return self.objects / self.seconds if self.seconds > 0 else 0.0

    def row(self) -> str:
        megabytes = "-" if self.size is None or self.seconds <= 0 else f"{self.size / self.seconds / 1e6:,.2f}"
        throttled = "-" if self.throttled is None else f"{self.throttled:,}"
        note = "; ".join(filter(None, [self.note, "" if self.complete else "stopped by --seconds"]))
        return (
            f"{self.name:<30}{self.objects:>9,}{self.seconds:>9.2f}{self.rate:>11,.0f}{megabytes:>10}"
            f"{self.requests:>10,}{throttled:>6}  {note}"
        ).rstrip()


_HEADER = f"{'step':<30}{'objects':>9}{'seconds':>9}{'objects/s':>11}{'MB/s':>10}{'requests':>10}{'429s':>6}  note"


def _bench_listing(
    url: str, client: ClientConfig, concurrency: int, limit: int, seconds: float
) -> tuple[_Step, list[tuple[str, ObjectInfo]]]:
    """List ``url`` for at most ``seconds`` (longer if the sample needs it); the step, and the first ``limit``
    objects as the sample."""
    lister, listed = listed_with_stats(url, client, concurrency)
    sample: list[tuple[str, ObjectInfo]] = []
    count, elapsed, complete = 0, 0.0, True
    started = time.perf_counter()
    with contextlib.closing(listed):  # type: ignore[type-var]  # a generator, typed as the DataPipe's iterator
        for item in listed:
            count += 1
            if len(sample) < limit:
                sample.append(item)
            elapsed = time.perf_counter() - started
            if elapsed >= seconds and len(sample) == limit:
                complete = False
                break
    step = _Step(f"list_files_by_gcs c={concurrency}", count, elapsed, complete, requests=lister.stats.requests)
    return step, sample


def _bench_loading(
    pipe: GCSFileLoaderIterDataPipe, name: str, total: int, seconds: float
) -> tuple[_Step, list[warnings.WarningMessage]]:
    """Read what ``pipe`` yields for at most ``seconds`` (timed to the last object delivered); the step and
    the warnings it gave, kept off the terminal (``--verbose`` logs them)."""
    objects = size = 0
    elapsed = 0.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        loaded = iter(pipe)
        with contextlib.closing(loaded):  # type: ignore[type-var]  # as above
            for _, stream in loaded:
                size += len(stream.read())
                stream.close()
                objects += 1
                elapsed = time.perf_counter() - started
                if elapsed >= seconds:
                    break
    for warning in caught:
        logger.debug("%s: %s", name, warning.message)
    stats = pipe.stats
    step = _Step(name, objects, elapsed, objects == total, size, stats.requests, stats.throttled)
    return step, caught


def bench(args: argparse.Namespace) -> int:
    """``torchdata-gcs bench``: measure, print the table and the suggestions; the exit code."""
    client = client_config(args)
    listing, sample = _bench_listing(args.url, client, args.concurrency, args.limit, args.seconds)
    if not sample:
        raise NotFoundError(f"no objects under {args.url}: nothing to measure", url=args.url)
    average = sum(info.size for _, info in sample) / len(sample)
    extent = "all of them" if listing.complete else f"stopped after {args.seconds:g} s"
    print(
        f"{args.url}: listed {listing.objects:,} objects ({extent}); measuring on {len(sample):,} of them, "
        f"average {human_size(average)}"
    )

    def load(items: list[tuple[str, ObjectInfo]], in_flight: int) -> _Step:
        pipe = GCSFileLoaderIterDataPipe(items, client=client, transfer=TransferConfig(max_in_flight=in_flight))
        return _bench_loading(pipe, f"load_files_by_gcs m={in_flight}", len(items), args.seconds)[0]

    in_flight = args.max_in_flight
    most = min(2 * in_flight, MAX_IN_FLIGHT)
    load(sample[:most], most)  # untimed: opens the connections, so that no measured step pays for them
    direct = load(sample, in_flight)
    doubled = load(sample, 2 * in_flight) if 2 * in_flight <= MAX_IN_FLIGHT else None
    composer = GCSShardComposerIterDataPipe(sample, client=client, transfer=TransferConfig(max_in_flight=in_flight))
    composed, caught = _bench_loading(composer, f"compose_shards_by_gcs m={in_flight}", len(sample), args.seconds)
    # Not permitted: no compose was sent, and a fallback was warned of (a refused compose was sent first).
    refused = not composer.stats.composes and any(issubclass(w.category, ComposeFallbackWarning) for w in caught)
    composed.note = "compose not permitted: loaded directly" if refused else f"{composer.stats.composes:,} composes"

    print(_HEADER)
    for step in (listing, direct, doubled, composed):
        if step is not None:
            print(step.row())
    print(
        "c: list requests at once; m: max_in_flight; MB/s: object bytes delivered (10^6 bytes); "
        f"connections were opened beforehand by an untimed read of {min(most, len(sample)):,} objects"
    )
    print("suggestions:")
    bucket = parse_url(args.url)[0]
    for tip in _suggestions(average, in_flight, direct, doubled, composed, refused, bucket):
        print(f"  {tip}")
    return 0


def _suggestions(
    average: float, in_flight: int, direct: _Step, doubled: _Step | None, composed: _Step, refused: bool, bucket: str
) -> Iterator[str]:
    """What the measurements say about which loader to use and how many requests to keep in flight."""
    sizes = f"objects average {human_size(average)}"
    if refused:
        yield (
            f"compose not permitted: these credentials may not write gs://{bucket}/{TEMPORARY_PREFIX}, so "
            "compose_shards_by_gcs loads directly: use load_files_by_gcs (or grant object create/delete there)"
        )
    elif composed.rate >= _FASTER * direct.rate:
        yield f"{sizes}: compose_shards_by_gcs is {composed.rate / direct.rate:.1f}x load_files_by_gcs here: use it"
    elif direct.rate >= _FASTER * composed.rate:
        yield f"{sizes}: load_files_by_gcs is {direct.rate / composed.rate:.1f}x compose_shards_by_gcs here: use it"
    else:
        yield f"{sizes}: compose_shards_by_gcs and load_files_by_gcs are within 20% here: load_files_by_gcs is simpler"
    if direct.throttled:
        yield (
            f"load_files_by_gcs got {direct.throttled:,} 429 answers at max_in_flight={in_flight}: GCS had not scaled "
            "to this request rate; use a lower max_in_flight, or ramp up over minutes"
        )
    elif doubled is not None:
        gain = doubled.rate / direct.rate if direct.rate else 0.0
        if doubled.throttled:
            yield (
                f"max_in_flight={2 * in_flight} got {doubled.throttled:,} 429 answers: keep max_in_flight={in_flight}"
            )
        elif gain >= _FASTER:
            yield (
                f"max_in_flight={2 * in_flight} loaded {gain:.1f}x as fast as {in_flight}: "
                f"use TransferConfig(max_in_flight={2 * in_flight}) or more"
            )
        else:
            yield f"max_in_flight={2 * in_flight} loaded {gain:.2f}x as fast as {in_flight}: {in_flight} is enough here"
    loads = [step for step in (direct, doubled, composed) if step is not None]
    if not all(step.complete for step in loads):
        yield "some steps were stopped by --seconds before loading every object: a longer --seconds is steadier"
    elif min(step.seconds for step in loads) < 1.0:
        yield "some steps lasted under a second, which makes them noisy: a larger --limit is steadier"
