"""Datasets over WebDataset tar shards: :class:`ShardDataset` streams samples shuffled by shard and by buffer
and resumes exactly (on any world size through :meth:`ShardDataset.elastic_state`); :class:`ShardMapDataset` reads one
sample by index with one ranged GET."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic

from torch.utils.data import Dataset, IterableDataset, get_worker_info
from typing_extensions import TypeVar

from .._engines.epoch_order import rank_and_world_size
from .._engines.inputs import listed_objects
from .._engines.shard_epochs import Place, Sample, ShardEpochs
from .._engines.shard_reading import Shard, fetch_sample, index_shards
from .._ops.client import Client, GCSClient
from ..config import ClientConfig, RetryConfig, TransferConfig

__all__ = ["ShardDataset", "ShardMapDataset"]

T = TypeVar("T", default=Sample)  # a sample, unless a transform makes another item


class ShardDataset(IterableDataset[T], Generic[T]):
    """The samples of the tar shards ``urls`` names, each epoch every sample once, for ``DataLoader`` and
    ``StatefulDataLoader``.

    An epoch's samples are the shards' in one order fixed by ``seed`` and the epoch (shuffled, unless
    ``shuffle=False``), dealt to ranks in equal contiguous blocks (the last padded by repeating the epoch's
    first samples, as ``DistributedSampler`` pads) and to a rank's workers in balanced contiguous parts. A
    worker reads its part as runs of consecutive samples (one ranged GET per 8 MiB of whole samples, two
    ahead), ``shards_open`` shards at a time, one sample from each in turn, through a buffer of
    ``shuffle_buffer`` samples. ``transform(sample)`` is applied to each sample. Each shard's index
    (``shard.tar.idx``, as ``pack`` writes it) says where its samples lie; a shard without one is read once
    to make it, and the index written beside it.

    :meth:`state_dict` says how far a worker has read; :meth:`load_state_dict` resumes exactly there (the
    samples the buffer held are read again by their own GETs), or from :meth:`elastic_state`'s position on
    any number of ranks and workers. A damaged, cut or deleted shard raises a typed error naming it (and the
    member's offset); with ``skip_bad_shards`` the rest of it is skipped with a ``ShardWarning`` and counted
    in :attr:`skipped_samples`, and a shard without an index that cannot be read as tar is left out (with a
    ``ShardWarning``) when the dataset is made.

    Examples:
        >>> import io, tarfile
        >>> from torchdata_gcs.shards import ShardDataset
        >>> from torchdata_gcs.testing import Emulator
        >>> def shard(keys):
        ...     out = io.BytesIO()
        ...     with tarfile.open(fileobj=out, mode="w") as tar:
        ...         for key in keys:
        ...             info = tarfile.TarInfo(f"{key}.txt")
        ...             info.size = len(key)
        ...             tar.addfile(info, io.BytesIO(key.encode()))
        ...     return out.getvalue()
        >>> with Emulator() as emulator:
        ...     emulator.seed("data", {"s/0.tar": shard(["a", "b"]), "s/1.tar": shard(["c"])})
        ...     dataset = ShardDataset("gs://data/s/", shuffle=False, shards_open=1, client=emulator.client_config)
        ...     [sample["txt"] for sample in dataset]
        [b'a', b'b', b'c']
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        shards_open: int = 4,
        transform: Callable[[Sample], T] | None = None,
        skip_bad_shards: bool = False,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
    ) -> None:
        gcs = Client(client, retry, transfer=transfer)
        self._epochs = ShardEpochs(
            _shards(urls, gcs, skip_bad_shards),
            gcs,
            shuffle=shuffle,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            shards_open=shards_open,
            skip_bad_shards=skip_bad_shards,
        )
        self.transform = transform

    @property
    def shards(self) -> list[str]:
        """The shards' URLs, in listing order."""
        return [shard.url for shard in self._epochs.shards]

    @property
    def samples(self) -> int:
        """How many samples the shards hold."""
        return self._epochs.samples

    @property
    def skipped_samples(self) -> int:
        """Samples of bad shards skipped (``skip_bad_shards``) in this process."""
        return self._epochs.skipped_samples

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its own order), as ``DistributedSampler.set_epoch``."""
        self._epochs.epoch = epoch

    def __iter__(self) -> Iterator[T]:
        for sample in self._epochs.read(_place()):
            yield self.transform(sample) if self.transform is not None else sample  # type: ignore[misc]  # T is Sample without a transform

    def state_dict(self) -> dict[str, Any]:
        """How far this worker has read the current epoch (``StatefulDataLoader`` keeps one per worker)."""
        return self._epochs.state(_place())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from this worker's own ``state`` (same ranks, workers and settings: exactly where it
        stopped, the shuffle buffer's samples included), or from a position :meth:`elastic_state` made (on any
        number of ranks and workers). ``ResumeError`` for anything else; nothing is changed then."""
        self._epochs.load(state, _place())

    def elastic_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The position in an epoch that one rank's saved state describes (a ``StatefulDataLoader``'s
        ``state_dict()`` over this dataset, or the dataset's own), for :meth:`load_state_dict` on any number
        of ranks and workers. Every rank saved at the same step (as DDP steps) with equal shares, so this
        rank's workers tell what every rank's yielded; those samples (the shuffle buffer's order included)
        are worked out from the shards' indexes, without reading anything."""
        return self._epochs.elastic(state)


def _shards(urls: str | Sequence[str], client: Client, skip_bad: bool = False) -> list[Shard]:
    """The ``.tar`` objects ``urls`` names (prefixes, names or globs), in listing order, with their indexes."""
    return index_shards(listed_objects(client, urls, ["*.tar"]), client, skip_bad=skip_bad)


def _place() -> Place:
    """This process's rank and world size, and its DataLoader worker."""
    rank, world = rank_and_world_size()
    info = get_worker_info()
    return {"rank": rank, "world": world, "worker": info.id if info else 0, "workers": info.num_workers if info else 1}


class ShardMapDataset(Dataset[T], Generic[T]):
    """The samples of the tar shards ``urls`` names by index (the shards in listing order, each one's samples
    as its index lists them), each read with one ranged GET: for a ``DataLoader`` with any sampler.

    Each shard's index (``shard.tar.idx``) says where its samples lie; a shard without one is read once to
    make it, and the index written beside it. ``transform(sample)`` is applied to each sample read.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        transform: Callable[[Sample], T] | None = None,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
    ) -> None:
        self.transform = transform
        self._client = Client(client, retry, transfer=transfer)
        self._shards = _shards(urls, self._client)
        self._ends = list(itertools.accumulate(len(shard.samples) for shard in self._shards))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> T:
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"ShardMapDataset indices are integers, got {type(index).__name__}")
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        index %= len(self)
        shard = bisect.bisect_right(self._ends, index)
        sample = fetch_sample(self._shards[shard], index - (self._ends[shard - 1] if shard else 0), self._client)
        return self.transform(sample) if self.transform is not None else sample  # type: ignore[return-value]  # T is Sample without a transform
