"""Datasets for ``torch.utils.data.DataLoader`` and ``StatefulDataLoader``: objects under ``gs://`` URLs,
listed once and read through the same engine as ``load_files_by_gcs``."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, Generic, TypeVar, cast

import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ._engines.download import as_stream, load_in_order
from ._engines.parallel_listing import ListingStats
from ._engines.shared_listing import list_inputs
from ._engines.worker_stats import WorkerStats
from ._ops.checksums import ObjectInfo
from ._ops.client import Client
from ._ops.objects import MAX_PAGE_SIZE
from ._transport.context import LoadStats
from .config import ClientConfig, RetryConfig, TransferConfig, require_integer

__all__ = ["GCSIterableDataset", "GCSMapDataset"]

T = TypeVar("T")
Transform = Callable[[str, IO[bytes]], T]
"""What a dataset does with each object: given its URL and a binary stream over its bytes, the item."""


def _pair(url: str, stream: IO[bytes]) -> tuple[str, IO[bytes]]:
    return url, stream


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size: from the default process group, else from torchrun's
    ``RANK`` and ``WORLD_SIZE``, else one process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _listed(
    urls: str | Sequence[str],
    masks: str | Sequence[str],
    manifest: str | None,
    client: ClientConfig,
    retry: RetryConfig,
    concurrency: int,
) -> list[tuple[str, ObjectInfo]]:
    """Every object the URLs name, in listing order, with the metadata its reads are pinned to."""
    inputs = [urls] if isinstance(urls, str) else list(urls)
    require_integer("concurrency", concurrency, 1, 256)
    batches = list_inputs(
        Client(client, retry),
        inputs,
        [masks] if isinstance(masks, str) else list(masks),
        with_info=True,
        page_size=MAX_PAGE_SIZE,
        concurrency=concurrency,
        stats=ListingStats(),
        manifest=manifest,
    )
    return [(url, cast(ObjectInfo, info)) for batch in batches for _, url, info in batch]


class _Objects(Generic[T]):
    """What both datasets hold: the listed objects, the settings that read them, the transform."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        masks: str | Sequence[str] = "",
        manifest: str | None = None,
        transform: Transform[T] | None = None,
        client: ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        concurrency: int = 16,
    ) -> None:
        self.client = client or ClientConfig()
        self.transfer = transfer or TransferConfig()
        self.retry = retry or RetryConfig()
        self.transform = cast(Transform[T], transform or _pair)
        self.objects = _listed(urls, masks, manifest, self.client, self.retry, concurrency)
        self._stats = WorkerStats()

    @property
    def stats(self) -> LoadStats:
        """Requests, bytes, retries and objects so far, summed over this process and its DataLoader
        workers (each worker's as of the last item it read)."""
        return self._stats.total()

    def _load(self, items: Sequence[tuple[str, ObjectInfo]]) -> Iterator[T]:
        """The items read concurrently (up to ``max_in_flight`` requests), in order, transformed."""
        stats = self._stats.local()
        for url, data in load_in_order(items, self.client, self.transfer, self.retry, stats, skip_missing=False):
            item = self.transform(url, cast(IO[bytes], as_stream(url, data)))
            self._stats.publish()
            yield item


class GCSMapDataset(_Objects[T], Dataset[T]):
    """A map-style dataset of the objects under ``gs://`` prefixes or URLs, listed once when it is made.

    ``ds[i]`` reads object ``i`` in one request, pinned to the listed generation and checked against
    the listed crc32c; a batch (``DataLoader`` calls ``__getitems__``) is read concurrently. Items
    are ``(url, stream)`` pairs, or whatever ``transform(url, stream)`` makes of them, computed where
    the item is read (in the DataLoader worker). Works with any sampler, ``DistributedSampler``
    included.

    Args:
        urls: ``gs://`` prefixes or object URLs, listed as ``list_files_by_gcs`` lists them.
        masks: fnmatch pattern(s) for the objects' base names; none keeps all.
        manifest: a ``gs://bucket/folder/`` where the listing is shared by every process that makes
            this dataset (see ``list_files_by_gcs``).
        transform: turns ``(url, stream)`` into the item; the default keeps the pair.
        client, transfer, retry: as for ``load_files_by_gcs``.
        concurrency: list requests at once.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from torchdata_gcs import GCSMapDataset
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {"a.txt": b"alpha", "b.txt": b"beta", "c.txt": b"gamma"})
        ...     ds = GCSMapDataset("gs://demo/", transform=lambda url, stream: stream.read(), client=emulator.client_config)
        ...     len(ds), ds[1], list(DataLoader(ds, batch_size=2, collate_fn=list))
        (3, b'beta', [[b'alpha', b'beta'], [b'gamma']])
    """

    def __len__(self) -> int:
        return len(self.objects)

    def __getitem__(self, index: int) -> T:
        return next(self._load([self.objects[index]]))

    def __getitems__(self, indices: Sequence[int]) -> list[T]:
        """A batch read concurrently, in the order of ``indices``."""
        return list(self._load([self.objects[index] for index in indices]))


class GCSIterableDataset(_Objects[T], IterableDataset[T]):
    """An iterable dataset of the objects under ``gs://`` prefixes or URLs, listed once when it is made.

    Each epoch's order (shuffled with ``seed`` and the epoch when ``shuffle``; see :meth:`set_epoch`)
    is split across ranks and DataLoader workers by itself, so every object is read exactly once per
    epoch with no ``sharding_filter`` needed. The rank and world size are read when the dataset is
    made: from the default process group if it is initialized, else from torchrun's ``RANK`` and
    ``WORLD_SIZE``. Objects are read ahead
    concurrently, in order. :meth:`state_dict` says how far this worker's share has been read, so
    ``StatefulDataLoader`` resumes mid-epoch without reading anything twice.

    Args:
        urls, masks, manifest, transform, client, transfer, retry, concurrency: as for :class:`GCSMapDataset`.
        shuffle: shuffle the order each epoch.
        seed: the shuffle's seed; every rank and worker must use the same one.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from torchdata_gcs import GCSIterableDataset
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {f"{i}.txt": str(i).encode() for i in range(6)})
        ...     ds = GCSIterableDataset("gs://demo/", transform=lambda url, stream: stream.read(), client=emulator.client_config)
        ...     sorted(DataLoader(ds, batch_size=None, num_workers=2))
        [b'0', b'1', b'2', b'3', b'4', b'5']
    """

    def __init__(self, urls: str | Sequence[str], *, shuffle: bool = False, seed: int = 0, **settings: Any) -> None:
        super().__init__(urls, **settings)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.rank, self.world_size = _rank_and_world()  # DataLoader workers do not see the process group
        self._done = 0  # items of this worker's share delivered this epoch
        self._resume = 0  # items to skip at the start of the next iteration

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next iteration (call it on every rank before each epoch)."""
        self.epoch = epoch

    def share(self) -> list[tuple[str, ObjectInfo]]:
        """This rank's and worker's objects for the current epoch, in order."""
        order = list(range(len(self.objects)))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        worker = get_worker_info()
        index, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        return [self.objects[i] for i in order[self.rank * workers + index :: self.world_size * workers]]

    def __iter__(self) -> Iterator[T]:
        share = self.share()
        skip, self._resume = self._resume, 0
        self._done = skip
        for item in self._load(share[skip:]):
            self._done += 1
            yield item

    def state_dict(self) -> dict[str, Any]:
        """How far the current epoch has been read by this worker (``StatefulDataLoader`` keeps one per worker)."""
        return {"epoch": self.epoch, "seed": self.seed, "done": self._done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the epoch in ``state`` (from :meth:`state_dict`) after the items it had delivered."""
        self.epoch, self.seed, self._resume = int(state["epoch"]), int(state["seed"]), int(state["done"])
