"""``torchdata.nodes`` for GCS: list, deal each epoch to the ranks, load and compose, read tar shards, as
nodes that resume exactly from a state dict.

Needs torchdata 0.10 or later (``torchdata.nodes``); torchdata 0.9, which ``[dataloader2]`` pins, has
no nodes. Each node's state says how far its consumer got, not how far it read ahead, so
``torchdata.nodes.Loader`` resumes mid-epoch with no item lost and none repeated; an epoch's state
says what all ranks consumed, so it resumes on any number of ranks.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import IO, Any, Literal, cast

try:
    from torchdata.nodes import BaseNode
except ImportError as exc:  # torchdata 0.9 or none
    raise ImportError(
        "torchdata_gcs.nodes needs torchdata >= 0.10, which has torchdata.nodes: pip install 'torchdata>=0.10'"
    ) from exc

from typing_extensions import TypeVar

from ._engines.compose import COMPOSED_CLASSES, Composing
from ._engines.epoch_order import Consumed, Split, check_locality, epoch_share, node_count, rank_and_world_size
from ._engines.inputs import list_inputs, listed_objects
from ._engines.local_cache import LocalCache, check_cache
from ._engines.parallel_listing import ListingStats
from ._engines.reading import Grouping, Item, read_in_order, split_item
from ._engines.resume import elastic_position, elastic_start, fingerprint, listing_position
from ._engines.shard_epochs import Sample, ShardEpochs
from ._engines.shard_reading import index_shards
from ._engines.shared_listing import Entry
from ._engines.stalls import WaitHistogram, process_name, stall_report
from ._engines.transform import ItemMaker, Transform
from ._ops.checksums import ObjectInfo
from ._ops.client import Client, GCSClient, client_of
from ._ops.objects import MAX_SOURCES
from ._ops.paging import MAX_PAGE_SIZE
from ._ops.urls import not_a_url, url_list
from ._transport.context import LoadStats
from .config import ClientConfig, RetryConfig, TransferConfig, require_integer
from .errors import InvalidURIError

__all__ = ["ComposeShards", "EpochObjects", "ListFiles", "LoadFiles", "ReadShards"]

T = TypeVar("T", default=tuple[str, IO[bytes]])  # an item: (url, stream) unless a transform makes another
S = TypeVar("S", default=Sample)  # a shard's sample, unless a transform makes another item


class ListFiles(BaseNode[Item]):
    """The objects under ``gs://`` prefixes or URLs, in listing order: URLs, or ``(url, ObjectInfo)``
    pairs ``with_metadata`` (then :class:`LoadFiles` needs no metadata request per object).

    Args are those of ``list_files_by_gcs``: globs in URLs and masks, and an input that matches no
    object raises ``NotFoundError`` unless ``allow_empty`` (or, for a missing named object,
    ``skip_missing``). The state is the position of the last object handed out; a reset to it lists
    again from there. With ``list_once`` (the default), where a ``torch.distributed`` process group of
    several ranks is initialized, each reset in the process that made the node is one listing for the
    job: rank 0 lists, the other ranks receive its listing (every rank must then reset at the same
    point); ``list_once=False`` lists on each rank.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        masks: str | Sequence[str] = "",
        with_metadata: bool = False,
        manifest: str | None = None,
        client: GCSClient | ClientConfig | None = None,
        retry: RetryConfig | None = None,
        concurrency: int = 16,
        allow_empty: bool = False,
        skip_missing: bool = False,
        list_once: bool = True,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torchdata's BaseNode.__init__ has no annotations
        self.urls = url_list(urls)
        require_integer("concurrency", concurrency, 1, 256)
        self.masks = [masks] if isinstance(masks, str) else list(masks)
        self.with_metadata, self.manifest, self.concurrency = with_metadata, manifest, concurrency
        self.allow_empty, self.skip_missing = allow_empty, skip_missing
        self.list_once, self._made_in = list_once, os.getpid()  # a copy in a worker process lists alone
        self.client = client_of(client, retry)
        self._gcs = Client(self.client)
        self.stats = ListingStats()
        self._position: tuple[int, str] | None = None
        self._entries: Iterator[Entry] = iter(())

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._position = None if not initial_state else listing_position(initial_state)
        self.stats = ListingStats()
        batches = list_inputs(
            self._gcs,
            self.urls,
            self.masks,
            with_info=self.with_metadata,
            page_size=MAX_PAGE_SIZE,
            concurrency=self.concurrency,
            stats=self.stats,
            manifest=self.manifest,
            after=self._position,
            allow_empty=self.allow_empty,
            skip_missing=self.skip_missing,
            once=self.list_once and os.getpid() == self._made_in,
        )
        self._entries = (entry for batch in batches for entry in batch)

    def next(self) -> Item:
        index, url, info = next(self._entries)
        self._position = (index, url)
        return (url, info) if self.with_metadata and info is not None else url

    def get_state(self) -> dict[str, Any]:
        return {"after": None if self._position is None else list(self._position)}


class EpochObjects(BaseNode[Item]):
    """The items of ``source`` (a :class:`ListFiles`, or any node of URLs or ``(url, ObjectInfo)`` pairs),
    listed once, then dealt epoch by epoch: this rank's share of each epoch's order.

    Each epoch has one order, which depends on ``seed`` and the epoch alone (shuffled when ``shuffle``),
    never on the number of ranks. Rank ``r`` of ``W`` takes every ``W``-th item of it, as
    ``DistributedSampler`` deals: every rank the same number, the order padded by repeating from its
    start (or, with ``drop_last``, its tail dropped), so DDP ranks run the same number of steps, and after
    every step what all ranks have read is a prefix of the order. The rank and world size are read at
    each reset: from the default process group if it is initialized, else from torchrun's ``RANK`` and
    ``WORLD_SIZE``. The first reset reads epoch 0 and lists the source (its only reset); each later
    ``reset()`` reads the next epoch, as ``torchdata.nodes.Loader`` resets its nodes for each pass.

    With ``locality="node"`` (``None``, the default, deals as above; anything else raises ``ValueError``),
    each machine reads the same objects every epoch, as a node-local cache needs: the items are split among
    the machines by a partition that depends on ``seed`` and their number alone, and each deals its part, in
    the epoch's order, to its ranks as above (every rank as many items, every item once an epoch, padded or
    cut within each machine; what all ranks have read after a step is then no prefix of the order). The
    machines are torchrun's nodes: ``LOCAL_WORLD_SIZE`` ranks each, rank ``r`` on node
    ``r // LOCAL_WORLD_SIZE`` (``GROUP_RANK``, if set, must agree); without ``LOCAL_WORLD_SIZE``, one. A
    state resumes on any number of nodes, as on any number of ranks.

    The state (``get_state``) is the same on every rank at the same step: the epoch, the seed, a
    fingerprint of the listing and how many items each rank has consumed; a reset to it, on any number
    of ranks, deals what the ranks had not consumed, so every item is read once. A state taken over
    another listing (objects added, removed or renamed since) or another ``shuffle`` raises
    ``ResumeError`` saying what differs, and changes nothing; an item that is neither a URL string nor a
    pair of one raises ``InvalidURIError`` at the first reset (the reader checks each URL it reads).

    Examples:
        >>> from torchdata.nodes import Batcher, Loader
        >>> from torchdata_gcs.nodes import EpochObjects, ListFiles
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {f"{i}.txt": b"" for i in range(5)})
        ...     listed = ListFiles("gs://demo/", client=emulator.client_config)
        ...     loader = Loader(Batcher(EpochObjects(listed, shuffle=True, seed=0), batch_size=2, drop_last=False))
        ...     first = next(iter(loader))
        ...     resumed = Loader(Batcher(EpochObjects(listed, shuffle=True, seed=0), batch_size=2, drop_last=False))
        ...     resumed.load_state_dict(loader.state_dict())  # on any number of ranks
        ...     epoch = first + [url for batch in resumed for url in batch]
        ...     sorted(epoch) == sorted(f"gs://demo/{i}.txt" for i in range(5)), len(epoch)
        (True, 5)
    """

    def __init__(
        self,
        source: BaseNode[Item],
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        locality: Literal["node"] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torchdata's BaseNode.__init__ has no annotations
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
        check_locality(locality)
        self.source, self.shuffle, self.seed, self.drop_last = source, shuffle, seed, drop_last
        self.locality = locality
        self._items: list[Item] | None = None  # the source's items, listed at the first reset
        self._listing: dict[str, Any] = {}
        self._epoch = -1  # the epoch being read (none yet)
        self._share: list[int] = []  # this rank's items of it (indices into _items), in order
        self._order: dict[str, Any] = {}  # how the epoch was dealt, as the state says it
        self._done = 0  # items of the share handed out

    @property
    def epoch(self) -> int:
        """The epoch being read (-1 before the first reset)."""
        return self._epoch

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if self._items is None:
            self.source.reset(None)
            items = list(self.source)
            urls = [item[0] if isinstance(item, tuple) else item for item in items]
            for url in urls:  # the reader checks each URL's form as it reads it (parsing them all here is slow)
                if not isinstance(url, str):
                    raise InvalidURIError(not_a_url(url))
            self._listing, self._items = fingerprint(urls), items
        seed, epoch, start = self.seed, self._epoch + 1, Consumed()
        if initial_state is not None:  # what all ranks consumed, whatever their number: dealt anew below
            epoch, seed, start = elastic_start(elastic_position([initial_state]), self._listing, self.shuffle)
        rank, world = rank_and_world_size()
        split = Split(rank, world, drop_last=self.drop_last, nodes=node_count(self.locality, rank, world))
        share = epoch_share(len(self._items), seed, epoch, self.shuffle, start, split)
        self.seed, self._epoch, self._share, self._done = seed, epoch, share, 0
        self._order = {
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "world_size": world,
            "worker": 0,  # one reader per rank (a ParallelMapper's workers map what it reads, in order)
            "workers": 1,
            "start": start.to_state(),
            **({"nodes": split.nodes} if self.locality else {}),  # without locality, as states before it
        }

    def next(self) -> Item:
        if self._done >= len(self._share):
            raise StopIteration
        assert self._items is not None
        item = self._items[self._share[self._done]]
        self._done += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "seed": self.seed,
            "done": self._done,
            "listing": self._listing,
            "order": self._order,
        }


class _Reading(BaseNode[T]):
    """A node that reads its source's objects ahead, in order (runs of small ones together as ``grouping``
    says, if given), and whose state is its source's state as of the last object it handed out."""

    def __init__(
        self,
        source: BaseNode[Item],
        transform: Transform[T] | None,
        skip_missing: bool,
        grouping: Grouping | None,
        client: GCSClient | ClientConfig | None,
        transfer: TransferConfig | None,
        retry: RetryConfig | None,
        cache: LocalCache | None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torchdata's BaseNode.__init__ has no annotations
        self.source, self.transform, self.skip_missing = source, transform, skip_missing
        self.cache = check_cache(cache)
        self._make_item = None if transform is None else ItemMaker(transform)
        self._grouping = grouping
        self.client = client_of(client, retry, transfer)
        self._gcs = Client(self.client)
        self.stats = LoadStats()
        self._waits = WaitHistogram()
        self._states: deque[tuple[str, dict[str, Any]]] = deque()  # (url, source's state after it) read ahead
        self._state: dict[str, Any] | None = None
        self._loaded: Iterator[tuple[str, IO[bytes]]] = iter(())

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        close = getattr(self._loaded, "close", None)
        if close is not None:
            close()  # what was read ahead is dropped
        self._state = None if initial_state is None else initial_state["source"]
        self.source.reset(self._state)
        self._states.clear()
        self.stats, self._waits = LoadStats(), WaitHistogram()
        gcs = self._gcs.replace(stats=self.stats)
        self._loaded = read_in_order(
            self._pulled(), gcs, self._waits, skip_missing=self.skip_missing, grouping=self._grouping, cache=self.cache
        )

    def _pulled(self) -> Iterator[tuple[str, ObjectInfo | None]]:
        for item in self.source:
            pair = split_item(item)
            self._states.append((pair[0], self.source.state_dict()))
            yield pair

    def next(self) -> T:
        url, stream = next(self._loaded)
        pulled = ""
        while pulled != url:  # the states of objects skipped as missing go with them
            pulled, self._state = self._states.popleft()
        if self._make_item is None:
            return cast(T, (url, stream))  # T is (url, stream) where no transform is given: its default
        return self._make_item(url, stream)

    def get_state(self) -> dict[str, Any]:
        return {"source": self._state}

    def stall_stats(self) -> dict[str, Any]:
        """Since the last reset: this process's wait for its next object (count, total, p50, p95, p99,
        max in seconds), objects, requests, bytes, retries and 429 answers, as a dict to log (see
        ``torchdata_gcs.stalls``, whose ``StallWatch(loader, source=node)`` adds the batch waits)."""
        return stall_report({process_name(): (self.stats, self._waits)})


class LoadFiles(_Reading[T]):
    """``(url, stream)`` for each URL or ``(url, ObjectInfo)`` of ``source``, in order, up to
    ``transfer.max_in_flight`` requests ahead; or, with ``transform``, the item it makes of each:
    ``transform(stream)`` for a callable that takes one positional argument (``stream.name`` is the URL),
    ``transform(url, stream)`` for one that takes two, as in every front end (another shape raises ``TypeError``).

    A missing object raises ``NotFoundError``, or with ``skip_missing`` is skipped with a
    ``MissingObjectWarning``. Settings are those of ``load_files_by_gcs``; ``cache``, a ``LocalCache``, keeps
    the objects on this machine's disk for every process of it to read again.
    """

    def __init__(
        self,
        source: BaseNode[Item],
        *,
        transform: Transform[T] | None = None,
        skip_missing: bool = False,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        cache: LocalCache | None = None,
    ) -> None:
        super().__init__(source, transform, skip_missing, None, client, transfer, retry, cache)


class ComposeShards(_Reading[T]):
    """As :class:`LoadFiles`, with runs of small objects read as server-side composites (see
    ``compose_shards_by_gcs``, whose settings these are); the source should list ``with_metadata``. With a
    ``cache``, the objects are kept (not the composites), and a run is composed of those not found there."""

    def __init__(
        self,
        source: BaseNode[Item],
        *,
        transform: Transform[T] | None = None,
        max_sources: int = MAX_SOURCES,
        max_composite_bytes: int = 32 * 1024 * 1024,
        reuse_prefix: str | None = None,
        storage_classes: Collection[str] = COMPOSED_CLASSES,
        skip_missing: bool = False,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        cache: LocalCache | None = None,
    ) -> None:
        composing = Composing(max_sources, max_composite_bytes, reuse_prefix, storage_classes)
        super().__init__(source, transform, skip_missing, composing, client, transfer, retry, cache)


class ReadShards(BaseNode[S]):
    """The samples of the WebDataset tar shards ``urls`` names, epoch by epoch, as
    :class:`torchdata_gcs.shards.ShardDataset` reads them for this rank (one reader per rank): each sample a
    dict ``{"__key__": key, "__url__": shard URL, extension: bytes, ...}``, or ``transform(sample)``.

    The shards are listed, and their indexes read, at the first reset, which reads epoch 0; each later
    ``reset()`` reads the next epoch. The state (``get_state``) says how far this rank has read; a reset to
    it resumes exactly there on the same number of ranks (the shuffle buffer's samples read again by their
    own GETs), and on any other number from the position it implies (what every rank yielded, worked out
    from the indexes): every sample once an epoch either way.

    Examples:
        >>> import io, tarfile
        >>> from torchdata.nodes import Loader
        >>> from torchdata_gcs.nodes import ReadShards
        >>> from torchdata_gcs.testing import Emulator
        >>> out = io.BytesIO()
        >>> with tarfile.open(fileobj=out, mode="w") as tar:
        ...     for key in "abc":
        ...         info = tarfile.TarInfo(f"{key}.txt")
        ...         info.size = 1
        ...         tar.addfile(info, io.BytesIO(key.encode()))
        >>> with Emulator() as emulator:
        ...     emulator.seed("data", {"shards/0.tar": out.getvalue()})
        ...     node = ReadShards("gs://data/shards/", shuffle=False, client=emulator.client_config)
        ...     [sample["txt"] for sample in Loader(node)]
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
        transform: Callable[[Sample], S] | None = None,
        skip_bad_shards: bool = False,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torchdata's BaseNode.__init__ has no annotations
        self.urls, self.transform = urls, transform
        self._settings: dict[str, Any] = {
            "shuffle": shuffle,
            "seed": seed,
            "shuffle_buffer": shuffle_buffer,
            "shards_open": shards_open,
            "skip_bad_shards": skip_bad_shards,
        }
        self._client = Client(client, retry, transfer=transfer)
        self._epochs: ShardEpochs | None = None
        self._samples: Iterator[Sample] = iter(())

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        rank, world = rank_and_world_size()
        place = {"rank": rank, "world": world, "worker": 0, "workers": 1}
        if self._epochs is None:
            listed = listed_objects(self._client, self.urls, ["*.tar"])
            shards = index_shards(listed, self._client, skip_bad=self._settings["skip_bad_shards"])
            self._epochs = ShardEpochs(shards, self._client, **self._settings)
        elif initial_state is None:
            self._epochs.epoch += 1
        if initial_state is not None:
            same = initial_state.get("place") == place
            self._epochs.load(initial_state if same else self._epochs.elastic(initial_state), place)
        self._place = place
        self._samples = self._epochs.read(place)

    def next(self) -> S:
        sample = next(self._samples)
        return self.transform(sample) if self.transform is not None else sample  # type: ignore[return-value]  # S is Sample without a transform

    def get_state(self) -> dict[str, Any]:
        assert self._epochs is not None, "get_state before the first reset"
        return self._epochs.state(self._place)
