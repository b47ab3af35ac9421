"""Two source trees of torchdata-gcs against each other, alternating, on one emulator.

    .venv/bin/python -m benchmarks.code_ab --old /tmp/ab-old --new /tmp/ab-new [--rounds 3] [--quick]

Each tree is a copy of the sources (``git archive COMMIT | tar -x -C DIR``); every run is a process of its own
with ``PYTHONPATH`` set to one tree, the two sides alternating, the order swapped every round. Workloads:
``small`` (``load_files_by_gcs`` over 2,000 x 100 KiB: CPU per object), ``large`` (over 2 x 256 MiB: MB/s),
``checkpoint`` (``checkpoint.save`` of 256 MiB through a ``GCSFront``, then ``load``), ``map``
(``GCSMapDataset`` in a ``DataLoader``: CPU per object). Every run's bytes are checked (length and crc32c).
Prints each side's medians, their ratio and the median of each round's new / old, then the JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
SMALL_BUCKET, LARGE_BUCKET, CHECKPOINT_BUCKET = "code-ab-small", "code-ab-large", "code-ab-checkpoint"
WORKLOADS = ("small", "large", "checkpoint", "map")
TENSORS, SIDE = 16, 2048  # 16 x 2048 x 2048 float32 = 256 MiB


def _cpu() -> float:
    """User + system seconds of this process, all its threads (finer than ``os.times``' clock ticks)."""
    return time.process_time()


def _check(got: dict[str, bytes], manifest: dict[str, list[int]]) -> None:
    import google_crc32c

    assert set(got) == set(manifest), f"{len(got)} objects read, {len(manifest)} expected"
    for name, (size, crc) in manifest.items():
        data = got[name]
        assert len(data) == size and google_crc32c.value(data) == crc, f"wrong bytes for {name}"


def _state(scale: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return {f"layer{i}": torch.rand(SIDE // scale, SIDE, generator=generator) for i in range(TENSORS)}


def child(tree: str, workload: str, spec_file: str) -> dict[str, float]:
    """One run of ``workload`` with the library from ``tree``; returns its figures."""
    import google_crc32c
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data.datapipes.iter import IterableWrapper

    import torchdata_gcs
    from torchdata_gcs import ClientConfig, GCSMapDataset, checkpoint

    where = Path(torchdata_gcs.__file__).resolve()
    assert where.is_relative_to(Path(tree).resolve()), f"torchdata_gcs came from {where}, not {tree}"
    spec = json.loads(Path(spec_file).read_text())
    direct = ClientConfig(endpoint=spec["endpoint"], anonymous=True)

    if workload in ("small", "large"):
        bucket = SMALL_BUCKET if workload == "small" else LARGE_BUCKET
        manifest = spec["manifests"][bucket]
        urls = [f"gs://{bucket}/{name}" for name in manifest]
        cpu, started = _cpu(), time.perf_counter()
        got = {
            url.split("/", 3)[3]: stream.read()
            for url, stream in IterableWrapper(urls).load_files_by_gcs(client=direct)
        }
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        _check(got, manifest)
        return {"seconds": seconds, "cpu": cpu, "bytes": sum(size for size, _ in manifest.values())}

    if workload == "map":
        manifest = spec["manifests"][SMALL_BUCKET]
        cpu, started = _cpu(), time.perf_counter()
        dataset = GCSMapDataset(f"gs://{SMALL_BUCKET}/", client=direct)
        list_seconds, list_cpu = time.perf_counter() - started, _cpu() - cpu
        assert len(dataset) == len(manifest), f"listed {len(dataset)} objects, {len(manifest)} expected"
        got = {}
        cpu, started = _cpu(), time.perf_counter()
        for urls, blobs in DataLoader(dataset, batch_size=64, num_workers=0):
            for url, data in zip(urls, blobs, strict=True):
                got[url.split("/", 3)[3]] = data
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        _check(got, manifest)
        return {"seconds": seconds, "cpu": cpu, "list_seconds": list_seconds, "list_cpu": list_cpu}

    assert workload == "checkpoint", workload
    state = _state(spec["scale"])
    expected = {key: (t.nbytes, google_crc32c.value(t.numpy().tobytes())) for key, t in state.items()}
    size = sum(t.nbytes for t in state.values())
    url = f"gs://{CHECKPOINT_BUCKET}/run-{os.getpid()}-{time.time_ns()}.pt"
    fronted = ClientConfig(endpoint=spec["front"], anonymous=True)
    cpu, started = _cpu(), time.perf_counter()
    checkpoint.save(state, url, client=fronted)
    save_seconds, save_cpu = time.perf_counter() - started, _cpu() - cpu
    del state
    cpu, started = _cpu(), time.perf_counter()
    loaded = checkpoint.load(url, client=direct)
    load_seconds, load_cpu = time.perf_counter() - started, _cpu() - cpu
    assert set(loaded) == set(expected), "wrong keys"
    for key, (nbytes, crc) in expected.items():
        tensor = loaded[key]
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32, key
        assert tensor.nbytes == nbytes and google_crc32c.value(tensor.numpy().tobytes()) == crc, f"wrong {key}"
    checkpoint.remove(url, client=direct)
    return {
        "save_seconds": save_seconds,
        "save_cpu": save_cpu,
        "load_seconds": load_seconds,
        "load_cpu": load_cpu,
        "bytes": size,
    }


def run_child(tree: Path, workload: str, spec_file: Path, timeout: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("STORAGE_EMULATOR_HOST", None)
    # The script by its path (not -m), from the tree: the worktree's own package is nowhere on sys.path.
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), workload, str(spec_file)]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{workload} on {tree} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def rows(
    results: dict[str, dict[str, list[dict[str, float]]]], small_count: int
) -> list[tuple[str, float, float, float]]:
    """(what, old, new, ratio) per row: the medians of each side, and the median over the rounds of that
    round's new / old (the two ran back to back, so a round's load weighs on both)."""
    out = []

    def row(what: str, workload: str, key: str, per: float, rate: bool = False) -> None:
        old, new = ([run[key] for run in results[workload][side]] for side in ("old", "new"))
        ratio = statistics.median((o / n) if rate else (n / o) for o, n in zip(old, new, strict=True))
        medians = statistics.median(old), statistics.median(new)
        old_figure, new_figure = ((per / m) if rate else (m / per) for m in medians)
        out.append((what, old_figure, new_figure, ratio))

    if "small" in results:
        row("small: wall s", "small", "seconds", 1)
        row("small: objects/s", "small", "seconds", small_count, rate=True)
        row("small: client CPU ms/object", "small", "cpu", small_count / 1e3)
    if "large" in results:
        size = results["large"]["old"][0]["bytes"]
        row("large: MB/s", "large", "seconds", size / 1e6, rate=True)
        row("large: client CPU s/GB", "large", "cpu", size / 1e9)
    if "checkpoint" in results:
        size = results["checkpoint"]["old"][0]["bytes"]
        for step in ("save", "load"):
            row(f"checkpoint.{step}: MB/s", "checkpoint", f"{step}_seconds", size / 1e6, rate=True)
            row(f"checkpoint.{step}: client CPU s/GB", "checkpoint", f"{step}_cpu", size / 1e9)
    if "map" in results:
        row("map: client CPU ms/object", "map", "cpu", small_count / 1e3)
        row("map: objects/s", "map", "seconds", small_count, rate=True)
        row("map: listing wall s", "map", "list_seconds", 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", type=Path, help="source tree of the old code")
    parser.add_argument("--new", type=Path, help="source tree of the new code")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="a tenth of the data, to check the script")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.old is None or args.new is None:
        parser.error("--old and --new are required")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for side, tree in trees.items():
        if not (tree / "torchdata_gcs" / "__init__.py").is_file():
            parser.error(f"--{side} {tree} holds no torchdata_gcs package")

    import google_crc32c

    from torchdata_gcs.testing import Emulator, GCSFront

    scale = 10 if args.quick else 1
    small_count = 2000 // scale
    load_at_start = _load()
    print(f"load average at start: {load_at_start}", flush=True)
    results: dict[str, dict[str, list[dict[str, float]]]] = {w: {"old": [], "new": []} for w in args.only}
    spec_file = Path(f"/tmp/code-ab-{os.getpid()}.json")
    with Emulator(backend="filesystem", memory_limit="8GiB") as emulator, GCSFront(emulator.endpoint) as front:
        manifests = {}
        sets = {
            SMALL_BUCKET: lambda: {f"small/{i:05d}.bin": os.urandom(100 * 1024) for i in range(small_count)},
            LARGE_BUCKET: lambda: {f"large/{i}.bin": os.urandom(256 * MiB // scale) for i in range(2)},
        }
        for bucket, make in sets.items():
            objects = make()
            emulator.seed(bucket, objects, concurrency=64)
            manifests[bucket] = {name: [len(data), google_crc32c.value(data)] for name, data in objects.items()}
            del objects
        emulator.create_bucket(CHECKPOINT_BUCKET)
        spec = {"endpoint": emulator.endpoint, "front": front.endpoint, "manifests": manifests, "scale": scale}
        spec_file.write_text(json.dumps(spec))
        try:
            for round_ in range(args.rounds):
                order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
                for workload in args.only:
                    for side in order:
                        result = run_child(trees[side], workload, spec_file, args.timeout)
                        results[workload][side].append(result)
                print(f"round {round_ + 1} of {args.rounds} done ({' then '.join(order)}), load {_load()}", flush=True)
        finally:
            spec_file.unlink(missing_ok=True)
    load_at_end = _load()
    print(f"load average at end: {load_at_end}")
    table = rows(results, small_count)
    print(f"\n{'what':36} {'old':>10} {'new':>10} {'new/old':>8} {'per round':>10}")
    for what, old, new, ratio in table:
        print(f"{what:36} {old:10.3f} {new:10.3f} {new / old:8.3f} {ratio:10.3f}")
    report = {
        "trees": {side: str(tree) for side, tree in trees.items()},
        "rounds": args.rounds,
        "quick": args.quick,
        "load_average": {"start": load_at_start, "end": load_at_end},
        "medians": [
            {"what": what, "old": old, "new": new, "median_round_ratio": ratio} for what, old, new, ratio in table
        ],
        "runs": results,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
