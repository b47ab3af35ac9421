"""Many processes against one bucket whose request rate ramps as GCS's does: goodput and 429s.

    .bench-venv/bin/python -m benchmarks.scale --processes 1,2,4,8 --out /tmp/scale

Each row starts a fresh bucket limit (``RateRamp``: ``--reads`` object reads/s and ``--writes`` writes/s
to start, doubling after ``--period`` seconds of load near it) in front of the emulator, then N reader
processes (ranks x DataLoader workers each read their share) read small objects, every byte checked.
Goodput is objects per second over the time the readers ran; the allowed rate is the bucket's limit
integrated over that same time, as it ramped. Then N processes each save checkpoints through our
writer's compose strategy (every part an upload, then composes and deletes) under the write limit.
Peer: google-cloud-storage's ``download_as_bytes`` with its default retry, threads in each process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torchdata_gcs.testing import Emulator, GCSFront, RateRamp

OBJECT_SIZE = 1024

READER = r"""
import json, sys, time, zlib
spec = json.loads(sys.stdin.readline())
if spec["reader"] == "ours":
    from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe
    pipe = GCSFileLoaderIterDataPipe([f"gs://{spec['bucket']}/{n}" for n in spec["names"]],
                                     client=ClientConfig(endpoint=spec["endpoint"]))
    def read():
        for url, stream in pipe:
            yield url.rpartition(f"gs://{spec['bucket']}/")[2], stream.read()
    def counts():
        return {"retries": pipe.stats.retries, "throttled": pipe.stats.throttled}
else:
    from concurrent.futures import ThreadPoolExecutor
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    client = storage.Client(project="bench", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": spec["endpoint"]})
    bucket = client.bucket(spec["bucket"])
    def read():
        with ThreadPoolExecutor(spec["threads"]) as pool:
            yield from zip(spec["names"], pool.map(lambda n: bucket.blob(n).download_as_bytes(), spec["names"]))
    def counts():
        return {"retries": None, "throttled": None}
print("ready", flush=True)
sys.stdin.readline()
start, done, error, bad = time.monotonic(), 0, None, 0
try:
    for name, data in read():
        bad += data != (name.encode() * 1024)[: spec["size"]]
        done += 1
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps({"start": start, "end": time.monotonic(), "objects": done, "bad": bad, "error": error, **counts()}))
"""

WRITER = r"""
import json, sys, time
import torch
from torchdata_gcs import ClientConfig, WriteConfig, checkpoint
spec = json.loads(sys.stdin.readline())
client = ClientConfig(endpoint=spec["endpoint"])
state = {"w": torch.arange(spec["floats"], dtype=torch.float32) + spec["rank"]}
print("ready", flush=True)
sys.stdin.readline()
start, saved, error = time.monotonic(), 0, None
try:
    for step in range(spec["saves"]):
        url = f"gs://{spec['bucket']}/ckpt/rank{spec['rank']}/step{step}.pt"
        checkpoint.save(state, url, client=client, write=WriteConfig(strategy="compose", part_size=256 * 1024))
        assert torch.equal(checkpoint.load(url, client=client)["w"], state["w"])
        saved += 1
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps({"start": start, "end": time.monotonic(), "saved": saved, "error": error}))
"""


def content(name: str) -> bytes:
    return (name.encode() * OBJECT_SIZE)[:OBJECT_SIZE]


def run_processes(script: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start one process per spec, wait until every one is ready (imports done), start them together."""
    children = [
        subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in specs
    ]
    for child, spec in zip(children, specs, strict=True):
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(spec) + "\n")
        child.stdin.flush()
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()
    results = []
    for child in children:
        assert child.stdout is not None
        out = child.stdout.read()
        child.wait()
        results.append(json.loads(out) if child.returncode == 0 and out else {"error": f"exit {child.returncode}"})
    return results


def read_row(emulator: Emulator, args: argparse.Namespace, reader: str, processes: int) -> dict[str, Any]:
    bucket = f"scale-{reader}-{processes}-{time.monotonic_ns()}"
    names = [f"s/{i:06d}" for i in range(args.objects)]
    emulator.seed(bucket, {name: content(name) for name in names}, concurrency=32)
    ramp = RateRamp(reads=args.reads, writes=args.writes, period=args.period)
    with GCSFront(emulator.endpoint, rate_ramp=ramp) as front:
        specs = [
            {"reader": reader, "bucket": bucket, "endpoint": front.endpoint, "names": names[k::processes],
             "size": OBJECT_SIZE, "threads": args.threads}
            for k in range(processes)
        ]  # fmt: skip
        results = run_processes(READER, specs)
    ok = [r for r in results if "start" in r]
    start, end = min(r["start"] for r in ok), max(r["end"] for r in ok)
    objects = sum(r["objects"] for r in ok)
    allowed = ramp.allowed(bucket, start, end)
    refused, admitted = ramp.refused[(bucket, "read")], ramp.admitted[(bucket, "read")]
    return {
        "phase": "read", "reader": reader, "processes": processes, "objects": objects, "expected": args.objects,
        "seconds": end - start, "goodput": objects / (end - start), "allowed_rate": allowed / (end - start),
        "goodput_share": objects / allowed, "requests": refused + admitted, "share_429": refused / (refused + admitted),
        "failures": sum(r.get("error") is not None for r in results), "bad": sum(r.get("bad", 0) for r in ok),
        "retries": None if reader != "ours" else sum(r["retries"] for r in ok),
        "errors": sorted({r["error"] for r in results if r.get("error")}),
        "final_rate": ramp.rate(bucket),
    }  # fmt: skip


def write_row(emulator: Emulator, args: argparse.Namespace, processes: int) -> dict[str, Any]:
    bucket = f"scale-ckpt-{processes}-{time.monotonic_ns()}"
    emulator.create_bucket(bucket)
    ramp = RateRamp(reads=args.reads, writes=args.writes, period=args.period)
    with GCSFront(emulator.endpoint, rate_ramp=ramp) as front:
        specs = [
            {"bucket": bucket, "endpoint": front.endpoint, "rank": k, "saves": args.saves, "floats": args.floats}
            for k in range(processes)
        ]
        results = run_processes(WRITER, specs)
    ok = [r for r in results if "start" in r]
    start, end = min(r["start"] for r in ok), max(r["end"] for r in ok)
    refused, admitted = ramp.refused[(bucket, "write")], ramp.admitted[(bucket, "write")]
    allowed = ramp.allowed(bucket, start, end, write=True)
    return {
        "phase": "write", "reader": "ours", "processes": processes, "saved": sum(r["saved"] for r in ok),
        "expected": processes * args.saves, "seconds": end - start, "write_requests": admitted + refused,
        "goodput": admitted / (end - start), "allowed_rate": allowed / (end - start),
        "goodput_share": admitted / allowed, "share_429": refused / max(1, refused + admitted),
        "failures": sum(r.get("error") is not None for r in results),
        "errors": sorted({r["error"] for r in results if r.get("error")}),
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| phase | client | processes | done | seconds | goodput /s | allowed /s (ramp integrated) | goodput / allowed "
        "| requests | 429 share | retries | failures |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        client = "torchdata-gcs" if row["reader"] == "ours" else "google-cloud-storage"
        done = row["objects"] if row["phase"] == "read" else row["saved"]
        requests = row["requests"] if row["phase"] == "read" else row["write_requests"]
        retries = "-" if row.get("retries") is None else f"{row['retries']:,}"
        lines.append(
            f"| {row['phase']} | {client} | {row['processes']} | {done:,}/{row['expected']:,} | {row['seconds']:.1f} "
            f"| {row['goodput']:.0f} | {row['allowed_rate']:.0f} | {row['goodput_share']:.2f} | {requests:,} "
            f"| {row['share_429']:.1%} | {retries} | {row['failures']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2,4,8", help="process counts, comma-separated")
    parser.add_argument("--readers", default="ours,gcs", help="ours, gcs (google-cloud-storage)")
    parser.add_argument("--objects", type=int, default=6000, help="objects read in each row")
    parser.add_argument("--reads", type=float, default=300.0, help="a bucket's reads/s to start")
    parser.add_argument("--writes", type=float, default=60.0, help="a bucket's writes/s to start")
    parser.add_argument("--period", type=float, default=20.0, help="seconds of load near the limit to double it")
    parser.add_argument("--threads", type=int, default=16, help="google-cloud-storage threads per process")
    parser.add_argument("--saves", type=int, default=3, help="checkpoints each process saves")
    parser.add_argument("--floats", type=int, default=1 << 20, help="float32 values in each checkpoint")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--table", type=Path, help="print the table of an earlier run's scale.json, run nothing")
    args = parser.parse_args()
    if args.table is not None:
        print(table(json.loads(args.table.read_text())["rows"]))
        return
    rows = []
    with Emulator() as emulator:
        for processes in (int(p) for p in args.processes.split(",")):
            for reader in args.readers.split(","):
                rows.append(read_row(emulator, args, reader, processes))
                print(json.dumps(rows[-1]), flush=True)
            rows.append(write_row(emulator, args, processes))
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(
        json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
