"""The node-local cache's speed: epochs read through a DataLoader with and without ``LocalCache``.

    .venv/bin/python -m benchmarks.cache [--runs 3] [--quick] [--dir DIR] [--json PATH]

Objects of 100 KiB in the embedded emulator behind HAProxy adding 20 ms to each request (``LatencyFront``),
each epoch reshuffled, read as bytes through ``torch.utils.data.DataLoader`` (4 persistent workers,
batches of 64) by four setups, each run a process of its own, the setups taking turns round after round:
``GCSIterableDataset`` without a cache; with ``cache=LocalCache(DIR, limit=twice the data)`` (epoch 1
cold, the next ones warm); the same bytes as files in DIR read with ``open(path, 'rb').read()`` by an
``IterableDataset`` that deals the epoch to the workers as the dataset does; a cache of half the data.
Every epoch's bytes are checked (length and crc32c of every object). Prints objects/s per setup and epoch
(the median over the runs), media GETs and cache hits per epoch (``LoadStats``), the targets, then the
JSON. ``--quick``: 1,000 objects, to check the rig.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KiB = 1024
BUCKET = "bench-cache"
SETUPS = ("no cache", "cache", "local files", "half cache")
WARM_TARGET = 0.7  # a warm epoch's objects/s against the local files' at least this
COLD_TARGET = 0.95  # the cold epoch's objects/s against no cache's first epoch at least this


def read_bytes(stream: Any) -> bytes:
    """The pass-through transform: the object's bytes."""
    return stream.read()


class LocalFiles(IterableDataset[bytes]):
    """The same objects as local files, each epoch's order dealt to the DataLoader's workers exactly as
    ``GCSIterableDataset`` deals it (one rank); each item ``open(path, 'rb').read()``."""

    def __init__(self, paths: list[str], *, shuffle: bool, seed: int, batch_size: int) -> None:
        import multiprocessing

        self.paths, self.shuffle, self.seed, self.batch_size = paths, shuffle, seed, batch_size
        self._epoch = multiprocessing.RawValue("q", 0)  # forked persistent workers see set_epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = epoch

    def __iter__(self) -> Any:
        from torch.utils.data import get_worker_info

        from torchdata_gcs._engines.epoch_order import Consumed, Split, epoch_share

        worker = get_worker_info()
        workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        split = Split(0, 1, workers[0], workers[1], self.batch_size)
        for index in epoch_share(len(self.paths), self.seed, self._epoch.value, self.shuffle, Consumed(), split):
            with open(self.paths[index], "rb") as file:
                yield file.read()


def child(setup: str, spec_file: str) -> dict[str, Any]:
    """One run of ``setup``: every epoch's seconds, what its counters say, and its check."""
    import google_crc32c
    from torch.utils.data import DataLoader

    from torchdata_gcs import ClientConfig, GCSIterableDataset

    spec = json.loads(Path(spec_file).read_text())
    expected = collections.Counter(tuple(pair) for pair in spec["manifest"])
    batch, seed = spec["batch_size"], spec["seed"]
    dataset: Any
    if setup == "local files":
        paths = [os.path.join(spec["local_dir"], name) for name in spec["names"]]
        dataset = LocalFiles(paths, shuffle=True, seed=seed, batch_size=batch)
    else:
        settings: dict[str, Any] = {}
        if setup in ("cache", "half cache"):
            from torchdata_gcs import LocalCache

            limit = spec["data_bytes"] * 2 if setup == "cache" else spec["data_bytes"] // 2
            settings["cache"] = LocalCache(spec["cache_dir"], limit=limit)
        dataset = GCSIterableDataset(
            f"gs://{BUCKET}/",
            shuffle=True,
            seed=seed,
            batch_size=batch,
            transform=read_bytes,
            client=ClientConfig(endpoint=spec["endpoint"], anonymous=True),
            **settings,
        )
    loader = DataLoader(dataset, batch_size=batch, num_workers=spec["workers"], persistent_workers=True)
    epochs = []
    for epoch in range(spec["epochs"]):
        dataset.set_epoch(epoch)
        before = _counters(dataset)
        got: collections.Counter[tuple[int, int]] = collections.Counter()
        check = 0.0
        started = time.perf_counter()
        for items in loader:
            checking = time.perf_counter()
            got.update((len(data), google_crc32c.value(data)) for data in items)
            check += time.perf_counter() - checking
        seconds = time.perf_counter() - started
        if got != expected:
            missing, extra = sum((expected - got).values()), sum((got - expected).values())
            raise SystemExit(f"{setup}, epoch {epoch + 1}: {missing} objects missing or wrong, {extra} unexpected")
        after = _counters(dataset)
        counts = {name: after[name] - before.get(name, 0) for name in after}
        epochs.append({"seconds": seconds, "check_seconds": check, "objects": sum(got.values()), **counts})
    del loader
    return {"setup": setup, "epochs": epochs}


def _counters(dataset: Any) -> dict[str, float]:
    """The dataset's ``LoadStats`` so far, summed over its workers (nothing for the local files)."""
    stats = getattr(dataset, "stats", None)
    return {} if stats is None else {k: v for k, v in dataclasses.asdict(stats).items() if k != "wait_seconds"}


def run_child(setup: str, spec_file: Path, timeout: float) -> dict[str, Any]:
    """``setup`` in a process of its own; its result, with the CPU it and its workers used."""
    command = [sys.executable, "-m", "benchmarks.cache", "--child", setup, str(spec_file)]
    cpu = _children_cpu()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{setup} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    result["client_cpu_seconds"] = _children_cpu() - cpu
    return result


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _file_system(path: Path) -> str:
    """The type and device of the file system that holds ``path`` (Linux: ``/proc/mounts``)."""
    best = ("", "?", "?")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, point, kind = line.split()[:3]
            if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) >= len(best[0]):
                best = (point, kind, device)
    return f"{best[1]} ({best[2]}, mounted on {best[0]})"


def summarize(runs: dict[str, list[dict[str, Any]]], epochs: int) -> list[dict[str, Any]]:
    """Per setup and epoch: the medians over the runs of objects/s, GETs and cache counts."""
    rows = []
    for setup, results in runs.items():
        for epoch in range(epochs):
            each = [result["epochs"][epoch] for result in results]
            row: dict[str, Any] = {
                "setup": setup,
                "epoch": epoch + 1,
                "objects_per_s": statistics.median(e["objects"] / e["seconds"] for e in each),
                "all_objects_per_s": [round(e["objects"] / e["seconds"], 1) for e in each],
                "check_seconds": statistics.median(e["check_seconds"] for e in each),
            }
            for name in ("requests", "cache_hits", "cache_misses", "cache_bytes"):
                if name in each[0]:
                    row[name] = statistics.median(e[name] for e in each)
            if "cache_hits" in row:
                looked = row["cache_hits"] + row.get("cache_misses", 0)
                row["hit_rate"] = row["cache_hits"] / looked if looked else None
            rows.append(row)
    return rows


def targets(runs: dict[str, list[dict[str, Any]]], epochs: int) -> list[dict[str, Any]]:
    """The two targets, met or not: the ratio of the medians over the runs, and the median of each round's
    own ratio (the two setups of a round ran minutes apart, under about the same load)."""

    def rates(setup: str, first: int, last: int) -> list[float]:
        """Per run of ``setup``, its objects/s over epochs ``first`` to ``last`` (1-based): a median of them."""
        return [
            statistics.median(e["objects"] / e["seconds"] for e in run["epochs"][first - 1 : last])
            for run in runs.get(setup, [])
        ]

    out = []
    compared = (
        (f"warm epochs (2-{epochs}) at least {WARM_TARGET}x the local files' objects/s", WARM_TARGET)
        + (("cache", 2, epochs), ("local files", 2, epochs)),
        (f"cold epoch at least {COLD_TARGET}x the objects/s of no cache's first epoch", COLD_TARGET)
        + (("cache", 1, 1), ("no cache", 1, 1)),
    )
    for what, goal, ours, theirs in compared:
        mine, peer = rates(*ours), rates(*theirs)
        if not mine or not peer:
            continue
        ratio = statistics.median(mine) / statistics.median(peer)
        per_round = statistics.median(m / p for m, p in zip(mine, peer, strict=True))
        out.append({"target": what, "ratio": ratio, "median_round_ratio": per_round, "met": ratio >= goal})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| setup | epoch | objects/s (median) | runs | media GETs | cache hits | hit rate | MB from the cache |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        gets = f"{r['requests']:,.0f}" if "requests" in r else "-"
        hits = f"{r['cache_hits']:,.0f}" if "cache_hits" in r else "-"
        rate = f"{r['hit_rate']:.1%}" if r.get("hit_rate") is not None else "-"
        read = f"{r['cache_bytes'] / 1e6:,.0f}" if "cache_bytes" in r else "-"
        runs = ", ".join(f"{x:,.0f}" for x in r["all_objects_per_s"])
        lines.append(
            f"| {r['setup']} | {r['epoch']} | {r['objects_per_s']:,.0f} | {runs} | {gets} | {hits} | {rate} | {read} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--size-kib", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="runs of each setup; figures are their medians")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--latency-ms", type=int, default=20)
    parser.add_argument("--only", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--quick", action="store_true", help="1,000 objects, to check the rig")
    parser.add_argument("--dir", type=Path, help="where the cache and the local files go (a node-local disk)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.quick:
        args.objects = 1_000

    import google_crc32c

    from torchdata_gcs.testing import Emulator, LatencyFront

    if not LatencyFront.available():
        raise SystemExit(f"the latency front cannot start here: {LatencyFront.unavailable_reason()}")
    work = Path(tempfile.mkdtemp(prefix="torchdata-gcs-cache-bench-", dir=args.dir))
    load_at_start = _load()
    print(f"load average at start: {load_at_start}; cache and local files in {work}: {_file_system(work)}", flush=True)
    names = [f"objects/{i:06d}.bin" for i in range(args.objects)]
    runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in args.only}
    started = time.perf_counter()
    try:
        with Emulator(backend="filesystem", memory_limit="8GiB") as emulator:
            manifest = []
            for first in range(0, args.objects, 1000):  # seeded a thousand at a time, each also written locally
                objects = {name: os.urandom(args.size_kib * KiB) for name in names[first : first + 1000]}
                emulator.seed(BUCKET, objects, concurrency=64)
                for name, data in objects.items():
                    path = work / "local" / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
                    manifest.append([len(data), google_crc32c.value(data)])
            print(f"seeded {args.objects:,} objects in {time.perf_counter() - started:.1f} s", flush=True)
            with LatencyFront(emulator.endpoint, latency=args.latency_ms / 1000) as front:
                spec = {
                    "endpoint": front.endpoint,
                    "names": names,
                    "manifest": manifest,
                    "data_bytes": args.objects * args.size_kib * KiB,
                    "local_dir": str(work / "local"),
                    "cache_dir": str(work / "cache"),
                    "epochs": args.epochs,
                    "workers": args.workers,
                    "batch_size": args.batch_size,
                    "seed": 0,
                }
                spec_file = work / "spec.json"
                spec_file.write_text(json.dumps(spec))
                for round_ in range(args.runs):
                    order = args.only[round_ % len(args.only) :] + args.only[: round_ % len(args.only)]
                    for setup in order:
                        shutil.rmtree(work / "cache", ignore_errors=True)  # every cached run starts cold
                        runs[setup].append(run_child(setup, spec_file, args.timeout))
                    print(f"round {round_ + 1} of {args.runs} done ({', '.join(order)}), load {_load()}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_at_end = _load()
    rows = summarize(runs, args.epochs)
    met = targets(runs, args.epochs)
    command = "python -m benchmarks.cache" + (" --quick" if args.quick else "") + f" --runs {args.runs}"
    print(
        f"\n{args.objects:,} objects of {args.size_kib} KiB, {args.latency_ms} ms added per request, "
        f"{args.workers} workers, batches of {args.batch_size}, {args.epochs} epochs, {args.runs} runs per setup; "
        f"{(time.perf_counter() - started) / 60:.1f} min; load average {load_at_start} at start, {load_at_end} at end"
    )
    print(table(rows))
    cpu = {setup: statistics.median(r["client_cpu_seconds"] for r in results) for setup, results in runs.items()}
    print(
        "client CPU s per run (the process and its workers, listing included): "
        + ", ".join(f"{setup} {seconds:.1f}" for setup, seconds in cpu.items())
    )
    for target in met:
        print(
            f"- {target['target']}: {target['ratio']:.2f}x (median of each round's own "
            f"{target['median_round_ratio']:.2f}x), {'met' if target['met'] else 'missed'}"
        )
    report = {
        "command": command,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}",
        "file_system": _file_system(Path(args.dir or tempfile.gettempdir())),
        "objects": args.objects,
        "object_bytes": args.size_kib * KiB,
        "latency_ms": args.latency_ms,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "load_average": {"start": load_at_start, "end": load_at_end},
        "rows": rows,
        "targets": met,
        "client_cpu_seconds": cpu,
        "runs": runs,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
