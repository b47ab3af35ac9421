"""What a large training job asks of GCS through this library, computed: requests per second, operations
and dollars per epoch and per checkpoint (the tables of docs/scale.md).

    python -m benchmarks.scale_calculator

The requests one operation sends come from the library's own settings (list page size, ranged-read
and upload part sizes, objects per composite); tests/test_scale.py checks each count against what the
library sends to a GCS front at small scale, and that docs/scale.md holds this module's tables.
The job, the dataset, the latencies and the prices are assumptions, named in ``Job`` and ``PRICES``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from torchdata_gcs import TransferConfig, WriteConfig
from torchdata_gcs._engines.parallel_listing import SPLIT_BUDGET
from torchdata_gcs._engines.publishing import part_size
from torchdata_gcs._ops.objects import MAX_SOURCES
from torchdata_gcs._ops.paging import MAX_PAGE_SIZE

READS, WRITES = 5000, 1000
"""A bucket's initial capacity per second (GCS's request-rate guidelines): object reads (listing included),
object writes (uploads, updates and deletes)."""
DOUBLING_MINUTES = 20
"""Above those rates, GCS asks for no more than a doubling of the rate per this many minutes."""
HNS_START = 8
"""A bucket with hierarchical namespace starts with up to this many times those rates (GCS's overview)."""
SOFT_DELETE_DAYS = 7
"""A new bucket's default soft-delete retention: a deleted object is billed as storage this long."""
PRICES = {"A": 0.005 / 1000, "B": 0.0004 / 1000, "GiB-hour": 0.000027397}
"""Dollars per Class A and Class B operation and per GiB-hour of Standard storage, one region, flat
namespace: cloud.google.com/storage/pricing as transcribed on 2026-09-20. Deletes are free."""

DEFAULT_TRANSFER, DEFAULT_WRITE = TransferConfig(), WriteConfig()

# What each kind of request is, for the bill and for the bucket's request-rate budget (as docs/scale.md says).
CLASS = {"list": "A", "upload": "A", "compose": "A", "get": "B", "metadata": "B", "delete": None}
WRITE_KINDS = {"upload", "compose", "delete"}


@dataclass(frozen=True)
class Job:
    """The job, its data and its checkpoints; every figure an assumption (docs/scale.md names them)."""

    nodes: int = 1000
    gpus: int = 8
    workers: int = 8
    images: int = 10_000_000
    image_bytes: int = 100_000
    images_per_second_per_gpu: int = 2000
    shard_bytes: int = 100_000_000
    checkpoint_bytes: int = 10**12
    checkpoint_minutes: int = 30
    page_seconds: float = 0.2  # one list page of 1,000 names
    dataset_list_concurrency: int = 16  # GCSIterableDataset / GCSMapDataset default
    datapipe_list_concurrency: int = 8  # list_files_by_gcs default

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus

    @property
    def readers(self) -> int:
        return self.ranks * self.workers

    @property
    def images_per_second(self) -> int:
        return self.ranks * self.images_per_second_per_gpu

    @property
    def images_per_shard(self) -> int:
        return self.shard_bytes // self.image_bytes

    @property
    def shards(self) -> int:
        return math.ceil(self.images / self.images_per_shard)


# -- what one operation sends (checked against a GCS front by tests/test_scale.py) -------------------------


def list_requests(objects: int, page_size: int = MAX_PAGE_SIZE) -> tuple[int, int]:
    """List requests of one listing: a sequential one's, and the most a parallel one may send."""
    pages = max(1, math.ceil(objects / page_size))
    return pages, math.floor(pages * (1 + SPLIT_BUDGET))


def read_requests(size: int, transfer: TransferConfig = DEFAULT_TRANSFER) -> Counter[str]:
    """Reading one object whose size the listing gave: one GET, or ranged GETs of ``part_size``."""
    return Counter(get=max(1, math.ceil(size / transfer.part_size)))


def composed_read_requests(objects: int, sources: int = MAX_SOURCES) -> Counter[str]:
    """``compose_shards_by_gcs`` over ``objects`` small listed objects, without its probe: per composite one
    compose, one GET of the composite and one delete."""
    composites = math.ceil(objects / sources)
    return Counter(compose=composites, get=composites, delete=composites)


COMPOSE_PROBE = Counter(upload=1, delete=1)
"""What ``compose_shards_by_gcs`` adds per bucket, process and iteration: an empty probe written and deleted."""


def parts(size: int, write: WriteConfig = DEFAULT_WRITE) -> int:
    """Parts of a streamed upload of ``size`` bytes: ``part_size``, doubled every 1,000 parts."""
    count, covered = 0, 0
    while covered < size:
        count += 1
        covered += part_size(count, write.part_size)
    return count


def multipart_save_requests(size: int, write: WriteConfig = DEFAULT_WRITE) -> Counter[str]:
    """One streamed save (``checkpoint.save``, a DCP data file) past the first of its process: bytes that fit
    one part go in one upload, after asking for the live generation (its precondition); more go as a
    multipart upload: its start, its marker object, the parts and the completion, then the marker's delete."""
    if size < write.part_size:
        return Counter(metadata=1, upload=1)
    return Counter(upload=1 + 1 + parts(size, write) + 1, delete=1)


DCP_RANK = Counter(metadata=1)
"""What every rank of a DCP save adds to its data file: torch asks whether ``.metadata`` exists."""
DCP_COORDINATOR = Counter(metadata=2, upload=1)
"""What the coordinator adds, saving to a new path: the old ``.metadata`` looked for (to delete it), then
the new one written in one upload after asking for the live generation (its precondition)."""

MULTIPART_PROBE = Counter(list=1)
"""What the first multipart save of a process adds: one listing of the bucket's unfinished uploads."""


# -- the job ------------------------------------------------------------------------------------------------


def bill(requests: Counter[str]) -> float:
    return sum(count * PRICES[CLASS[kind]] for kind, count in requests.items() if CLASS[kind])


def split(requests: Counter[str]) -> tuple[int, int]:
    """(reads, writes) as the bucket's request-rate budget counts them."""
    writes = sum(count for kind, count in requests.items() if kind in WRITE_KINDS)
    return sum(requests.values()) - writes, writes


def ramp_minutes(reads: float, writes: float, reads_at_start: float = READS, writes_at_start: float = WRITES) -> float:
    """Minutes of doubling, from the initial capacity, before a bucket serves ``reads`` and ``writes`` per second."""
    doublings = max(0.0, math.log2(reads / reads_at_start), math.log2(max(writes, 1) / writes_at_start))
    return doublings * DOUBLING_MINUTES


def scale(counter: Counter[str], factor: float) -> Counter[str]:
    return Counter({kind: count * factor for kind, count in counter.items()})


def reading(job: Job) -> list[tuple[str, Counter[str], Counter[str]]]:
    """Per way of reading: (name, requests per second in steady state, requests per epoch)."""
    per_image = read_requests(job.image_bytes)
    composed = composed_read_requests(MAX_SOURCES)  # per full composite
    shard = read_requests(job.shard_bytes)
    probes = scale(COMPOSE_PROBE, job.readers)
    return [
        (
            f"{job.image_bytes // 1000} KB images, `load_files_by_gcs` / datasets",
            scale(per_image, job.images_per_second),
            scale(per_image, job.images),
        ),
        (
            f"same images, `compose_shards_by_gcs` ({MAX_SOURCES} per composite)",
            scale(composed, job.images_per_second / MAX_SOURCES),
            composed_read_requests(job.images) + probes,
        ),
        (
            f"{job.shard_bytes // 10**6} MB shards, `load_files_by_gcs` ({shard['get']} ranged GETs each)",
            scale(shard, job.images_per_second / job.images_per_shard),
            scale(shard, job.shards),
        ),
    ]


def listing(job: Job) -> list[tuple[str, int, int]]:
    """Per listing policy: (name, listings of the whole dataset, list requests in flight per listing)."""
    return [
        ("one per job (`list_once=True`: rank 0 lists, the ranks get its list)", 1, job.dataset_list_concurrency),
        ("one per rank, at start (`list_once=False`, or no process group)", job.ranks, job.dataset_list_concurrency),
        ("one per worker, every epoch (DataPipes without `manifest=`)", job.readers, job.datapipe_list_concurrency),
    ]


def checkpoint(job: Job, write: WriteConfig = DEFAULT_WRITE) -> tuple[int, Counter[str]]:
    """Bytes per rank's file, and the requests of one DCP save: every rank's data file, and ``.metadata``."""
    per_rank = job.checkpoint_bytes // job.ranks
    return per_rank, scale(multipart_save_requests(per_rank, write) + DCP_RANK, job.ranks) + DCP_COORDINATOR


# -- tables -------------------------------------------------------------------------------------------------


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _usd(value: float) -> str:
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if value >= 0.1 else f"${value:,.4f}".rstrip("0")


def tables(job: Job = Job()) -> dict[str, str]:
    """Each table of docs/scale.md, by name, as Markdown."""
    out = {}
    rows = [
        "| reading | reads/s | writes/s | x initial reads | x initial writes | ramp, minutes | ramp with HNS |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, per_second, _ in reading(job):
        reads, writes = split(per_second)
        hns = ramp_minutes(reads, writes, READS * HNS_START, WRITES * HNS_START)
        rows.append(
            f"| {name} | {_n(reads)} | {_n(writes)} | {reads / READS:,.1f} | {writes / WRITES:,.1f} "
            f"| {ramp_minutes(reads, writes):,.0f} | {hns:,.0f} |"
        )
    out["rates"] = "\n".join(rows)

    ways = [
        ("one GET per image", read_requests(job.image_bytes)["get"], 1),
        ("shards, 32 MiB ranges", read_requests(job.shard_bytes)["get"], job.images_per_shard),
        (
            "shards, 128 MiB ranges",
            read_requests(job.shard_bytes, TransferConfig(part_size=128 * 2**20))["get"],
            job.images_per_shard,
        ),
    ]
    rows = [
        "| minutes | reads/s the bucket allows | "
        + " | ".join(f"images/s per GPU, {name}" for name, _, _ in ways)
        + " |",
        "| ---: | ---: |" + " ---: |" * len(ways),
    ]
    for minutes in (0, 20, 40, 60, 80, 120, 180, 240):
        allowed = READS * 2 ** (minutes / DOUBLING_MINUTES)
        per_gpu = [min(job.images_per_second_per_gpu, allowed / gets * images / job.ranks) for _, gets, images in ways]
        rows.append(f"| {minutes} | {_n(allowed)} | " + " | ".join(f"{rate:,.1f}" for rate in per_gpu) + " |")
    out["warmup"] = "\n".join(rows)

    rows = [
        "| reading, per epoch | Class A | Class B | free deletes | operations, $ | soft delete on, $ more |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, _, per_epoch in reading(job):
        a = sum(n for kind, n in per_epoch.items() if CLASS[kind] == "A")
        b = sum(n for kind, n in per_epoch.items() if CLASS[kind] == "B")
        # each composite, as large as its sources, is kept (and billed) for the retention once deleted
        kept = job.images * job.image_bytes if per_epoch["compose"] else 0
        soft = kept / 2**30 * SOFT_DELETE_DAYS * 24 * PRICES["GiB-hour"]
        rows.append(
            f"| {name} | {_n(a)} | {_n(b)} | {_n(per_epoch['delete'])} | {_usd(bill(per_epoch))} | {_usd(soft)} |"
        )
    out["epoch"] = "\n".join(rows)

    pages, at_most = list_requests(job.images)
    rows = [
        "| listing policy | listings | list requests | $ (sequential .. at most) | in flight at start |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, listings, concurrency in listing(job):
        in_flight = listings * concurrency
        low, high = listings * pages, listings * at_most
        rows.append(
            f"| {name} | {_n(listings)} | {_n(low)} .. {_n(high)} | {_usd(low * PRICES['A'])} .. "
            f"{_usd(high * PRICES['A'])} | {_n(in_flight)} |"
        )
    out["listing"] = "\n".join(rows)

    rows = [
        "| checkpoint settings | file per rank | parts | Class A | Class B | writes | $ per save | $ per day |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    saves_per_day = 24 * 60 // job.checkpoint_minutes
    for label, write in (
        ("`WriteConfig()` (8 MiB parts)", DEFAULT_WRITE),
        ("`WriteConfig(part_size=64 * MiB)`", WriteConfig(part_size=64 * 2**20)),
        ("`WriteConfig(part_size=128 * MiB)`", WriteConfig(part_size=128 * 2**20)),
    ):
        per_rank, requests = checkpoint(job, write)
        a = sum(n for kind, n in requests.items() if CLASS[kind] == "A")
        b = sum(n for kind, n in requests.items() if CLASS[kind] == "B")
        shown = parts(per_rank, write) if per_rank >= write.part_size else 1
        rows.append(
            f"| {label} | {per_rank / 10**6:,.0f} MB | {shown} | {_n(a)} | {_n(b)} | {_n(split(requests)[1])} "
            f"| {_usd(bill(requests))} | {_usd(bill(requests) * saves_per_day)} |"
        )
    out["checkpoint"] = "\n".join(rows)
    return out


def main() -> None:
    job = Job()
    print(
        f"{job.ranks:,} ranks, {job.readers:,} reading processes, {job.images_per_second:,} images/s, "
        f"{job.images:,} images of {job.image_bytes:,} bytes; {job.shards:,} shards of {job.shard_bytes:,} bytes"
    )
    for name, table in tables(job).items():
        print(f"\n<!-- scale:{name} -->\n{table}\n<!-- /scale:{name} -->")


if __name__ == "__main__":
    main()
