"""Train an image classifier on small objects in GCS, checkpointing every epoch; a rerun resumes.

With no ``--bucket`` it starts the embedded emulator (objects kept in ``--data-dir``, so a rerun finds
the dataset and checkpoints again) and seeds PNG images of four shapes, their class in the name; with
``--bucket gs://bucket/prefix`` it uses that bucket with Application Default Credentials (``--seed``
writes the dataset there first). Each epoch reads list -> shuffle -> sharding_filter -> compose (or
load) -> decode -> batch in DataLoader2 workers, trains a small CNN, saves a zstd checkpoint and ends
with a summary. Under ``torchrun`` each rank reads its own share, gradients are averaged (DDP) and
checkpoints go through ``torch.distributed.checkpoint``. README's first command runs it; it needs
``pip install 'torchdata-gcs[emulator,examples,dataloader2]'``.

    python examples/train.py                                  # embedded emulator, 3 epochs; again: resumes
    torchrun --nproc_per_node 2 examples/train.py --data-dir .emulator-ddp
    python examples/train.py --bucket gs://my-bucket/shapes --seed
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data.datapipes.iter import IterableWrapper
from tqdm import tqdm

import torchdata_gcs  # noqa: F401  (registers the functional DataPipes)
from torchdata_gcs import ClientConfig, WriteConfig, checkpoint
from torchdata_gcs.dcp import GCSStorageReader, GCSStorageWriter
from torchdata_gcs.testing import Emulator

warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # DCP in a single process
try:
    from torchdata.dataloader2 import (
        DataLoader2,
        DistributedReadingService,
        MultiProcessingReadingService,
        SequentialReadingService,
    )
except ImportError as missing:  # torchdata 0.10 and later have no DataLoader2
    raise SystemExit(
        f"examples/train.py runs in DataLoader2, which torchdata 0.9 is the last to have ({missing}): "
        "pip install 'torchdata-gcs[dataloader2]'"
    ) from missing

CLASSES = ("circle", "square", "triangle", "cross")
SIZE = 32


# -- the dataset --------------------------------------------------------------------------------------------


def draw(index: int) -> tuple[str, bytes]:
    """Image ``index``: one shape of a random colour, size and place on a noisy background, as PNG."""
    rng = np.random.default_rng(index)
    label = CLASSES[index % len(CLASSES)]
    pixels = rng.integers(0, 80, (SIZE, SIZE, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    pen = ImageDraw.Draw(image)
    radius = int(rng.integers(6, 12))
    x, y = (int(v) for v in rng.integers(radius, SIZE - radius, 2))
    colour = tuple(int(v) for v in rng.integers(120, 256, 3))
    box = (x - radius, y - radius, x + radius, y + radius)
    if label == "circle":
        pen.ellipse(box, fill=colour)
    elif label == "square":
        pen.rectangle(box, fill=colour)
    elif label == "triangle":
        pen.polygon([(x, y - radius), (x - radius, y + radius), (x + radius, y + radius)], fill=colour)
    else:
        pen.line((x - radius, y, x + radius, y), fill=colour, width=3)
        pen.line((x, y - radius, x, y + radius), fill=colour, width=3)
    encoded = io.BytesIO()
    image.save(encoded, format="PNG")
    return f"{label}/{index:06d}.png", encoded.getvalue()


def decode(item: tuple[str, Any]) -> tuple[str, torch.Tensor, int, int]:
    """``(url, image tensor, label, bytes read)`` from a loaded PNG."""
    url, stream = item
    data = stream.read()
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32) / 255.0
    return url, torch.from_numpy(pixels).permute(2, 0, 1), CLASSES.index(url.rsplit("/", 2)[-2]), len(data)


def collate(batch: list[tuple[str, torch.Tensor, int, int]]) -> dict[str, Any]:
    urls, images, labels, sizes = zip(*batch, strict=True)
    return {"urls": list(urls), "images": torch.stack(images), "labels": torch.tensor(labels), "bytes": sum(sizes)}


@dataclasses.dataclass
class WithStats:
    """Attaches the loader's counters (requests, retries, ...) of this worker to each batch, so the main
    process can add them up across worker processes."""

    loader: Any

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, "worker": os.getpid(), "stats": dataclasses.asdict(self.loader.stats)}


def pipeline(images: str, client: ClientConfig, args: argparse.Namespace, manifest: str | None) -> Any:
    listed = IterableWrapper([images]).list_files_by_gcs(
        masks="*.png", with_metadata=True, client=client, manifest=manifest
    )
    shuffled = listed.shuffle(buffer_size=100_000).sharding_filter()
    if args.reader == "compose":
        loaded = shuffled.compose_shards_by_gcs(client=client)
    else:
        loaded = shuffled.load_files_by_gcs(client=client)
    return loaded.map(decode).batch(args.batch_size).collate(collate).map(WithStats(loaded))


# -- the model ----------------------------------------------------------------------------------------------


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, len(CLASSES)),
    )  # fmt: skip


# -- the job ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Totals:
    samples: int = 0
    bytes: int = 0
    seconds: float = 0.0
    requests: int = 0
    retries: int = 0
    throttled: int = 0
    composes: int = 0
    checkpoints: list[tuple[str, int, float]] = dataclasses.field(default_factory=list)  # url, size, seconds


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def from_rank_zero(value: Any) -> Any:
    """Rank 0's ``value``, on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def say(message: str) -> None:
    if rank() == 0:
        print(message, flush=True)


def train_epoch(
    loader: DataLoader2, net: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, totals: Totals
) -> tuple[float, float, Counter[str]]:
    """One pass over this rank's share; mean loss, accuracy and the URLs read."""
    seen: Counter[str] = Counter()
    last_stats: dict[int, dict[str, Any]] = {}
    loss_sum = correct = count = 0.0
    started = time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", disable=rank() != 0, leave=False)
    for batch in bar:
        optimizer.zero_grad()
        logits = net(batch["images"])
        loss = nn.functional.cross_entropy(logits, batch["labels"])
        loss.backward()
        optimizer.step()
        size = len(batch["urls"])
        loss_sum += loss.item() * size
        correct += (logits.argmax(1) == batch["labels"]).sum().item()
        count += size
        seen.update(batch["urls"])
        totals.bytes += batch["bytes"]
        last_stats[batch["worker"]] = batch["stats"]
        bar.set_postfix(loss=f"{loss_sum / count:.3f}", acc=f"{correct / count:.2f}")
    totals.seconds += time.perf_counter() - started
    totals.samples += int(count)
    for stats in last_stats.values():  # each worker's counters are for this epoch
        totals.requests += stats["requests"]
        totals.retries += stats["retries"]
        totals.throttled += stats["throttled"]
        totals.composes += stats["composes"]
    return loss_sum / max(count, 1), correct / max(count, 1), seen


def latest_checkpoint(folder: str, client: ClientConfig) -> tuple[int, str] | None:
    """The highest epoch saved under ``folder`` and its URL (a file, or a DCP folder's ``.metadata``)."""
    found = []
    for url in IterableWrapper([folder]).list_files_by_gcs(client=client, allow_empty=True):  # none on a first run
        name = url[len(folder) :]
        if name.startswith("epoch-") and name.endswith((".pt", "/.metadata")):
            found.append((int(name[len("epoch-") :].split(".")[0].split("/")[0]), url))
    return max(found, default=None)


def save_checkpoint(folder: str, epoch: int, net: nn.Module, optimizer: torch.optim.Optimizer, history: list[Any],
                    client: ClientConfig, strategy: str, totals: Totals) -> None:  # fmt: skip
    started = time.perf_counter()
    if dist.is_initialized():  # every rank writes its part; replicated tensors once
        url = f"{folder}epoch-{epoch:04d}"
        # DCP flattens nested containers into keys; the history travels as one JSON string instead
        state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "history": json.dumps(history)}
        dcp.save(state, storage_writer=GCSStorageWriter(url, client=client, write=WriteConfig(strategy=strategy)))
        size = sum(
            info.size for _, info in IterableWrapper([url + "/"]).list_files_by_gcs(client=client, with_metadata=True)
        )
    else:
        url = f"{folder}epoch-{epoch:04d}.pt"
        state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "history": history}
        saved = IterableWrapper([(url, state)]).save_by_gcs(
            client=client, write=WriteConfig(strategy=strategy, compression="zstd")
        )
        list(saved)  # yields the URL once the object is published
        size = next(iter(IterableWrapper([url]).list_files_by_gcs(client=client, with_metadata=True)))[1].size
    totals.checkpoints.append((url, size, time.perf_counter() - started))


def resume(
    folder: str, net: nn.Module, optimizer: torch.optim.Optimizer, client: ClientConfig
) -> tuple[int, list[Any]]:
    """Load the latest checkpoint, if any; the epoch it ended and the history so far."""
    latest = latest_checkpoint(folder, client)
    if latest is None:
        return 0, []
    epoch, url = latest
    if url.endswith("/.metadata"):
        state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "history": ""}
        dcp.load(state, storage_reader=GCSStorageReader(url[: -len("/.metadata")], client=client))
        state["history"] = json.loads(state["history"])
    else:
        state = checkpoint.load(url, client=client)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    say(f"resumed from {url} (epoch {epoch})")
    return epoch, list(state["history"])


def check_read_once(seen: Counter[str], expected: int) -> str:
    """Whether every sample was read exactly once across all ranks (gathered on rank 0)."""
    everyone: list[Counter[str]] = [seen]
    if dist.is_initialized():
        everyone = [Counter() for _ in range(dist.get_world_size())]
        dist.all_gather_object(everyone, seen)
    total = sum(everyone, Counter())
    duplicates = sum(1 for count in total.values() if count > 1)
    return f"{len(total)} of {expected} samples read, {duplicates} read more than once"


def run(images: str, folder: str, client: ClientConfig, expected: int, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    net = model()
    optimizer = torch.optim.Adam(net.parameters(), lr=2e-3)
    first, history = resume(folder, net, optimizer, client)
    if dist.is_initialized():
        net = nn.parallel.DistributedDataParallel(net)
    # DCP on the emulator and the XML API's absence there: parts as composed temporary objects
    strategy = "compose" if args.bucket is None else "multipart"
    # one listing shared by all ranks and workers, in a folder of this job's own
    manifest = from_rank_zero(f"{folder}listings/{time.strftime('%Y%m%dT%H%M%S')}/") if dist.is_initialized() else None
    services: list[Any] = [MultiProcessingReadingService(num_workers=args.workers)]
    if dist.is_initialized():
        services.insert(0, DistributedReadingService())
    loader = DataLoader2(pipeline(images, client, args, manifest), reading_service=SequentialReadingService(*services))
    totals = Totals()
    try:
        for epoch in range(first + 1, first + args.epochs + 1):
            loader.seed(epoch)  # each epoch its own order (seeded once, workers repeat the first), resumed too
            loss, accuracy, seen = train_epoch(loader, net, optimizer, epoch, totals)
            history.append({"epoch": epoch, "loss": loss, "accuracy": accuracy})
            coverage = check_read_once(seen, expected)
            state_net = net.module if isinstance(net, nn.parallel.DistributedDataParallel) else net
            save_checkpoint(folder, epoch, state_net, optimizer, history, client, strategy, totals)
            share = " on rank 0's share" if dist.is_initialized() else ""
            say(f"epoch {epoch}: loss {loss:.3f}, accuracy {accuracy:.1%}{share}; {coverage}")
    finally:
        loader.shutdown()  # after whole epochs only
    summary(totals)


def summary(totals: Totals) -> None:
    counts = torch.tensor([totals.samples, totals.bytes, totals.requests, totals.retries, totals.throttled])
    if dist.is_initialized():
        dist.all_reduce(counts)
    samples, moved, requests, retries, throttled = counts.tolist()
    seconds = max(totals.seconds, 1e-9)
    say("summary:")
    say(f"  samples      {samples:,} in {seconds:.1f} s of training: {samples / seconds:,.0f} samples/s, "
        f"{moved / seconds / 1e6:.1f} MB/s")  # fmt: skip
    say(f"  requests     {requests:,} ({requests / max(samples, 1):.3f} per sample; {totals.composes:,} composes "
        f"on rank 0), retries {retries}, throttled {throttled}")  # fmt: skip
    for url, size, seconds in totals.checkpoints:
        say(f"  checkpoint   {url}: {size / 1e6:.2f} MB in {seconds:.2f} s")


# -- set-up -------------------------------------------------------------------------------------------------


def seed(images: str, client: ClientConfig, count: int) -> None:
    """Write ``count`` images under ``images`` unless they are there already."""
    # on rank 0 alone, the others waiting: not a listing for the whole job
    pngs = IterableWrapper([images]).list_files_by_gcs(masks="*.png", client=client, allow_empty=True, list_once=False)
    present = sum(1 for _ in pngs)
    if present >= count:
        return
    items = ((f"{images}{name}", data) for name, data in map(draw, range(count)))
    saving = IterableWrapper(list(items)).save_by_gcs(client=client, write=WriteConfig(strategy="compose"))
    bar = tqdm(saving, total=count, desc="seeding", unit="image", leave=False)
    for _ in bar:
        pass
    say(f"seeded {count} images under {images}")


@contextlib.contextmanager
def endpoint(args: argparse.Namespace) -> Iterator[ClientConfig]:
    """The client for the bucket given, or for an embedded emulator started on rank 0 (its endpoint
    shared with the other ranks)."""
    if args.bucket is not None:
        yield ClientConfig()
        return
    with contextlib.ExitStack() as stack:
        address = ""
        if rank() == 0:
            emulator = stack.enter_context(Emulator(data_dir=args.data_dir))
            emulator.create_bucket("shapes")
            address = emulator.endpoint
            say(f"embedded emulator at {emulator.endpoint}, objects kept in {args.data_dir}")
        try:
            yield ClientConfig(endpoint=from_rank_zero(address))
        finally:
            if dist.is_initialized():
                dist.barrier()  # every rank is done with the emulator before rank 0 stops it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", help="gs://bucket/prefix to use; default: an embedded emulator")
    parser.add_argument("--seed", action="store_true", help="write the dataset to --bucket first if missing")
    parser.add_argument("--data-dir", default=".emulator-data", help="where the embedded emulator keeps objects")
    parser.add_argument("--images", type=int, default=4000, help="images in the dataset")
    parser.add_argument("--epochs", type=int, default=3, help="epochs to train in this run")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader2 worker processes per rank")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--reader", choices=("compose", "load"), default="compose",
                        help="compose_shards_by_gcs (fewer requests) or load_files_by_gcs")  # fmt: skip
    args = parser.parse_args()
    if "WORLD_SIZE" in os.environ:  # under torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        with endpoint(args) as client:
            root = (args.bucket or "gs://shapes").rstrip("/") + "/"
            images, folder = f"{root}images/", f"{root}checkpoints/{'ddp' if dist.is_initialized() else 'single'}/"
            if rank() == 0 and (args.bucket is None or args.seed):
                seed(images, client, args.images)
            if dist.is_initialized():
                dist.barrier()
            run(images, folder, client, args.images, args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
