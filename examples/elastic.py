"""Elastic training under torchrun: DCP checkpoints of the model, the optimizer and the data position in GCS,
resumed on any number of ranks and DataLoader workers (docs/elastic.md explains each step).

With no ``--bucket`` rank 0 starts the embedded emulator (objects kept in ``--data-dir``, so a restarted job
finds its data and checkpoints again) and seeds small objects, each a feature vector and its label; with
``--bucket gs://bucket/prefix`` it uses that bucket (``--seed`` writes the objects there first). Each rank
reads its share through ``GCSIterableDataset`` in a ``StatefulDataLoader`` and trains a tiny model under
DDP; every ``--checkpoint-every`` steps DCP saves the model, the optimizer, the step and the data position.
On start it loads the latest checkpoint, whatever world size and ``--workers`` saved it. It needs torchdata
0.8 or later (``StatefulDataLoader``).

    torchrun --standalone --nproc-per-node=2 examples/elastic.py --stop-at-step 6
    torchrun --standalone --nproc-per-node=3 examples/elastic.py --workers 1      # resumes at step 6
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:4 --nproc-per-node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 --rdzv-id=run-1 --max-restarts=3 examples/elastic.py --bucket gs://b/elastic --seed
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import IO, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils.data.datapipes.iter import IterableWrapper

import torchdata_gcs  # noqa: F401  (registers the functional DataPipes: listing checkpoints, seeding)
from torchdata_gcs import ClientConfig, GCSIterableDataset, WriteConfig
from torchdata_gcs.datasets import elastic_state
from torchdata_gcs.dcp import GCSStorageReader, GCSStorageWriter
from torchdata_gcs.testing import Emulator

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError as missing:
    raise SystemExit(f"examples/elastic.py needs torchdata 0.8 or later ({missing}): pip install torchdata") from None

warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # DCP in a single process
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata's loader on torch 2.13

FEATURES = 8


# -- the data -----------------------------------------------------------------------------------------------


def sample(index: int) -> bytes:
    """Object ``index``: ``FEATURES`` float32 values, then its label (whether they sum above 0) as one byte."""
    features = torch.randn(FEATURES, generator=torch.Generator().manual_seed(index))
    return features.numpy().tobytes() + bytes([int(features.sum() > 0)])


def decode(url: str, stream: IO[bytes]) -> tuple[str, torch.Tensor, int]:
    data = stream.read()
    return url, torch.frombuffer(bytearray(data[:-1]), dtype=torch.float32), data[-1]


def seed(data: str, client: ClientConfig, count: int, strategy: str) -> None:
    """Write ``count`` objects under ``data`` unless they are there already."""
    # On rank 0 alone, while the others wait: a listing of the whole job would wait for them.
    listing = IterableWrapper([data]).list_files_by_gcs(client=client, allow_empty=True, list_once=False)
    present = sum(1 for _ in listing)
    if present < count:
        items = [(f"{data}{index:05d}.bin", sample(index)) for index in range(count)]
        list(IterableWrapper(items).save_by_gcs(client=client, write=WriteConfig(strategy=strategy)))
        say(f"seeded {count} objects under {data}")


# -- the job across ranks ------------------------------------------------------------------------------------


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


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


# -- checkpoints --------------------------------------------------------------------------------------------


def digest(state: Any) -> str:
    """A short SHA-256 of a state's tensors and values, to show that a load restored what a save held."""
    hashed = hashlib.sha256()

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            hashed.update(value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, Mapping):
            for key in sorted(value, key=str):
                hashed.update(str(key).encode())
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        else:
            hashed.update(repr(value).encode())

    walk(state)
    return hashed.hexdigest()[:16]


def latest(folder: str, client: ClientConfig) -> tuple[int, str] | None:
    """The latest complete checkpoint under ``folder`` (DCP writes ``.metadata`` last): its step and URL."""
    found = []
    # On rank 0 alone, while the others wait: a listing of the whole job would wait for them.
    listing = IterableWrapper([folder]).list_files_by_gcs(client=client, allow_empty=True, list_once=False)
    for url in listing:
        name = url[len(folder) :]
        if name.startswith("step-") and name.endswith("/.metadata"):
            found.append((int(name[len("step-") : -len("/.metadata")]), url[: -len("/.metadata")]))
    return max(found, default=None)


def save(url: str, net: nn.Module, optimizer: torch.optim.Optimizer, step: int, loader: StatefulDataLoader,
         client: ClientConfig, strategy: str) -> None:  # fmt: skip
    position = elastic_state(loader.state_dict())
    if dist.is_initialized():  # DCP writes one copy of a value every rank holds: check that they do
        positions: list[Any] = [None] * world()
        dist.all_gather_object(positions, position)
        if any(other != position for other in positions):
            raise RuntimeError(f"ranks disagree on the data position at step {step}: {positions}")
    model_state, optimizer_state = get_state_dict(net, optimizer)
    # the position is one JSON string: DCP loads only the keys a template names, and would split a dict into many
    state = {"model": model_state, "optimizer": optimizer_state, "step": step, "data": json.dumps(position)}
    dcp.save(state, storage_writer=GCSStorageWriter(url, client=client, write=WriteConfig(strategy=strategy)))
    say(f"saved {url} at step {step}: state {digest([model_state, optimizer_state])}")


def restore(folder: str, net: nn.Module, optimizer: torch.optim.Optimizer, client: ClientConfig
            ) -> tuple[int, dict[str, Any] | None]:  # fmt: skip
    """Load the latest checkpoint into ``net`` and ``optimizer``, if there is one; its step and data position."""
    found = from_rank_zero(latest(folder, client) if rank() == 0 else None)
    if found is None:
        return 0, None
    step, url = found
    model_state, optimizer_state = get_state_dict(net, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "step": 0, "data": ""}
    dcp.load(state, storage_reader=GCSStorageReader(url, client=client))
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    position = json.loads(state["data"])
    loaded = digest(list(get_state_dict(net, optimizer)))
    say(f"resumed from {url} at step {state['step']} (epoch {position['epoch']}): state {loaded}")
    return state["step"], position


# -- training -----------------------------------------------------------------------------------------------


def train(root: str, client: ClientConfig, args: argparse.Namespace) -> None:
    strategy = "compose" if args.bucket is None else "multipart"  # the emulator has no XML multipart API
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, 2)
    net = nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    dataset = GCSIterableDataset(
        f"{root}data/", transform=decode, client=client, shuffle=True, seed=0, batch_size=args.batch_size
    )
    folder = f"{root}checkpoints/"
    step, position = restore(folder, net, optimizer, client)
    if position is not None:
        dataset.load_state_dict(position)  # before the loader is made: any world size, any number of workers
    loader = StatefulDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    say(f"training on {world()} ranks x {args.workers} workers from step {step}, attempt {attempt}")
    reads = open(os.path.join(args.log_reads, f"reads.{attempt}.{rank()}"), "a") if args.log_reads else None
    for epoch in range(dataset.epoch, args.epochs):
        dataset.set_epoch(epoch)  # the epoch resumed into keeps its position; later ones start whole
        for urls, features, labels in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(features), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if reads is not None:
                reads.writelines(f"{epoch} {step} {url}\n" for url in urls)
                reads.flush()
            if step % args.checkpoint_every == 0:
                save(f"{folder}step-{step:07d}", net, optimizer, step, loader, client, strategy)
            if step == args.fail_at_step and attempt == "0" and rank() == world() - 1:
                print(f"rank {rank()} fails at step {step} (--fail-at-step)", flush=True)
                os._exit(1)  # at once, as a lost machine would: torchrun restarts every rank (--max-restarts)
            if step == args.stop_at_step:
                say(f"stopping at step {step} (--stop-at-step)")
                return
        say(f"epoch {epoch} done at step {step}")


@contextlib.contextmanager
def endpoint(args: argparse.Namespace) -> Iterator[ClientConfig]:
    """The client for the bucket given, or for an embedded emulator started on rank 0 (its endpoint shared
    with the other ranks)."""
    if args.bucket is not None:
        yield ClientConfig()
        return
    with contextlib.ExitStack() as stack:
        address = ""
        if rank() == 0:
            emulator = stack.enter_context(Emulator(data_dir=args.data_dir))
            emulator.create_bucket("elastic")
            address = emulator.endpoint
        yield ClientConfig(endpoint=from_rank_zero(address))
        if dist.is_initialized():
            dist.barrier()  # every rank is done with the emulator before rank 0 stops it (not after a failure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", help="gs://bucket/prefix to use; default: an embedded emulator")
    parser.add_argument("--seed", action="store_true", help="write the objects to --bucket first if missing")
    parser.add_argument("--data-dir", default=".emulator-elastic", help="where the embedded emulator keeps objects")
    parser.add_argument("--objects", type=int, default=48, help="objects in the dataset")
    parser.add_argument("--epochs", type=int, default=2, help="train until this many epochs are done")
    parser.add_argument("--batch-size", type=int, default=2, help="per rank")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--checkpoint-every", type=int, default=2, help="steps between checkpoints")
    parser.add_argument("--stop-at-step", type=int, help="stop after this step, as a preempted job would")
    parser.add_argument("--fail-at-step", type=int, help="the last rank fails after this step, first attempt only")
    parser.add_argument("--log-reads", help="a folder where each rank writes 'epoch step url' for each object")
    args = parser.parse_args()
    if "WORLD_SIZE" in os.environ:  # under torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        with endpoint(args) as client:
            root = (args.bucket or "gs://elastic").rstrip("/") + "/"
            if rank() == 0 and (args.bucket is None or args.seed):
                seed(f"{root}data/", client, args.objects, "compose" if args.bucket is None else "multipart")
            if dist.is_initialized():
                dist.barrier()
            train(root, client, args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
