"""Packing small objects into WebDataset tar shards: ``torchdata_gcs.shards.pack`` against plain scripts.

    .bench-venv/bin/python -m benchmarks.pack [--runs 3] [--quick] [--json PATH]

Random objects in pairs (``000123.jpg``, ``000123.json``: one sample each pair) in the embedded emulator
(filesystem backend, bare: no latency added), packed into shards of ``--shard-mib`` by three setups, each run
a process of its own, the setups taking turns round after round: ours (``pack``, default settings); a
script as users write it with google-cloud-storage (list, ``download_as_bytes`` per object, ``tarfile`` into
a local file, ``upload_from_filename``); one with gcsfs (``find``, ``cat`` of a thousand paths at a time,
``tarfile``, ``put``). Every run's shards are read back with ``tarfile`` and checked (every member, in
name order, crc32c of its bytes). Prints objects/s per setup (the median over the runs), the goal (ours at
least 3x the google-cloud-storage script), then the JSON. ``--quick``: 2,000 objects, to check the rig.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KiB, MiB = 1024, 1024 * 1024
BUCKET = "bench-pack"
SETUPS = ("ours", "google-cloud-storage", "gcsfs")
GOAL = 3.0  # ours against the google-cloud-storage script, objects/s
GCSFS_BATCH = 1000  # paths per gcsfs cat call


class TarShards:
    """Shards as a plain script writes them: a local tar file filled in name order, a sample never split, each
    shard uploaded by ``upload(path, name)`` once the next sample would take it past ``limit`` bytes."""

    def __init__(self, folder: str, limit: int, upload: Any) -> None:
        self.folder, self.limit, self.upload = folder, limit, upload
        self.number, self.key, self.tar = 0, None, None
        self.path = os.path.join(folder, "shard.tar")

    def add(self, name: str, data: bytes) -> None:
        key = name.rpartition("/")[2].partition(".")[0]
        if self.tar is not None and key != self.key and self.tar.fileobj.tell() + len(data) + 2048 > self.limit:
            self.close()
        if self.tar is None:
            self.tar = tarfile.open(self.path, "w", format=tarfile.USTAR_FORMAT)
        self.key = key
        info = tarfile.TarInfo(name)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()
            self.upload(self.path, f"shard-{self.number:06d}.tar")
            self.number, self.tar = self.number + 1, None


def child(setup: str, spec_file: str) -> dict[str, Any]:
    """One run of ``setup``: its seconds (listing to the last shard published)."""
    spec = json.loads(Path(spec_file).read_text())
    endpoint, source, destination = spec["endpoint"], spec["source"], spec["destination"]
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # else gcsfs's gRPC call stalls on the emulator
    import gcsfs
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from torchdata_gcs import ClientConfig
    from torchdata_gcs.shards import pack

    started = time.perf_counter()  # imports done: each setup timed from its listing to its last shard published
    if setup == "ours":
        report = pack(
            f"gs://{BUCKET}/{source}",
            f"gs://{BUCKET}/{destination}",
            shard_size=spec["shard_bytes"],
            client=ClientConfig(endpoint=endpoint, anonymous=True),
        )
        assert report.objects == spec["objects"], report
    elif setup == "google-cloud-storage":
        client = storage.Client(
            project="bench", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
        )
        bucket = client.bucket(BUCKET)
        with tempfile.TemporaryDirectory() as folder:
            shards = TarShards(
                folder,
                spec["shard_bytes"],
                lambda path, name: bucket.blob(destination + name).upload_from_filename(path),
            )
            for blob in client.list_blobs(BUCKET, prefix=source):
                shards.add(blob.name[len(source) :], blob.download_as_bytes())
            shards.close()
    else:
        fs = gcsfs.GCSFileSystem(endpoint_url=endpoint, token="anon")
        paths = sorted(fs.find(f"{BUCKET}/{source}"))
        with tempfile.TemporaryDirectory() as folder:
            shards = TarShards(
                folder, spec["shard_bytes"], lambda path, name: fs.put(path, f"{BUCKET}/{destination}{name}")
            )
            for first in range(0, len(paths), GCSFS_BATCH):
                batch = paths[first : first + GCSFS_BATCH]
                data = fs.cat(batch)
                for path in batch:
                    shards.add(path[len(f"{BUCKET}/{source}") :], data[path])
            shards.close()
    return {"setup": setup, "seconds": time.perf_counter() - started}


def run_child(setup: str, spec_file: Path, timeout: float) -> dict[str, Any]:
    """``setup`` in a process of its own; its result, with the CPU it used."""
    command = [sys.executable, "-m", "benchmarks.pack", "--child", setup, str(spec_file)]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{setup} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["client_cpu_seconds"] = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return result


def check(emulator: Any, folder: str, expected: list[tuple[str, int]]) -> int:
    """Read every shard under ``folder`` back with tarfile: every object once, in name order, its bytes intact;
    how many shards there were."""
    import google_crc32c

    names = sorted(n for n in emulator.names(BUCKET) if n.startswith(folder) and n.endswith(".tar"))
    got = []
    for name in names:
        with tarfile.open(fileobj=io.BytesIO(emulator.read(BUCKET, name))) as tar:
            got += [(m.name, google_crc32c.value(tar.extractfile(m).read())) for m in tar.getmembers()]
    if got != expected:
        raise SystemExit(f"{folder}: {len(got)} members read back, {len(expected)} expected, or bytes differ")
    return len(names)


@contextlib.contextmanager
def _removed(folder: Path) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=20_000, help="objects (two per sample)")
    parser.add_argument("--size-kib", type=int, default=10)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3, help="runs of each setup; figures are their medians")
    parser.add_argument("--only", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--quick", action="store_true", help="2,000 objects, to check the rig")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.quick:
        args.objects = 2_000

    import google_crc32c

    from torchdata_gcs.testing import Emulator

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start: {load_at_start}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in args.only}
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="torchdata-gcs-pack-bench-"))
    with Emulator(backend="filesystem", memory_limit="8GiB") as emulator, _removed(work):
        expected = []
        for first in range(0, args.objects, 1000):  # seeded a thousand at a time
            objects = {}
            for i in range(first, min(first + 1000, args.objects)):
                name = f"{i // 2:06d}.{'jpg' if i % 2 == 0 else 'json'}"
                objects[f"src/{name}"] = os.urandom(args.size_kib * KiB)
                expected.append((name, google_crc32c.value(objects[f"src/{name}"])))
            emulator.seed(BUCKET, objects, concurrency=64)
        print(f"seeded {args.objects:,} objects in {time.perf_counter() - started:.1f} s", flush=True)
        spec_file = work / "spec.json"
        shard_counts: dict[str, int] = {}
        for round_ in range(args.runs):
            order = args.only[round_ % len(args.only) :] + args.only[: round_ % len(args.only)]
            for setup in order:
                destination = f"out/{setup}-{round_}/"
                spec = {"endpoint": emulator.endpoint, "source": "src/", "destination": destination}
                spec.update(shard_bytes=args.shard_mib * MiB, objects=args.objects)
                spec_file.write_text(json.dumps(spec))
                result = run_child(setup, spec_file, args.timeout)
                shard_counts[setup] = check(emulator, destination, expected)
                runs[setup].append(result)
                print(f"{setup}: {args.objects / result['seconds']:,.0f} objects/s", flush=True)
            print(f"round {round_ + 1} of {args.runs} done, load {[round(x, 2) for x in os.getloadavg()]}", flush=True)
    load_at_end = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for setup, results in runs.items():
        rates = [args.objects / r["seconds"] for r in results]
        rows.append(
            {
                "setup": setup,
                "objects_per_s": statistics.median(rates),
                "all_objects_per_s": [round(x, 1) for x in rates],
                "mb_per_s": statistics.median(rates) * args.size_kib * KiB / 1e6,
                "client_cpu_seconds": statistics.median(r["client_cpu_seconds"] for r in results),
                "shards": shard_counts[setup],
            }
        )
    by_setup = {row["setup"]: row for row in rows}
    command = "python -m benchmarks.pack" + (" --quick" if args.quick else "") + f" --runs {args.runs}"
    print(
        f"\n{args.objects:,} objects of {args.size_kib} KiB ({args.objects // 2:,} samples) into "
        f"{args.shard_mib} MiB shards, bare emulator, {args.runs} runs per setup; "
        f"{(time.perf_counter() - started) / 60:.1f} min; load average {load_at_start} at start, {load_at_end} at end"
    )
    print("| setup | objects/s (median) | runs | MB/s | client CPU s | shards |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        runs_text = ", ".join(f"{x:,.0f}" for x in r["all_objects_per_s"])
        print(
            f"| {r['setup']} | {r['objects_per_s']:,.0f} | {runs_text} | {r['mb_per_s']:,.1f} | "
            f"{r['client_cpu_seconds']:.1f} | {r['shards']} |"
        )
    goals = []
    for peer in ("google-cloud-storage", "gcsfs"):
        if "ours" in by_setup and peer in by_setup:
            ratio = by_setup["ours"]["objects_per_s"] / by_setup[peer]["objects_per_s"]
            goals.append({"peer": peer, "ratio": ratio, "goal": GOAL if peer == "google-cloud-storage" else None})
            verdict = ("met" if ratio >= GOAL else "missed") if peer == "google-cloud-storage" else "no goal"
            print(f"- ours against {peer}: {ratio:.2f}x ({verdict})")
    report = {
        "command": command,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}",
        "objects": args.objects,
        "object_bytes": args.size_kib * KiB,
        "shard_bytes": args.shard_mib * MiB,
        "load_average": {"start": load_at_start, "end": load_at_end},
        "rows": rows,
        "ratios": goals,
        "runs": runs,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
