"""The DataPipes guide's epoch recipe for DataLoader2: ``loader.seed(seed + epoch)`` before each epoch
gives each epoch its own order, the same with 2 worker processes as in-process, every object once;
without it, ``MultiProcessingReadingService`` reads the first epoch's order again (torchdata 0.9)."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.delivery import assert_exactly_once, read
from tests.doc_blocks import doc_block
from torchdata_gcs import ClientConfig
from torchdata_gcs.testing import Emulator

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import DataLoader2, InProcessReadingService, MultiProcessingReadingService

N = 30  # 15 per worker: two workers taking turns hand out the order as it is
EPOCHS = 3


def read_item(item: tuple[str, Any]) -> tuple[str, bytes]:
    return read(*item)


@pytest.fixture(scope="module")
def prefix_and_contents(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    bucket = f"dp-epochs-{uuid.uuid4().hex[:10]}"
    contents = {f"d/{i:03d}.bin": f"item {i}".encode() for i in range(N)}
    gcs_emulator.seed(bucket, contents)
    return f"gs://{bucket}/d/", {f"gs://{bucket}/{name}": data for name, data in contents.items()}


def pipe(prefix: str, client: ClientConfig) -> Any:
    listed = IterableWrapper([prefix]).list_files_by_gcs(client=client)
    return listed.shuffle().sharding_filter().load_files_by_gcs(client=client).map(read_item)


def epochs_read(loader: DataLoader2, reseed: bool) -> list[list[tuple[str, bytes]]]:
    try:
        read_by_epoch = []
        for epoch in range(EPOCHS):
            if reseed:
                loader.seed(3 + epoch)
            read_by_epoch.append(list(loader))
        return read_by_epoch
    finally:
        loader.shutdown()


def test_the_guides_recipe_gives_each_epoch_its_own_order_whatever_the_workers_where_seeding_once_repeats_it(
    prefix_and_contents: tuple[str, dict[str, bytes]], client: ClientConfig
) -> None:
    prefix, contents = prefix_and_contents
    snippet = doc_block("loader.seed(seed + epoch)").replace("num_workers=4", "num_workers=2")
    read_in_order: list[tuple[str, bytes]] = []
    namespace = {
        "DataLoader2": DataLoader2,
        "MultiProcessingReadingService": MultiProcessingReadingService,
        "pipe": pipe(prefix, client),
        "seed": 3,
        "first_epoch": 0,
        "epochs": EPOCHS,
        "train_step": read_in_order.append,
    }
    exec(snippet, namespace)  # noqa: S102 - our own docs (guides/datapipes.md)
    namespace["loader"].shutdown()
    by_epoch = [read_in_order[N * epoch : N * (epoch + 1)] for epoch in range(EPOCHS)]
    for items in by_epoch:
        assert_exactly_once(items, contents)
    assert len({tuple(items) for items in by_epoch}) == EPOCHS, "each epoch has its own order"
    in_process = epochs_read(DataLoader2(pipe(prefix, client), reading_service=InProcessReadingService()), True)
    assert in_process == by_epoch, "the same orders without worker processes"
    repeated = DataLoader2(pipe(prefix, client), reading_service=MultiProcessingReadingService(num_workers=2))
    repeated.seed(3)
    first, *others = epochs_read(repeated, reseed=False)
    assert first == by_epoch[0] and others == [first] * (EPOCHS - 1), "what the guide warns of without the recipe"
