"""Reading WebDataset tar shards: ``ShardDataset`` against webdataset over gcsfs and our whole-object reader.

    .bench-venv/bin/python -m benchmarks.shards [--runs 3] [--quick] [--json PATH] [--profile SETUP]

``--shards`` tar shards (``tarfile``, USTAR; ``--samples`` in all, each a ``.jpg`` of 196-220 KiB of random
bytes and a small ``.json``) in the embedded emulator (filesystem backend, bare); their indexes are made before
any timing by one untimed ``ShardDataset`` (each shard read once). Each setup's run is a process of its own
iterating the dataset directly (no DataLoader, no workers), the setups taking turns round after round: ours
shuffled (``shuffle_buffer=1000, shards_open=4``), ours in order (``shuffle=False, shards_open=1``), the DataPipe
``read_shards_by_gcs``, webdataset with ``gs://`` opened by gcsfs (default cache or ``cache_type="readahead"``;
all shards shuffled, ``.shuffle(1000)``), and the shards read whole by ``load_files_by_gcs`` (ours' ceiling).
Every sample's members (every whole shard) are checked by crc32c against values computed when seeding, in the
timed loop; MB/s counts the shards' bytes. Prints the medians, the goals (ours shuffled at least 0.9x the whole
reads' MB/s and 2x webdataset's), then the JSON. ``--quick``: a tenth of the samples, to check the rig.
``--profile SETUP``: one more untimed run of it under py-spy (raw stacks, every thread, idle too), in $TMPDIR.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KiB, MiB = 1024, 1024 * 1024
BUCKET = "bench-shards"
PREFIX = "shards/"
SETUPS = (
    "ours shuffled",
    "ours in order",
    "read_shards_by_gcs",
    "webdataset + gcsfs",
    "webdataset + gcsfs readahead",
    "load_files_by_gcs",
)
RAW_GOAL = 0.9  # ours shuffled against the whole-object reads, MB/s
PEER_GOAL = 2.0  # ours shuffled against webdataset over gcsfs, MB/s


def make_shard(first: int, count: int, rng: random.Random) -> tuple[bytes, dict[str, list[int]]]:
    """One tar shard of samples ``first`` to ``first + count``, and each sample's expected member crc32c."""
    import google_crc32c

    out, expected = io.BytesIO(), {}
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for number in range(first, first + count):
            key = f"{number:06d}"
            image = os.urandom(rng.randint(196 * KiB, 220 * KiB))
            label = json.dumps({"key": key, "label": number % 1000, "bytes": len(image)}).encode()
            for extension, data in (("jpg", image), ("json", label)):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
            expected[key] = [google_crc32c.value(image), google_crc32c.value(label)]
    return out.getvalue(), expected


def _ours_shuffled(spec: dict[str, Any], client: Any) -> Any:
    from torchdata_gcs.shards import ShardDataset

    return ShardDataset(f"gs://{BUCKET}/{PREFIX}", shuffle=True, shuffle_buffer=1000, shards_open=4, client=client)


def _ours_in_order(spec: dict[str, Any], client: Any) -> Any:
    from torchdata_gcs.shards import ShardDataset

    return ShardDataset(f"gs://{BUCKET}/{PREFIX}", shuffle=False, shards_open=1, client=client)


def _datapipe(spec: dict[str, Any], client: Any) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    import torchdata_gcs  # noqa: F401  # registers read_shards_by_gcs

    return IterableWrapper(spec["urls"]).read_shards_by_gcs(client=client)


def _webdataset(spec: dict[str, Any], client: Any, **options: Any) -> Any:
    """webdataset as its users point it at GCS through fsspec: the ``gs`` scheme opened by gcsfs (``options``
    for ``open``; none: gcsfs's default cache, fsspec's adaptive read-ahead)."""
    import gcsfs
    import webdataset as wds

    fs = gcsfs.GCSFileSystem(endpoint_url=spec["endpoint"], token="anon", project="bench")

    def gopen_gcsfs(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        return fs.open(url, mode, **options)

    wds.gopen_schemes["gs"] = gopen_gcsfs
    return wds.WebDataset(spec["urls"], shardshuffle=len(spec["urls"]), seed=0).shuffle(1000)


SHARD_READERS = {
    "ours shuffled": _ours_shuffled,
    "ours in order": _ours_in_order,
    "read_shards_by_gcs": _datapipe,
    "webdataset + gcsfs": _webdataset,
    # fsspec's plain read-ahead: tarfile's 10 KiB reads served from the block without a hop to fsspec's loop
    "webdataset + gcsfs readahead": lambda spec, client: _webdataset(spec, client, cache_type="readahead"),
}


def child(setup: str, spec_file: str) -> dict[str, Any]:
    """One run of ``setup``: seconds from making the dataset to its last sample checked."""
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # else gcsfs's gRPC call stalls on the emulator
    import gcsfs  # noqa: F401  # every setup's process has imported the same libraries
    import google_crc32c
    import torch  # noqa: F401
    import webdataset  # noqa: F401

    from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe

    spec = json.loads(Path(spec_file).read_text())
    client = ClientConfig(endpoint=spec["endpoint"], anonymous=True)
    value = google_crc32c.value
    check = 0.0
    if setup == "load_files_by_gcs":
        expected_objects = {url: crc for url, crc in zip(spec["urls"], spec["shard_crc32c"], strict=True)}
        started, cpu = time.perf_counter(), time.process_time()
        for url, stream in GCSFileLoaderIterDataPipe(spec["urls"], client=client):
            data = stream.read()
            checking = time.perf_counter()
            if value(data) != expected_objects.pop(url):
                raise SystemExit(f"{setup}: {url} does not hold the bytes seeded")
            check += time.perf_counter() - checking
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        if expected_objects:
            raise SystemExit(f"{setup}: {len(expected_objects)} shards not read")
        return {"setup": setup, "seconds": seconds, "timed_cpu_seconds": cpu, "check_seconds": check, "samples": 0}
    expected = spec["expected"]
    started, cpu = time.perf_counter(), time.process_time()
    dataset = SHARD_READERS[setup](spec, client)
    seen: set[str] = set()
    adjacent, previous = 0, -2
    for sample in dataset:
        checking = time.perf_counter()
        key = sample["__key__"]
        if [value(sample["jpg"]), value(sample["json"])] != expected.get(key) or key in seen:
            raise SystemExit(f"{setup}: sample {key} is wrong, unknown or seen twice")
        seen.add(key)
        number = int(key)
        adjacent += number == previous + 1
        previous = number
        check += time.perf_counter() - checking
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if len(seen) != len(expected):
        raise SystemExit(f"{setup}: {len(expected) - len(seen)} samples missing")
    # how often a sample followed the one before it in the shards: 1 in order, near 0 shuffled
    return {
        "setup": setup,
        "seconds": seconds,
        "timed_cpu_seconds": cpu,
        "check_seconds": check,
        "samples": len(seen),
        "adjacent": adjacent / max(len(seen) - 1, 1),
    }


def run_child(setup: str, spec_file: Path, timeout: float, emulator: Any) -> dict[str, Any]:
    """``setup`` in a process of its own; its result, with the CPU it used (imports included) and the
    emulator's meanwhile (fake-gcs-server's own, not its name guard's)."""
    server = emulator.cpu_seconds()
    command = [sys.executable, "-m", "benchmarks.shards", "--child", setup, str(spec_file)]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{setup} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["client_cpu_seconds"] = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    result["emulator_cpu_seconds"] = emulator.cpu_seconds() - server
    return result


def profile_child(setup: str, spec_file: Path, out: Path, timeout: float) -> None:
    """One untimed run of ``setup`` under py-spy: raw collapsed stacks, every thread, idle ones included."""
    spy = Path(sys.executable).with_name("py-spy")
    command = [str(spy), "record", "--format", "raw", "--idle", "--threads", "--rate", "200", "-o", str(out)]
    command += ["--", sys.executable, "-m", "benchmarks.shards", "--child", setup, str(spec_file)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"profiling {setup} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))
    print(f"profile of {setup}: {out} ({result['seconds']:.2f} s profiled)", flush=True)


def seed(emulator: Any, shards: int, per_shard: int) -> dict[str, Any]:
    """The shards written to the emulator; what each child needs to check them."""
    import google_crc32c

    rng = random.Random(0)
    expected: dict[str, list[int]] = {}
    urls, crcs, sizes = [], [], []
    for shard in range(shards):
        data, members = make_shard(shard * per_shard, per_shard, rng)
        name = f"{PREFIX}shard-{shard:06d}.tar"
        emulator.seed(BUCKET, {name: data})
        expected.update(members)
        urls.append(f"gs://{BUCKET}/{name}")
        crcs.append(google_crc32c.value(data))
        sizes.append(len(data))
    return {
        "endpoint": emulator.endpoint,
        "urls": urls,
        "shard_crc32c": crcs,
        "shard_bytes": sizes,
        "expected": expected,
    }


def make_indexes(endpoint: str) -> int:
    """Each shard's index, made by reading it once (``ShardDataset`` writes it beside the shard)."""
    from torchdata_gcs import ClientConfig
    from torchdata_gcs.shards import ShardDataset

    dataset = ShardDataset(f"gs://{BUCKET}/{PREFIX}", client=ClientConfig(endpoint=endpoint, anonymous=True))
    return dataset.samples


def summarize(runs: dict[str, list[dict[str, Any]]], data_bytes: int, samples: int) -> list[dict[str, Any]]:
    rows = []
    for setup, results in runs.items():
        seconds = [r["seconds"] for r in results]
        rows.append(
            {
                "setup": setup,
                "mb_per_s": statistics.median(data_bytes / 1e6 / s for s in seconds),
                "all_mb_per_s": [round(data_bytes / 1e6 / s, 1) for s in seconds],
                "samples_per_s": statistics.median(samples / s for s in seconds) if results[0]["samples"] else None,
                "seconds": statistics.median(seconds),
                "check_seconds": statistics.median(r["check_seconds"] for r in results),
                "client_cpu_seconds": statistics.median(r["client_cpu_seconds"] for r in results),
                "timed_cpu_seconds": statistics.median(r["timed_cpu_seconds"] for r in results),
                "emulator_cpu_seconds": statistics.median(r["emulator_cpu_seconds"] for r in results),
                "adjacent": results[0].get("adjacent"),
            }
        )
    return rows


def goals(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each setup against the whole reads and webdataset: the ratio of the medians, and the median of each
    round's own ratio (the setups of a round ran within a minute or two, under about the same load)."""
    out = []
    for ours in ("ours shuffled", "ours in order", "read_shards_by_gcs"):
        for peer, goal in (
            ("load_files_by_gcs", RAW_GOAL),
            ("webdataset + gcsfs", PEER_GOAL),
            ("webdataset + gcsfs readahead", None),
        ):
            if ours not in runs or peer not in runs:
                continue
            mine, theirs = [r["seconds"] for r in runs[ours]], [r["seconds"] for r in runs[peer]]
            ratio = statistics.median(theirs) / statistics.median(mine)
            per_round = statistics.median(t / m for m, t in zip(mine, theirs, strict=True))
            row = {"setup": ours, "against": peer, "ratio": ratio, "median_round_ratio": per_round}
            if ours == "ours shuffled" and goal is not None:
                row.update(goal=goal, met=ratio >= goal)
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples", type=int, default=10_000, help="samples in all, split evenly over the shards")
    parser.add_argument("--runs", type=int, default=3, help="runs of each setup; figures are their medians")
    parser.add_argument("--only", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--quick", action="store_true", help="a tenth of the samples, to check the rig")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument("--profile", choices=SETUPS, help="after the runs, one untimed run of this under py-spy")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.quick:
        args.samples //= 10

    from torchdata_gcs.testing import Emulator

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start: {load_at_start}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in args.only}
    loads = []
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="torchdata-gcs-shards-bench-"))
    try:
        with Emulator(backend="filesystem", memory_limit="8GiB") as emulator:
            spec = seed(emulator, args.shards, args.samples // args.shards)
            data_bytes, samples = sum(spec["shard_bytes"]), len(spec["expected"])
            print(
                f"seeded {args.shards} shards, {samples:,} samples, {data_bytes / MiB:,.0f} MiB "
                f"in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
            indexing = time.perf_counter()
            assert make_indexes(emulator.endpoint) == samples
            index_seconds = time.perf_counter() - indexing
            print(f"indexes made in {index_seconds:.1f} s (untimed)", flush=True)
            spec_file = work / "spec.json"
            spec_file.write_text(json.dumps(spec))
            for round_ in range(args.runs):
                order = args.only[round_ % len(args.only) :] + args.only[: round_ % len(args.only)]
                for setup in order:
                    result = run_child(setup, spec_file, args.timeout, emulator)
                    runs[setup].append(result)
                    print(f"{setup}: {data_bytes / 1e6 / result['seconds']:,.1f} MB/s", flush=True)
                loads.append([round(x, 2) for x in os.getloadavg()])
                print(f"round {round_ + 1} of {args.runs} done, load {loads[-1]}", flush=True)
            if args.profile:
                slug = "-".join(args.profile.replace("+", " ").split())
                profile_child(args.profile, spec_file, work.parent / f"shards-profile-{slug}.txt", args.timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_at_end = [round(x, 2) for x in os.getloadavg()]
    rows = summarize(runs, data_bytes, samples)
    met = goals(runs)
    command = "python -m benchmarks.shards" + (" --quick" if args.quick else "") + f" --runs {args.runs}"
    print(
        f"\n{args.shards} shards, {samples:,} samples, {data_bytes / MiB:,.0f} MiB, bare emulator, one process "
        f"(no DataLoader workers), {args.runs} runs per setup; {(time.perf_counter() - started) / 60:.1f} min; "
        f"load average {load_at_start} at start, {load_at_end} at end"
    )
    print("| setup | MB/s (median) | runs | samples/s | s | checks s | client CPU s | emulator CPU s | in order |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        runs_text = ", ".join(f"{x:,.0f}" for x in r["all_mb_per_s"])
        rate = f"{r['samples_per_s']:,.0f}" if r["samples_per_s"] else "-"
        adjacent = f"{r['adjacent']:.3f}" if r["adjacent"] is not None else "-"
        print(
            f"| {r['setup']} | {r['mb_per_s']:,.1f} | {runs_text} | {rate} | {r['seconds']:.2f} | "
            f"{r['check_seconds']:.2f} | {r['timed_cpu_seconds']:.1f} | {r['emulator_cpu_seconds']:.1f} | {adjacent} |"
        )
    for g in met:
        verdict = f"goal {g['goal']}x, {'met' if g['met'] else 'missed'}" if "goal" in g else "no goal"
        print(
            f"- {g['setup']} against {g['against']}: {g['ratio']:.2f}x "
            f"(median of each round's own {g['median_round_ratio']:.2f}x; {verdict})"
        )
    report = {
        "command": command,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}",
        "versions": _versions(),
        "shards": args.shards,
        "samples": samples,
        "data_bytes": data_bytes,
        "index_seconds": index_seconds,
        "load_average": {"start": load_at_start, "rounds": loads, "end": load_at_end},
        "rows": rows,
        "ratios": met,
        "runs": runs,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("torchdata-gcs", "torch", "gcsfs", "webdataset", "google-crc32c")}


if __name__ == "__main__":
    main()
