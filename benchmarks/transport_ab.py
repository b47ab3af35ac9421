"""Media reads over aiohttp against the wire transport, alternating, same code otherwise.

    .bench-venv/bin/python -m benchmarks.transport_ab [--rounds 5] [--quick]

Seeds the emulator with the benchmark's objects (3 x 256 MiB, 2,000 x 100 KiB), then runs
``load_files_by_gcs`` (default settings) on each set in a process of its own, once with media reads on
aiohttp and once on the wire transport, per round, the order swapped every round; large objects
straight from the emulator, small ones straight and through HAProxy with 20 ms added. Each run's bytes
are checked (length and crc32c). Prints wall time, throughput and the reader's CPU (user + system),
with medians and the ratio of the wire transport's to aiohttp's.
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

import google_crc32c

from torchdata_gcs.testing import Emulator, LatencyFront

MiB = 1024 * 1024


def child(endpoint: str, bucket: str, transport: str, manifest_file: str) -> None:
    """One run: read every object of ``bucket``, print seconds and CPU seconds as JSON."""
    from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe
    from torchdata_gcs._transport.session import session_for

    manifest = json.loads(Path(manifest_file).read_text())
    config = ClientConfig(endpoint=endpoint, anonymous=True)
    session = session_for(config)
    if transport == "aiohttp":
        session.media = session.transport
    urls = [f"gs://{bucket}/{name}" for name in manifest]
    times, started = os.times(), time.perf_counter()
    got = {url.split("/", 3)[3]: stream.read() for url, stream in GCSFileLoaderIterDataPipe(urls, client=config)}
    seconds, after = time.perf_counter() - started, os.times()
    for name, (size, crc) in manifest.items():
        assert len(got[name]) == size and google_crc32c.value(got[name]) == crc, name
    cpu = after.user + after.system - times.user - times.system
    print(json.dumps({"seconds": seconds, "cpu": cpu}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a tenth of the data")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    scale = 10 if args.quick else 1
    sets = {
        "bench-ab-large": {f"large/{i}.bin": os.urandom(256 * MiB // scale) for i in range(3)},
        "bench-ab-small": {f"small/{i:05d}.bin": os.urandom(100 * 1024) for i in range(2000 // scale)},
    }
    with (
        Emulator(backend="filesystem", memory_limit="8GiB") as emulator,
        LatencyFront(emulator.endpoint, latency=0.020) as slow,
    ):
        manifests = {}
        for bucket, objects in sets.items():
            emulator.create_bucket(bucket)
            emulator.seed(bucket, objects, concurrency=64)
            manifests[bucket] = Path(f"/tmp/{bucket}-{os.getpid()}.json")
            manifests[bucket].write_text(json.dumps({n: [len(d), google_crc32c.value(d)] for n, d in objects.items()}))
        del sets
        cases = [
            ("large, 0 ms", emulator.endpoint, "bench-ab-large"),
            ("small, 0 ms", emulator.endpoint, "bench-ab-small"),
            ("small, 20 ms", slow.endpoint, "bench-ab-small"),
        ]
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for round_ in range(args.rounds):
            order = ("aiohttp", "wire") if round_ % 2 == 0 else ("wire", "aiohttp")
            for case, endpoint, bucket in cases:
                for transport in order:
                    command = [sys.executable, "-m", "benchmarks.transport_ab", "--child"]
                    out = subprocess.run(
                        [*command, endpoint, bucket, transport, str(manifests[bucket])],
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                    results.setdefault((case, transport), []).append(json.loads(out.splitlines()[-1]))
            print(f"round {round_ + 1} done", flush=True)
        for path in manifests.values():
            path.unlink()
    for case, _, bucket in cases:
        objects = 3 if "large" in bucket else 2000 // scale
        total = (3 * 256 * MiB // scale) if "large" in bucket else (2000 // scale) * 100 * 1024
        medians = {}
        for transport in ("aiohttp", "wire"):
            runs = results[(case, transport)]
            seconds = statistics.median(run["seconds"] for run in runs)
            cpu = statistics.median(run["cpu"] for run in runs)
            medians[transport] = (seconds, cpu)
            per = f"{cpu / (total / 1e9):.3f} CPU s/GB" if "large" in bucket else f"{cpu / objects * 1000:.3f} CPU s/1k"
            rate = f"{total / seconds / 1e6:,.0f} MB/s" if "large" in bucket else f"{objects / seconds:,.0f} objects/s"
            print(
                f"{case:13} {transport:8} median {seconds:.3f} s ({rate}), {per}; all: "
                + " ".join(f"{run['seconds']:.3f}/{run['cpu']:.2f}" for run in runs)
            )
        speed = medians["aiohttp"][0] / medians["wire"][0]
        cpu_ratio = medians["wire"][1] / medians["aiohttp"][1]
        print(f"{case:13} wire/aiohttp: speed {speed:.2f}x, CPU {cpu_ratio:.2f}x")


if __name__ == "__main__":
    main()
