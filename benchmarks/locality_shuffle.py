"""What node locality costs in shuffle quality: the same epochs dealt as one global order and with
``locality="node"``, by the library's own dealing (no GCS, no emulator), and figures that compare them.

    python -m benchmarks.locality_shuffle [--objects N] [--nodes K] [--per-node L] [--batch B] [--epochs E]

Rows: how much of a node's reads its own part of the partition holds (what a node-local cache of that part
serves); the chance that two objects of different parts, or of one part, share a rank's batch in an epoch;
how much of the data rank 0 sees over the epochs; how evenly a global batch (every rank's batch of one step)
draws on the parts; how far an object moves between epochs (in steps, over the epoch's steps); and how many
positions past the consumed prefix an elastic position holds half way through an epoch. The figures and
their reading are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import Counter

from torchdata_gcs._engines.epoch_order import Consumed, Split, epoch_order, epoch_share, node_partition, order_nodes

SEED = 0


def figures(objects: int, nodes: int, per_node: int, batch: int, epochs: int, locality: bool) -> dict[str, float]:
    """The statistics of ``epochs`` epochs of ``objects`` dealt to ``nodes`` nodes of ``per_node`` ranks, in
    batches of ``batch``, with node locality or one global order."""
    world, dealt_to = nodes * per_node, nodes if locality else 1
    epoch_steps = -(-Consumed().share_size(objects, Split(world=world)) // batch)
    part = node_partition(objects, SEED, nodes, shuffle=True)
    sizes = Counter(part)
    cross_total = (objects**2 - sum(n * n for n in sizes.values())) / 2
    same_total = sum(n * (n - 1) / 2 for n in sizes.values())
    cross = same = own = reads = 0.0
    spread: list[float] = []
    seen: set[int] = set()
    steps_of: list[dict[int, int]] = []
    for epoch in range(epochs):
        shares = [
            epoch_share(objects, SEED, epoch, True, Consumed(), Split(rank, world, block=batch, nodes=dealt_to))
            for rank in range(world)
        ]
        seen |= set(shares[0])
        steps_of.append({})
        for rank, share in enumerate(shares):
            own += sum(part[item] == rank // per_node for item in share)
            reads += len(share)
            for step in range(0, len(share), batch):
                counts = Counter(part[item] for item in share[step : step + batch])
                size = sum(counts.values())
                cross += (size * size - sum(c * c for c in counts.values())) / 2
                same += sum(c * (c - 1) / 2 for c in counts.values())
            for index, item in enumerate(share):
                steps_of[-1].setdefault(item, index // batch)
        for step in range(0, len(shares[0]), batch):
            global_batch = [item for share in shares for item in share[step : step + batch]]
            spread.append(sum(part[item] == 0 for item in global_batch) / len(global_batch))
    moves = [
        abs(before[item] - after[item]) / epoch_steps
        for before, after in itertools.pairwise(steps_of)
        for item in before
        if item in after
    ]
    return {
        "reads from the node's own part": own / reads,
        "a pair of different parts shares a rank's batch (per million pairs, per epoch)": cross
        / cross_total
        / epochs
        * 1e6,
        "a pair of one part shares a rank's batch (per million pairs, per epoch)": same / same_total / epochs * 1e6,
        f"data rank 0 sees in {epochs} epochs": len(seen) / objects,
        "part 0's share of a global batch: mean": statistics.fmean(spread),
        "part 0's share of a global batch: standard deviation": statistics.pstdev(spread),
        "an object's move between epochs (steps / epoch's steps)": statistics.fmean(moves) if moves else 0.0,
        "positions past the prefix, half way through an epoch": _beyond(objects, world, dealt_to, batch),
    }


def _beyond(objects: int, world: int, nodes: int, batch: int) -> int:
    """How many positions past its prefix an elastic position holds after half an epoch's steps (one worker a rank)."""
    split = Split(world=world, block=batch, nodes=nodes)
    homes = order_nodes(epoch_order(objects, SEED, 0, True), SEED, nodes, True) if nodes > 1 else []
    half = Consumed().share_size(objects, split) // batch // 2 * batch
    return len(Consumed().after(objects, split, [half], homes).beyond)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-node", type=int, default=4, help="ranks per node")
    parser.add_argument("--batch", type=int, default=32, help="each rank's batch")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    shape = (args.objects, args.nodes, args.per_node, args.batch, args.epochs)
    rows = {locality: figures(*shape, locality) for locality in (False, True)}
    print(
        f"{args.objects:,} objects, {args.nodes} nodes x {args.per_node} ranks, batches of {args.batch}, "
        f"{args.epochs} epochs, shuffled (seed {SEED})\n"
    )
    print('| statistic | one global order | locality="node" |')
    print("| --- | ---: | ---: |")
    for name in rows[False]:
        print(f"| {name} | {rows[False][name]:,.4g} | {rows[True][name]:,.4g} |")


if __name__ == "__main__":
    main()
