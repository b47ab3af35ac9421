"""Packing: the objects under a ``gs://`` prefix written as WebDataset tar shards with their indexes, the
same bytes for the same listing, resumable where a killed or failed pack stopped."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Literal

from .._engines.inputs import list_inputs
from .._engines.packing import PackCounts, existing_shards, pack_shards, plan_shards
from .._engines.parallel_listing import ListingStats
from .._ops.checksums import ObjectInfo
from .._ops.client import Client, GCSClient
from .._ops.paging import MAX_PAGE_SIZE
from .._ops.patterns import has_magic
from .._ops.urls import format_url, parse_url
from ..config import ClientConfig, RetryConfig, TransferConfig, WriteConfig, parse_size
from ..errors import InvalidURIError, NotFoundError

logger = logging.getLogger(__name__)

__all__ = ["PackReport", "pack"]

_LISTING_CONCURRENCY = 16


@dataclasses.dataclass(frozen=True)
class PackReport:
    """What one :func:`pack` call did (or has done so far, as ``progress`` sees it).

    Attributes:
        shards_written: shards published, each with its index.
        shards_skipped: planned shards the destination already held whole (a resumed pack), not written again.
        samples: samples in the shards written.
        objects: objects read into the shards written.
        bytes: those objects' bytes.
        seconds: time since the call started.
    """

    shards_written: int
    shards_skipped: int
    samples: int
    objects: int
    bytes: int
    seconds: float

    def describe(self) -> str:
        """One line: what was done, and how fast."""
        rate = max(self.seconds, 1e-9)
        return (
            f"{self.objects:,} objects ({self.samples:,} samples, {self.bytes / 1e6:,.1f} MB) in "
            f"{self.shards_written:,} shards written, {self.shards_skipped:,} already there; {self.seconds:.1f} s, "
            f"{self.objects / rate:,.0f} objects/s, {self.bytes / 1e6 / rate:,.1f} MB/s"
        )


def pack(
    source: str,
    destination: str,
    *,
    shard_size: int | str = "512MiB",
    group_by: Literal["stem"] | None = "stem",
    client: GCSClient | ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
    write: WriteConfig | None = None,
    progress: bool | Callable[[PackReport], None] = False,
) -> PackReport:
    """Pack the objects under ``source`` (a ``gs://bucket/prefix/``) into WebDataset tar shards in the folder
    ``destination``: ``shard-000000.tar``, ``shard-000001.tar``, ... each followed by its index
    ``shard-000000.tar.idx`` (member offsets, for reading one sample with one ranged GET).

    Member names are the object names relative to ``source``. With ``group_by="stem"`` the objects whose names
    share a key (``000123.jpg``, ``000123.json``: up to the first dot of the file name) are one sample; with
    ``None`` each object is a sample. Shards are filled in name order up to ``shard_size`` bytes of tar (an
    ``int``, or ``"512MiB"``, ``"1GB"``); a sample is never split, and one larger than ``shard_size`` is a
    shard alone. So the listing alone decides each shard's bytes: packing the same objects again gives the
    same shards, byte for byte.

    Objects are read concurrently (``transfer``), each pinned to the version listed, while earlier shards
    upload through the streaming writer (``write``), which publishes a shard only when it is complete; its
    index is written after it, so an index present means its shard is whole. Memory stays near
    ``transfer.max_buffered_bytes`` plus, for each of three shards in flight (one filling, two publishing),
    ``write.part_size x (write.max_parts_in_flight + 1)``.

    Running the same pack again resumes it: a shard that the destination holds with the planned size and
    crc32c (computed from the listing) and the planned index is skipped; a shard that differs (the source
    changed since) is written again, its old index deleted first. Shards beyond the plan (from a larger
    source) are left alone, with a warning. A killed pack leaves no partial shard, only temporary parts that
    ``torchdata-gcs clean`` removes.

    ``progress``: ``True`` writes a progress line to stderr (in place on a terminal, else a line every few
    seconds); a callable gets a :class:`PackReport` so far, a few times a second.

    Raises:
        NotFoundError: nothing under ``source`` (an empty result is almost always a typo), or no bucket.
        InvalidURIError: a URL that is not a ``gs://`` prefix, or ``destination`` inside ``source``.
        ValueError: a bad ``shard_size`` or ``group_by``; an object name with no sample key (``.hidden``).
        IntegrityError, UploadError: an object changed while read, or a shard could not be published (the
            shards published before it stay, and the next run resumes after them).

    Examples:
        >>> import io, tarfile
        >>> from torchdata_gcs import testing
        >>> from torchdata_gcs.shards import pack
        >>> with testing.Emulator() as emulator:
        ...     emulator.seed("data", {"raw/0.jpg": b"cat", "raw/0.json": b"{}", "raw/1.jpg": b"dog"})
        ...     report = pack("gs://data/raw/", "gs://data/shards/", client=emulator.client_config)
        ...     print(report.shards_written, report.samples, report.objects, emulator.names("data")[:2])
        ...     with tarfile.open(fileobj=io.BytesIO(emulator.read("data", "shards/shard-000000.tar"))) as tar:
        ...         print(tar.getnames())
        1 2 3 ['raw/0.jpg', 'raw/0.json']
        ['0.jpg', '0.json', '1.jpg']
    """
    started = time.monotonic()
    source_url, destination_url = _checked(source, destination)
    size = parse_size("shard_size", shard_size)
    if group_by not in ("stem", None):
        raise ValueError(f"group_by: expected 'stem' or None, got {group_by!r}")
    gcs = Client(client, retry, transfer=transfer)
    existing = existing_shards(gcs, destination_url)
    line = _ProgressLine(sys.stderr) if progress is True else None
    callback: Callable[[PackReport], None] | None = line or (progress if callable(progress) else None)
    seen = _Throttled(started, callback)
    try:
        plans = plan_shards(_listed(gcs, source_url), source_url, size, by_stem=group_by == "stem")
        counts = pack_shards(gcs, plans, destination_url, write or WriteConfig(), existing, seen)
    finally:
        if line is not None:
            line.end()
    planned = counts.shards_written + counts.shards_kept
    beyond = sorted(name for name in existing if int(name[6:].partition(".")[0]) >= planned)
    if beyond:
        logger.warning(
            "%s holds %d shard objects beyond the %d planned (from an earlier, larger source?), left as they are: %s",
            destination_url,
            len(beyond),
            planned,
            beyond[:4],
        )
    report = _report(counts, started)
    if callable(progress):
        progress(report)  # the last word, whatever the throttle let through
    return report


def _checked(source: str, destination: str) -> tuple[str, str]:
    """The source and destination as folder URLs (ending in ``/``, or a bucket's root), checked."""
    urls = []
    for what, url in (("source", source), ("destination", destination)):
        bucket, name = parse_url(url)
        if has_magic(name):
            raise InvalidURIError(f"{what}: expected a gs://bucket/prefix/, not a glob: {url}", url=url)
        urls.append(format_url(bucket, name if not name or name.endswith("/") else name + "/"))
    source_url, destination_url = urls
    if destination_url.startswith(source_url):
        raise InvalidURIError(
            f"the destination {destination} is inside the source {source}: a later pack of the source would pack "
            "the shards too; write them to another folder",
            url=destination,
        )
    return source_url, destination_url


def _listed(client: Client, source_url: str) -> Iterator[tuple[str, ObjectInfo]]:
    """The objects under ``source_url`` in name order; ``NotFoundError`` if there are none."""
    found = 0
    batches = list_inputs(
        client,
        [source_url],
        [],
        with_info=True,
        page_size=MAX_PAGE_SIZE,
        concurrency=_LISTING_CONCURRENCY,
        stats=ListingStats(),
        allow_empty=True,
    )
    for batch in batches:
        found += len(batch)
        for _, url, info in batch:
            yield url, info  # type: ignore[misc]  # with_info=True: every entry carries its ObjectInfo
    if not found:
        raise NotFoundError(
            f"nothing to pack: no object under {source_url} (an empty source is almost always a typo)", url=source_url
        )


def _report(counts: PackCounts, started: float) -> PackReport:
    return PackReport(
        shards_written=counts.shards_written,
        shards_skipped=counts.shards_kept,
        samples=counts.samples,
        objects=counts.objects,
        bytes=counts.bytes,
        seconds=time.monotonic() - started,
    )


class _Throttled:
    """The engine's counts, handed to ``callback`` as a :class:`PackReport` at most ten times a second."""

    def __init__(self, started: float, callback: Callable[[PackReport], None] | None) -> None:
        self.started, self.callback, self.last = started, callback, 0.0

    def __call__(self, counts: PackCounts) -> None:
        now = time.monotonic()
        if self.callback is None or now - self.last < 0.1:
            return
        self.last = now
        self.callback(_report(counts, self.started))


class _ProgressLine:
    """The progress line on ``stream``: rewritten in place on a terminal, else a new line every few seconds."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream, self.tty = stream, stream.isatty()
        self.every = 0.5 if self.tty else 5.0
        self.last = time.monotonic()  # a pack that ends within the first interval prints no progress line
        self.shown = False

    def __call__(self, report: PackReport) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        text = f"packing: {report.describe()}"
        self.stream.write(f"\r{text}\x1b[K" if self.tty else f"{text}\n")
        self.stream.flush()
        self.shown = True

    def end(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\n")
            self.stream.flush()
