"""Small-object read throughput on the embedded emulator: load_files_by_gcs next to its peers.

Seeds N objects of SIZE bytes into a fake-gcs-server (filesystem backend, RAM-backed), then reads
every object with each reader, checks every byte, and reports objects/s (median of the runs) and
the ratio to the plain google-cloud-storage loop. A bare urllib3 loop (no auth, checks or retries)
shows how much of the time is the client's own per-request work. No latency is added: on loopback
the client's per-request cost dominates, which is what this measures.

    python benchmarks/small_objects.py --objects 2000 --size 102400 --runs 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from urllib.parse import quote

import urllib3
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from torchdata_gcs import GCSFileLoaderIterDataPipe, TransferConfig
from torchdata_gcs.testing import Emulator

BUCKET = "bench-small"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--size", type=int, default=100 * 1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16, help="concurrency for the concurrent readers")
    args = parser.parse_args()

    with Emulator(backend="filesystem") as emulator:
        objects = {f"small/{i:06d}.bin": os.urandom(args.size) for i in range(args.objects)}
        started = time.perf_counter()
        emulator.seed(BUCKET, objects, concurrency=32)
        print(f"seeded {args.objects} x {args.size} B in {time.perf_counter() - started:.1f}s")
        names = sorted(objects)
        urls = [f"gs://{BUCKET}/{name}" for name in names]
        gcs = storage.Client(
            project="bench", credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator.endpoint}
        )
        bucket = gcs.bucket(BUCKET)

        def gcs_loop() -> list[bytes]:
            return [bucket.blob(name).download_as_bytes() for name in names]

        def gcs_threads() -> list[bytes]:
            with ThreadPoolExecutor(args.threads) as pool:
                return list(pool.map(lambda name: bucket.blob(name).download_as_bytes(), names))

        raw_pool = urllib3.PoolManager(maxsize=1)

        def raw_loop() -> list[bytes]:
            base = f"{emulator.endpoint}/download/storage/v1/b/{BUCKET}/o/"
            return [raw_pool.request("GET", base + quote(name, safe="") + "?alt=media").data for name in names]

        def ours() -> list[bytes]:
            transfer = TransferConfig(max_in_flight=args.threads)
            pipe = GCSFileLoaderIterDataPipe(urls, client=emulator.client_config, transfer=transfer)
            return [stream.read() for _, stream in pipe]

        readers: dict[str, Callable[[], list[bytes]]] = {
            f"google-cloud-storage {version('google-cloud-storage')} download_as_bytes loop": gcs_loop,
            f"google-cloud-storage {version('google-cloud-storage')} in {args.threads} threads": gcs_threads,
            f"torchdata-gcs {version('torchdata-gcs')} load_files_by_gcs, {args.threads} in flight": ours,
            f"reference: bare urllib3 {version('urllib3')} GET loop, no checks or retries": raw_loop,
        }
        expected = [objects[name] for name in names]
        rates: dict[str, float] = {}
        for label, reader in readers.items():
            samples = []
            for _ in range(args.runs):
                started = time.perf_counter()
                got = reader()
                samples.append(args.objects / (time.perf_counter() - started))
                if got != expected:
                    raise SystemExit(f"{label} returned wrong bytes")
            rates[label] = statistics.median(samples)

    baseline = next(iter(rates.values()))
    print(f"\n{args.objects} objects x {args.size} B, median of {args.runs} runs, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, bare emulator on loopback (no added latency)\n")
    print("| reader | objects/s | MB/s | vs loop |")
    print("| --- | ---: | ---: | ---: |")
    for label, rate in rates.items():
        print(f"| {label} | {rate:,.0f} | {rate * args.size / 1e6:,.1f} | {rate / baseline:.2f}x |")


if __name__ == "__main__":
    main()
