"""Read a dataset from GCS through list -> shuffle -> sharding_filter -> load -> decode -> batch.

With no ``--bucket`` it starts the embedded emulator and seeds a small dataset of ``.npy`` samples
(features plus a class label in the object name); with ``--bucket gs://bucket/prefix/`` it reads the
``.npy`` objects found there with your Application Default Credentials. The pipeline runs in
``DataLoader2`` with worker processes and prints what it read.

    python examples/quickstart.py                # embedded emulator
    python examples/quickstart.py --workers 4 --samples 1000
    python examples/quickstart.py --bucket gs://my-bucket/dataset/
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import time
import warnings

import numpy as np
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import torchdata_gcs  # noqa: F401  (registers list_files_by_gcs and load_files_by_gcs)
from torchdata_gcs import ClientConfig
from torchdata_gcs.testing import Emulator

warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

CLASSES = ("cat", "dog", "bird")
FEATURES = 16


def make_sample(index: int) -> tuple[str, bytes]:
    """One synthetic sample: a float32 feature vector saved as .npy, its class in the name."""
    label = CLASSES[index % len(CLASSES)]
    features = np.random.default_rng(index).normal(loc=CLASSES.index(label), size=FEATURES).astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, features)
    return f"quickstart/{label}/{index:05d}.npy", buffer.getvalue()


def decode(item: tuple[str, io.BufferedIOBase]) -> tuple[str, torch.Tensor, int]:
    url, stream = item
    features = torch.from_numpy(np.load(stream))
    return url, features, CLASSES.index(url.rsplit("/", 2)[-2])


def collate(batch: list[tuple[str, torch.Tensor, int]]) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    urls, features, labels = zip(*batch)
    return list(urls), torch.stack(features), torch.tensor(labels)


def build_pipeline(prefix: str, client: ClientConfig, batch_size: int):
    return (
        IterableWrapper([prefix])
        .list_files_by_gcs(masks="*.npy", client=client)
        .shuffle()
        .sharding_filter()
        .load_files_by_gcs(client=client)
        .map(decode)
        .batch(batch_size)
        .map(collate)
    )


def run(prefix: str, client: ClientConfig, workers: int, batch_size: int, expected: int | None) -> None:
    pipe = build_pipeline(prefix, client, batch_size)
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=workers))
    seen: collections.Counter[str] = collections.Counter()
    per_class: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    try:
        for number, (urls, features, labels) in enumerate(loader):
            seen.update(urls)
            per_class.update(CLASSES[label] for label in labels.tolist())
            if number < 3:
                print(f"batch {number}: {tuple(features.shape)} features, labels {labels.tolist()[:8]}..., first {urls[0]}")
    finally:
        loader.shutdown()
    elapsed = time.perf_counter() - start
    total = sum(seen.values())
    print(f"read {total} samples ({len(seen)} distinct) with {workers} workers in {elapsed:.2f}s ({total / elapsed:.0f} samples/s)")
    print("per class: " + ", ".join(f"{name}={per_class[name]}" for name in CLASSES))
    if expected is not None:
        exactly_once = len(seen) == expected and max(seen.values()) == 1
        print(f"every sample exactly once: {exactly_once}")
        if not exactly_once:
            raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", help="gs://bucket/prefix/ to read; default: a seeded embedded emulator")
    parser.add_argument("--samples", type=int, default=600, help="samples to seed in the emulator")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader2 worker processes")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    if args.bucket:
        run(args.bucket, ClientConfig(), args.workers, args.batch_size, expected=None)
        return
    with contextlib.ExitStack() as stack:
        emulator = stack.enter_context(Emulator())
        started = time.perf_counter()
        emulator.seed("quickstart-data", [make_sample(i) for i in range(args.samples)])
        print(f"embedded emulator at {emulator.endpoint}: seeded {args.samples} samples in {time.perf_counter() - started:.2f}s")
        run("gs://quickstart-data/quickstart/", emulator.client_config, args.workers, args.batch_size, args.samples)


if __name__ == "__main__":
    main()
