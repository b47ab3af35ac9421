"""Datasets for ``torch.utils.data.DataLoader`` and ``StatefulDataLoader``: objects under ``gs://`` URLs,
listed once and read through the same engine as ``load_files_by_gcs``."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from typing import IO, TYPE_CHECKING, Any, Generic, Literal, cast

import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from typing_extensions import TypeVar

from ._engines.epoch_order import Consumed, Split, check_locality, epoch_share, node_count, rank_and_world_size
from ._engines.inputs import list_inputs
from ._engines.listing import describe_objects
from ._engines.local_cache import LocalCache, check_cache
from ._engines.parallel_listing import ListingStats
from ._engines.reading import read_in_order
from ._engines.resume import elastic_position, elastic_start, fingerprint, loader_dataset_states, resume_position
from ._engines.stalls import stall_report
from ._engines.transform import ItemMaker, Transform
from ._engines.workers import SharedEpoch, SharedTurns, WorkerStats
from ._ops.checksums import ObjectInfo
from ._ops.client import Client, GCSClient, client_of
from ._ops.paging import MAX_PAGE_SIZE
from ._ops.urls import brief, parse_url, url_list
from ._transport.context import LoadStats
from .config import ClientConfig, RetryConfig, TransferConfig, require_integer
from .errors import InvalidURIError, MissingObjectWarning, ResumeError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["GCSIterableDataset", "GCSMapDataset", "elastic_state"]

T = TypeVar("T", default=tuple[str, bytes])  # an item: (url, bytes) unless a transform makes another

Objects = str | Sequence[str] | Sequence[tuple[str, ObjectInfo]]
"""What a dataset reads: ``gs://`` prefixes, object URLs or globs to list, or ``(url, ObjectInfo)`` pairs
already listed (as ``list_files_by_gcs(with_metadata=True)`` yields them)."""


def _url_and_bytes(url: str, stream: IO[bytes]) -> tuple[str, bytes]:
    return url, stream.read()


class _Dataset(Generic[T]):
    """What both datasets hold: the objects, the settings that read them, the transform."""

    def _configure(
        self,
        objects: Objects,
        masks: str | Sequence[str],
        manifest: str | None,
        transform: Transform[T] | None,
        client: GCSClient | ClientConfig | None,
        transfer: TransferConfig | None,
        retry: RetryConfig | None,
        concurrency: int,
        allow_empty: bool,
        skip_missing: bool,
        list_once: bool,
        cache: LocalCache | None,
    ) -> None:
        require_integer("concurrency", concurrency, 1, 256)
        self.cache = check_cache(cache)
        self._make_item: ItemMaker[T] = ItemMaker(transform or cast(Transform[T], _url_and_bytes))
        self.client = client_of(client, retry, transfer)
        self._gcs = Client(self.client)
        self.transform: Transform[T] = self._make_item.transform
        self._stats = WorkerStats()
        pairs = _pairs(objects)
        if pairs is not None:
            self.objects = pairs
            return
        listing = ListingStats()
        batches = list_inputs(
            self._gcs,
            url_list(objects),
            [masks] if isinstance(masks, str) else list(masks),
            with_info=True,
            page_size=MAX_PAGE_SIZE,
            concurrency=concurrency,
            stats=listing,
            manifest=manifest,
            allow_empty=allow_empty,
            skip_missing=skip_missing,
            once=list_once,
        )
        self.objects = [(url, cast(ObjectInfo, info)) for batch in batches for _, url, info in batch]
        self._stats.local().missing += listing.missing

    @classmethod
    def from_prefix(cls, urls: str | Sequence[str], **settings: Any) -> Self:
        """The objects under ``gs://`` prefixes (or globs, or names that are also folders), listed now:
        the same as calling the class with ``urls``.

        Examples:
            >>> from torchdata_gcs import GCSMapDataset
            >>> from torchdata_gcs.testing import Emulator
            >>> with Emulator() as emulator:
            ...     emulator.seed("demo", {"train/a.jpg": b"a", "train/b.jpg": b"b", "train/c.txt": b"c"})
            ...     ds = GCSMapDataset.from_prefix("gs://demo/train/*.jpg", client=emulator.client_config)
            ...     [url for url, _ in ds]
            ['gs://demo/train/a.jpg', 'gs://demo/train/b.jpg']
        """
        return cls(urls, **settings)  # type: ignore[call-arg]  # the class is a dataset, whose __init__ takes the urls

    @classmethod
    def from_objects(
        cls,
        urls: Iterable[str],
        *,
        skip_missing: bool = False,
        client: GCSClient | ClientConfig | None = None,
        retry: RetryConfig | None = None,
        **settings: Any,
    ) -> Self:
        """Exactly the objects ``urls`` name, in that order: one metadata request each (concurrently), no
        listing. A URL with no object raises ``NotFoundError`` naming it, or with ``skip_missing`` is
        left out with a ``MissingObjectWarning`` (counted in ``stats.missing``).

        Examples:
            >>> from torchdata_gcs import GCSMapDataset
            >>> from torchdata_gcs.testing import Emulator
            >>> with Emulator() as emulator:
            ...     emulator.seed("demo", {"a.txt": b"alpha", "b.txt": b"beta"})
            ...     urls = ["gs://demo/b.txt", "gs://demo/a.txt"]
            ...     ds = GCSMapDataset.from_objects(urls, client=emulator.client_config)
            ...     ds[0]
            ('gs://demo/b.txt', b'beta')
        """
        listed = url_list(urls if isinstance(urls, str) else list(urls))
        for url in listed:
            parse_url(url, allow_prefix=False)
        checking = Client(client, retry)
        pairs, missing = [], 0
        for url, info in zip(listed, describe_objects(checking, listed), strict=True):
            if isinstance(info, ObjectInfo):
                pairs.append((url, info))
            elif not skip_missing:
                raise info
            else:
                missing += 1
                warnings.warn(f"skipping {url}: no such object", MissingObjectWarning, stacklevel=2)
        dataset = cls(pairs, client=client, retry=retry, **settings)  # type: ignore[call-arg]  # as above
        dataset._stats.local().missing += missing
        return dataset

    @property
    def stats(self) -> LoadStats:
        """Requests, bytes, retries and objects so far, summed over this process and its DataLoader
        workers (each worker's as of the last item it read); ``missing`` counts objects skipped."""
        return self._stats.total()

    def stall_stats(self) -> dict[str, Any]:
        """Where this rank's loading time went, as a dict to log (see ``torchdata_gcs.stalls``): each
        reading process's (``"main"``, or a DataLoader worker's id) wait for its next object
        (``object_wait_s``: count, total, p50, p95, p99, max in seconds), objects, requests, bytes,
        retries and 429 answers (``throttled``), each worker's as of the last item it read, and their sums.

        Examples:
            >>> from torch.utils.data import DataLoader
            >>> from torchdata_gcs import GCSMapDataset
            >>> from torchdata_gcs.testing import Emulator
            >>> with Emulator() as emulator:
            ...     emulator.seed("demo", {f"{i}.txt": b"x" for i in range(6)})
            ...     ds = GCSMapDataset("gs://demo/", client=emulator.client_config)
            ...     batches = list(DataLoader(ds, batch_size=3, num_workers=2))
            ...     report = ds.stall_stats()
            >>> report["objects"], report["requests"], sorted(report["workers"]), report["object_wait_s"]["count"]
            (6, 6, ['0', '1'], 6.0)
        """
        return stall_report(self._stats.processes())

    def _load(self, items: Sequence[tuple[str, ObjectInfo]]) -> Iterator[T]:
        """The items read concurrently (up to ``max_in_flight`` requests), in order, transformed."""
        gcs = self._gcs.replace(stats=self._stats.local())  # this process's counts: a worker has its own
        make_item = self._make_item
        for url, stream in read_in_order(items, gcs, self._stats.waits(), skip_missing=False, cache=self.cache):
            item = make_item(url, stream)
            self._stats.publish()
            yield item


def _pairs(objects: Objects) -> list[tuple[str, ObjectInfo]] | None:
    """``objects`` as ``(url, ObjectInfo)`` pairs if that is what they are, ``None`` if they are URLs to
    list; a mix is refused."""
    if isinstance(objects, (str, os.PathLike)) or not isinstance(objects, Sequence):
        return None
    pairs = [item for item in objects if isinstance(item, tuple)]
    if not pairs:
        return None
    if len(pairs) != len(objects) or not all(len(p) == 2 and isinstance(p[1], ObjectInfo) for p in pairs):
        raise InvalidURIError(
            f"expected gs:// URLs or (url, ObjectInfo) pairs, not a mix: got {brief(list(objects)[:4])}"
        )
    for url, _ in pairs:
        parse_url(url, allow_prefix=False)
    return pairs


class GCSMapDataset(_Dataset[T], Dataset[T]):
    """A map-style dataset of the objects under ``gs://`` prefixes, globs or URLs, listed once when it is made.

    ``ds[i]`` reads object ``i`` in one request, pinned to the listed generation and checked against
    the listed crc32c; a batch (``DataLoader`` calls ``__getitems__``) is read concurrently. Items
    are ``(url, bytes)`` pairs, which ``default_collate`` batches, or whatever ``transform`` makes
    of each object, computed where the item is read (in the DataLoader worker). Works with any
    sampler, ``DistributedSampler`` included.

    Args:
        urls: ``gs://`` prefixes, object URLs or globs, listed as ``list_files_by_gcs`` lists them
            (an input that matches no object raises ``NotFoundError``); or ``(url, ObjectInfo)``
            pairs already listed. See also :meth:`from_prefix` and :meth:`from_objects`.
        masks: patterns objects must match, as for ``list_files_by_gcs`` (``*.jpg`` on base names,
            ``**/*.jpg`` on names below the prefix); none keeps all.
        manifest: a ``gs://bucket/folder/`` where the listing is shared by every process that makes
            this dataset (see ``list_files_by_gcs``); it takes the place of ``list_once``.
        transform: makes the item of each object: ``transform(stream)`` for a callable that takes one
            positional argument (``PIL.Image.open``, ``torch.load``; ``stream.name`` is the URL),
            ``transform(url, stream)`` for one that takes two, as in every front end (another shape raises
            ``TypeError``). The default gives ``(url, bytes)``.
        client, transfer, retry: as for ``load_files_by_gcs``.
        concurrency: list requests at once.
        allow_empty: an input that matches no object is not an error.
        skip_missing: an input naming one object that does not exist is left out with a
            ``MissingObjectWarning`` (counted in ``stats.missing``) instead of raising.
        list_once: where a ``torch.distributed`` default process group of several ranks is initialized,
            rank 0 lists and the other ranks receive its listing (every rank must then make the dataset,
            over the same inputs, at the same point); ``False`` lists on each rank.
        cache: a ``LocalCache``: objects whose listed version is in it are read from this machine's disk, the
            others from GCS and then kept there, for every rank and worker of the machine.

    Raises:
        NotFoundError: a bucket does not exist, or an input matches no object.
        InvalidURIError: an input is not a ``gs://`` URL (a local path, say).
        ListingError: with ``list_once``, the ranks asked for different listings, or did not all make the
            dataset within the process group's timeout.

    Examples:
        >>> from torch.utils.data import DataLoader
        >>> from torchdata_gcs import GCSMapDataset
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {"a.txt": b"alpha", "b.txt": b"beta", "c.txt": b"gamma"})
        ...     ds = GCSMapDataset("gs://demo/", client=emulator.client_config)
        ...     len(ds), ds[1], next(iter(DataLoader(ds, batch_size=2)))
        (3, ('gs://demo/b.txt', b'beta'), [('gs://demo/a.txt', 'gs://demo/b.txt'), (b'alpha', b'beta')])
    """

    def __init__(
        self,
        urls: Objects,
        *,
        masks: str | Sequence[str] = "",
        manifest: str | None = None,
        transform: Transform[T] | None = None,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        concurrency: int = 16,
        allow_empty: bool = False,
        skip_missing: bool = False,
        list_once: bool = True,
        cache: LocalCache | None = None,
    ) -> None:
        self._configure(
            urls,
            masks,
            manifest,
            transform,
            client,
            transfer,
            retry,
            concurrency,
            allow_empty,
            skip_missing,
            list_once,
            cache,
        )

    def __len__(self) -> int:
        return len(self.objects)

    def __getitem__(self, index: int) -> T:
        return next(self._load([self.objects[index]]))

    def __getitems__(self, indices: Sequence[int]) -> list[T]:
        """A batch read concurrently, in the order of ``indices``."""
        return list(self._load([self.objects[index] for index in indices]))


class GCSIterableDataset(_Dataset[T], IterableDataset[T]):
    """An iterable dataset of the objects under ``gs://`` prefixes, globs or URLs, listed once when it is made.

    Each epoch has one order, which depends on ``seed`` and the epoch alone (shuffled when ``shuffle``;
    see :meth:`set_epoch`), never on the number of ranks or workers. It is split across ranks and
    DataLoader workers by itself, as ``DistributedSampler`` splits it: rank ``r`` of ``W`` takes every
    ``W``-th item, every rank the same number, the order padded by repeating from its start (or, with
    ``drop_last``, its tail dropped), so DDP ranks run the same number of steps. A rank's workers take
    its share in turns of ``batch_size`` items, as the DataLoader asks them for batches, so that after
    every step what all ranks have read is a prefix of the epoch's order. The rank and world size are
    read when an epoch starts: from the default process group if it is initialized (in a DataLoader
    worker, the one of the process that started it), else from torchrun's ``RANK`` and ``WORLD_SIZE``.
    Objects are read ahead concurrently, in order.

    With ``locality="node"``, each node reads the same objects every epoch (what a node-local cache needs):
    the objects are split among the nodes by a partition that depends on ``seed`` and the number of nodes
    alone, and each node deals its part, in the epoch's order (a new shuffle of it each epoch), to its ranks
    as above; every rank still reads as many items, and every epoch reads every object once (padded or cut
    within each node). The nodes are torchrun's: ``LOCAL_WORLD_SIZE`` ranks each, rank ``r`` on node
    ``r // LOCAL_WORLD_SIZE`` (``GROUP_RANK``, if set, must agree); without ``LOCAL_WORLD_SIZE``, one node.
    A rank's batches then hold only its node's objects, and what all ranks have read after a step is no
    longer a prefix of the order; but positions in the order still name objects whatever the number of
    nodes, so a resume deals the rest of the epoch to any number of nodes (each its own objects first),
    every object read once.

    :meth:`state_dict` says how far this worker's share has been read, so ``StatefulDataLoader``
    resumes mid-epoch without reading anything twice. To resume on another number of ranks or
    workers, :func:`elastic_state` turns any one rank's saved ``StatefulDataLoader`` state into a
    position that :meth:`load_state_dict` takes on any world size and worker count.

    Args:
        urls, masks, manifest, transform, client, transfer, retry: as for :class:`GCSMapDataset`.
        concurrency, allow_empty, skip_missing, list_once, cache: as for :class:`GCSMapDataset`.
        shuffle: shuffle the order each epoch.
        seed: the shuffle's seed; every rank and worker must use the same one.
        drop_last: drop the tail that would leave ranks unequal, instead of padding the order.
        batch_size: the DataLoader's ``batch_size``: each worker takes this many items a turn. Any value
            resumes exactly; only the prefix after every step needs the DataLoader's.
        locality: ``None`` (one order dealt to all ranks) or ``"node"`` (each node keeps its objects from
            epoch to epoch); anything else raises ``ValueError``.

    Examples:
        >>> from torch.utils.data import DataLoader
        >>> from torchdata_gcs import GCSIterableDataset
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {f"{i}.txt": str(i).encode() for i in range(6)})
        ...     ds = GCSIterableDataset("gs://demo/", transform=lambda s: s.read(), client=emulator.client_config)
        ...     sorted(DataLoader(ds, batch_size=None, num_workers=2))
        [b'0', b'1', b'2', b'3', b'4', b'5']
    """

    def __init__(
        self,
        urls: Objects,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        batch_size: int = 1,
        locality: Literal["node"] | None = None,
        masks: str | Sequence[str] = "",
        manifest: str | None = None,
        transform: Transform[T] | None = None,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        concurrency: int = 16,
        allow_empty: bool = False,
        skip_missing: bool = False,
        list_once: bool = True,
        cache: LocalCache | None = None,
    ) -> None:
        require_integer("batch_size", batch_size, 1)
        check_locality(locality)
        self._configure(
            urls,
            masks,
            manifest,
            transform,
            client,
            transfer,
            retry,
            concurrency,
            allow_empty,
            skip_missing,
            list_once,
            cache,
        )
        self.shuffle, self.seed, self.drop_last, self.batch_size = shuffle, seed, drop_last, batch_size
        self.locality = locality
        self._epoch = SharedEpoch()  # set here, read in persistent workers too
        self._sender: tuple[int, int] | None = None  # (rank, world size) of the process that pickled this copy
        self._done = 0  # items of this worker's share delivered this epoch
        self._resume = 0  # items of this worker's share to skip at the start of the next iteration
        self._start: tuple[int, Consumed] = (0, Consumed())  # an epoch, and what was consumed of it before this run
        self._turns: SharedTurns | None = None  # after a load: the next pass's workers each start from it once

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration reads."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next iteration (call it on every rank before each epoch); it
        reaches the DataLoader's workers, persistent ones included."""
        require_integer("epoch", epoch, 0)
        self._epoch.value = epoch

    def rank_and_world_size(self) -> tuple[int, int]:
        """This process's rank and the world size, as the next epoch will split the objects."""
        if self._sender is not None and not (dist.is_available() and dist.is_initialized()):
            return self._sender  # a spawned worker: its parent's process group
        return rank_and_world_size()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if get_spawning_popen() is not None and dist.is_available() and dist.is_initialized():
            state["_sender"] = (dist.get_rank(), dist.get_world_size())  # a spawned worker has no process group
        return state

    def share(self) -> list[tuple[str, ObjectInfo]]:
        """This rank's and worker's objects for the current epoch, in order."""
        return [self.objects[i] for i in self._positions()]

    def _split(self) -> Split:
        rank, world = self.rank_and_world_size()
        worker = get_worker_info()
        workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        nodes = node_count(self.locality, rank, world)
        return Split(rank, world, workers[0], workers[1], self.batch_size, self.drop_last, nodes)

    def _started(self) -> Consumed:
        """What was consumed of the current epoch before this run (nothing, unless resumed into it)."""
        epoch, consumed = self._start
        return consumed if epoch == self.epoch else Consumed()

    def _positions(self) -> list[int]:
        """The objects (indices into ``objects``) this rank and worker read this epoch, in order."""
        return epoch_share(len(self.objects), self.seed, self.epoch, self.shuffle, self._started(), self._split())

    def __iter__(self) -> Iterator[T]:
        if self._turns is not None and not self._turns.take():  # workers forked for a later pass find it taken
            self._start, self._resume = (0, Consumed()), 0
        self._turns = None
        share = self.share()
        skip, self._resume = self._resume, 0
        self._done = skip
        for item in self._load(share[skip:]):
            self._done += 1
            yield item
        self._start = (0, Consumed())  # the epoch resumed into is over: a next pass reads it whole

    @functools.cached_property
    def _listing(self) -> dict[str, Any]:
        return fingerprint([url for url, _ in self.objects])

    def _order(self) -> dict[str, Any]:
        """What decides, beside the listing, which objects this worker reads in which order."""
        split = self._split()
        return {
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "rank": split.rank,
            "world_size": split.world,
            "worker": split.worker,
            "workers": split.workers,
            "batch_size": self.batch_size,
            "start": self._started().to_state(),
            **({"nodes": split.nodes} if self.locality else {}),  # without locality, as states before it
        }

    def state_dict(self) -> dict[str, Any]:
        """How far the current epoch has been read by this worker (``StatefulDataLoader`` keeps one per
        worker), with a fingerprint of the listing and the order it was read in."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "done": self._done,
            "listing": self._listing,
            "order": self._order(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state``: this worker's own (from :meth:`state_dict`, as ``StatefulDataLoader``
        restores it on the same ranks and workers), or a position from :func:`elastic_state`, which fits
        any world size and worker count: the rest of its epoch is dealt anew and read exactly once. Only the
        next pass starts from it; a later one reads its epoch whole, whether or not its workers are new.

        Raises ``ResumeError`` (nothing changed) for a malformed state, or one taken over another listing
        (objects added, removed or renamed since: another order, where resuming would skip or repeat
        objects) or in another order (shuffle; for a worker's own state also drop_last, rank, world size,
        worker, workers, batch size, nodes), saying what differs; a state with nothing read yet (``done`` 0)
        fits any."""
        if isinstance(state, Mapping) and "consumed" in state:
            epoch, seed, consumed = elastic_start(state, self._listing, self.shuffle)
            self._epoch.value, self.seed, self._resume, self._start = epoch, seed, 0, (epoch, consumed)
            self._turns = SharedTurns()
            return
        order = self._order()
        saved_start = state.get("order", {}).get("start") if isinstance(state, Mapping) else None
        start = Consumed.from_state(saved_start, len(self.objects)) if isinstance(saved_start, list) else Consumed()
        order["start"] = start.to_state()
        share = start.share_size(len(self.objects), self._split())
        epoch, seed, done = resume_position(state, self._listing, order, share)
        self._epoch.value, self.seed, self._resume, self._start = epoch, seed, done, (epoch, start)
        self._turns = SharedTurns()


def elastic_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The position in an epoch that one rank's saved state describes, as :meth:`GCSIterableDataset.load_state_dict`
    takes it on any number of ranks and DataLoader workers.

    ``state`` is a ``StatefulDataLoader``'s ``state_dict()`` over a :class:`GCSIterableDataset` (with any
    ``num_workers``), or the dataset's own. Every rank saved at the same step (DDP steps in lockstep), so
    any one rank's state tells what all of them consumed; the result holds the epoch, the seed, the
    listing's fingerprint and the positions of the epoch's order consumed, and nothing of ranks or workers.

    Raises ``ResumeError`` for a state that is not one of those, or one whose workers' states disagree.

    Examples:
        >>> from torchdata.stateful_dataloader import StatefulDataLoader
        >>> from torchdata_gcs import GCSIterableDataset
        >>> from torchdata_gcs.datasets import elastic_state
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {f"{i}.txt": str(i).encode() for i in range(8)})
        ...     def dataset():
        ...         return GCSIterableDataset(
        ...             "gs://demo/", transform=lambda s: s.read(), batch_size=2, client=emulator.client_config
        ...         )
        ...     two_workers = StatefulDataLoader(dataset(), batch_size=2, num_workers=2)
        ...     batches = iter(two_workers)
        ...     first = [next(batches), next(batches)]
        ...     position = elastic_state(two_workers.state_dict())
        ...     resumed = dataset()
        ...     resumed.load_state_dict(position)
        ...     first, list(StatefulDataLoader(resumed, batch_size=2, num_workers=0))
        ([[b'0', b'1'], [b'2', b'3']], [[b'4', b'5'], [b'6', b'7']])
    """
    if isinstance(state, Mapping) and "consumed" in state:
        return dict(state)  # a position already
    if not isinstance(state, Mapping):
        raise ResumeError(f"not a resumable state: expected a dict from state_dict(), got {type(state).__name__}")
    if "order" in state:  # the dataset's own
        return elastic_position([state])
    return elastic_position([_dataset_state(state) for state in loader_dataset_states(state)])


def _dataset_state(state: object) -> object:
    """A dataset's state from a ``StatefulDataLoader``'s, which holds ``None`` for a dataset that keeps none."""
    if state is None:
        raise ResumeError(
            "not a resumable state: this StatefulDataLoader's dataset saved no state; elastic_state reads a"
            " GCSIterableDataset's (a map-style dataset's place is its sampler's, which the loader keeps itself)"
        )
    return state
