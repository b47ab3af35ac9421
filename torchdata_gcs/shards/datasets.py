"""Datasets over WebDataset tar shards: :class:`ShardDataset` streams samples shuffled by shard and by buffer
and resumes exactly (on any world size through :func:`elastic_state`); :class:`ShardMapDataset` reads one
sample by index with one ranged GET."""

from __future__ import annotations

import bisect
import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic

from torch.utils.data import Dataset, IterableDataset, get_worker_info
from typing_extensions import TypeVar

from .._engines.epoch_order import epoch_order, rank_and_world_size
from .._engines.inputs import list_inputs
from .._engines.parallel_listing import ListingStats
from .._engines.resume import fingerprint, loader_dataset_states
from .._engines.shard_plan import (
    Piece,
    Run,
    ShuffleBuffer,
    Shuffled,
    deal,
    generator_for,
    positions_in,
    ranges_of,
    read_order,
    remaining,
    runs_of,
    simulate,
)
from .._engines.shard_reading import Shard, fetch_sample, index_shards, read_run
from .._ops.client import Client, GCSClient
from ..config import ClientConfig, RetryConfig, TransferConfig
from ..errors import GCSError, ResumeError, ShardWarning

__all__ = ["ShardDataset", "ShardMapDataset"]

Sample = dict[str, Any]
"""``{"__key__": key, "__url__": shard URL, extension: bytes, ...}``, as WebDataset yields them."""
T = TypeVar("T", default=Sample)  # a sample, unless a transform makes another item


def _shards(urls: str | Sequence[str], client: Client) -> list[Shard]:
    """The ``.tar`` objects ``urls`` name (prefixes, names or globs), in listing order, with their indexes."""
    inputs = [urls] if isinstance(urls, str) else list(urls)
    entries = [
        (url, info)
        for batch in list_inputs(
            client, inputs, ["*.tar"], with_info=True, page_size=1000, concurrency=8, stats=ListingStats()
        )
        for _, url, info in batch
        if info is not None
    ]
    return index_shards(entries, client)


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
    samples the buffer held are read again by their own GETs), or from :func:`elastic_state`'s position on
    any number of ranks and workers. A damaged, cut or deleted shard raises a typed error naming it (and the
    member's offset); with ``skip_bad_shards`` the rest of it is skipped with a ``ShardWarning`` and counted
    in :attr:`skipped_samples`.

    Example:
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
        for name, value in (("shuffle_buffer", shuffle_buffer), ("shards_open", shards_open)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.shuffle_buffer, self.shards_open = shuffle_buffer, shards_open
        self.transform, self.skip_bad_shards = transform, skip_bad_shards
        self._client = Client(client, retry, transfer=transfer)
        self.shards = _shards(urls, self._client)
        self._listing = fingerprint([shard.url for shard in self.shards])
        self._start: tuple[int, list[Piece]] | None = None  # (epoch, consumed) where an elastic position resumes
        self._resume: tuple[int, int] | None = None  # (epoch, done) where a worker's own state resumes
        self._done = 0
        self.skipped_samples = 0

    @property
    def samples(self) -> int:
        """How many samples the shards hold."""
        return sum(len(shard.samples) for shard in self.shards)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its own order), as ``DistributedSampler.set_epoch``."""
        self.epoch = epoch

    def _place(self) -> dict[str, int]:
        rank, world = rank_and_world_size()
        info = get_worker_info()
        return {
            "rank": rank,
            "world": world,
            "worker": info.id if info else 0,
            "workers": info.num_workers if info else 1,
        }

    def _settings(self) -> dict[str, Any]:
        return {"shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer, "shards_open": self.shards_open}

    def _consumed(self) -> list[Piece]:
        return self._start[1] if self._start is not None and self._start[0] == self.epoch else []

    def _runs(self, epoch: int, consumed: list[Piece], place: Mapping[str, int]) -> list[Run]:
        """The runs one worker reads in ``epoch``, what ``consumed`` holds left out."""
        counts = [len(shard.samples) for shard in self.shards]
        order = epoch_order(len(self.shards), self.seed, epoch, self.shuffle)
        pieces = deal(
            remaining(sum(counts), consumed), place["world"], place["rank"], place["workers"], place["worker"]
        )
        return runs_of(pieces, counts, order)

    def _simulate(self, epoch: int, consumed: list[Piece], place: Mapping[str, int], done: int, keep: bool) -> Shuffled:
        """Where a worker stands once it yielded ``done`` samples, worked out from the plan alone."""
        runs = self._runs(epoch, consumed, place)
        generator = generator_for(self.seed, epoch, place["rank"], place["worker"])
        return simulate(read_order(runs, self.shards_open), self._buffer_size, generator, done, keep)

    @property
    def _buffer_size(self) -> int:
        return self.shuffle_buffer if self.shuffle else 1

    def __iter__(self) -> Iterator[T]:
        place, epoch, consumed = self._place(), self.epoch, self._consumed()
        done = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume, self._done = None, done
        runs = self._runs(epoch, consumed, place)
        state = self._simulate(epoch, consumed, place, done, keep=False)
        held = [(shard, index, self._fetch_one(shard, index)) for shard, index, _ in state.held]
        if state.draining:
            yield from self._deliver(held)
            return
        generator = generator_for(self.seed, epoch, place["rank"], place["worker"])
        generator.setstate(state.generator)
        buffer: ShuffleBuffer[tuple[int, int, Sample | None]] = ShuffleBuffer(self._buffer_size, generator)
        buffer.held = held
        for item in self._read(runs, state.pushed):
            out = buffer.push(item)
            if out is not None:
                yield from self._deliver([out])
        yield from self._deliver(buffer.drain())

    def _deliver(self, items: list[tuple[int, int, Sample | None]]) -> Iterator[T]:
        for _, _, sample in items:
            self._done += 1
            if sample is not None:
                yield self.transform(sample) if self.transform is not None else sample  # type: ignore[misc]  # T is Sample without a transform

    def _read(self, runs: list[Run], skip: int) -> Iterator[tuple[int, int, Sample | None]]:
        """The samples of the read order after its first ``skip``, with their bytes (``None`` for those of a
        bad shard skipped); each run is read from its first sample not skipped."""
        readers: dict[int, Iterator[Sample]] = {}
        bad: set[int] = set()
        for shard, index, run in itertools.islice(read_order(runs, self.shards_open), skip, None):
            sample = None
            if run not in bad:
                try:
                    if run not in readers:
                        readers[run] = read_run(self.shards[shard], index, runs[run].end, self._client)
                    sample = next(readers[run])
                except GCSError as exc:
                    if not self.skip_bad_shards:
                        raise
                    bad.add(run)
                    left = runs[run].end - index
                    self.skipped_samples += left
                    url = self.shards[shard].url
                    warnings.warn(f"skipped {left} samples of {url}: {exc}", ShardWarning, stacklevel=2)
            if index + 1 == runs[run].end:
                readers.pop(run, None)
            yield shard, index, sample

    def _fetch_one(self, shard: int, index: int) -> Sample | None:
        try:
            return fetch_sample(self.shards[shard], index, self._client)
        except GCSError as exc:
            if not self.skip_bad_shards:
                raise
            self.skipped_samples += 1
            warnings.warn(f"skipped sample {index} of {self.shards[shard].url}: {exc}", ShardWarning, stacklevel=2)
            return None

    def state_dict(self) -> dict[str, Any]:
        """How far this worker has read the current epoch, and what decides its order."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "done": self._done,
            "listing": self._listing,
            "place": self._place(),
            "settings": self._settings(),
            "consumed": [list(piece) for piece in self._consumed()],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from this worker's own ``state`` (same ranks, workers and settings), or from a position
        :func:`elastic_state` made (any ranks and workers). ``ResumeError`` for anything else, nothing changed."""
        if not isinstance(state, Mapping) or state.get("listing") != self._listing:
            raise ResumeError(
                "this state was taken over other shards (or is no ShardDataset state): resuming would skip or"
                " repeat samples"
            )
        consumed = _pieces(state.get("consumed"), self.samples)
        if state.get("seed") != self.seed or not isinstance(state.get("epoch"), int):
            raise ResumeError(
                f"this state was taken with seed {state.get('seed')!r}; this dataset has seed {self.seed}"
            )
        if "done" not in state:  # an elastic position
            self.epoch, self._start, self._resume = state["epoch"], (state["epoch"], consumed), None
            return
        here = {"place": self._place(), "settings": self._settings()}
        for what, value in here.items():
            if state.get(what) != value:
                raise ResumeError(
                    f"this state was taken with {what} {state.get(what)!r}, here it is {value!r}: resume with"
                    " elastic_state(state) to read the rest on other ranks, workers or settings"
                )
        self.epoch, self._start, self._resume = (
            state["epoch"],
            (state["epoch"], consumed),
            (state["epoch"], state["done"]),
        )

    def elastic_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The position in an epoch that one rank's saved state describes (a ``StatefulDataLoader``'s
        ``state_dict()`` over this dataset, or the dataset's own), which :meth:`load_state_dict` takes on any
        number of ranks and workers. Every rank saved at the same step (as DDP steps) with equal shares, so
        this rank's workers tell what every rank's yielded; those samples (the buffer's order included) are
        worked out from the shards' indexes, without reading anything. ``ResumeError`` for anything else."""
        found = [state] if "done" in state else loader_dataset_states(state)
        states = [one for one in found if isinstance(one, Mapping) and "done" in one and "place" in one]
        if not states or len(states) != len(found):
            raise ResumeError("not a resumable state: expected a ShardDataset's state_dict() or a StatefulDataLoader's")
        first = states[0]
        if first.get("listing") != self._listing or first.get("settings") != self._settings():
            raise ResumeError(
                "this state was taken over other shards or settings: resuming would skip or repeat samples"
            )
        epoch, consumed = first["epoch"], _pieces(first.get("consumed"), self.samples)
        counts = [len(shard.samples) for shard in self.shards]
        where = positions_in(epoch_order(len(self.shards), self.seed, epoch, self.shuffle), counts)
        yielded = {position for start, end in consumed for position in range(start, end)}
        for worker, one in enumerate(states):  # every rank's worker yielded as many as this rank's
            for rank in range(first["place"]["world"]):
                place = {"rank": rank, "world": first["place"]["world"], "worker": worker, "workers": len(states)}
                out = self._simulate(epoch, consumed, place, one["done"], keep=True).out
                yielded.update(where[shard] + index for shard, index, _ in out)
        position = {key: first[key] for key in ("epoch", "seed", "listing")}
        return {**position, "consumed": [list(piece) for piece in ranges_of(yielded)]}


def _pieces(value: object, total: int) -> list[Piece]:
    """A saved list of consumed ``[start, end)`` pieces, checked to be sorted, disjoint and within ``total``."""
    if not isinstance(value, list):
        raise ResumeError(f"not a resumable state: 'consumed' must be a list of [start, end), got {value!r:.100}")
    pieces, position = [], 0
    for piece in value:
        if not (isinstance(piece, (list, tuple)) and len(piece) == 2 and all(isinstance(n, int) for n in piece)):
            raise ResumeError(f"not a resumable state: {piece!r:.100} is not a [start, end) of sample positions")
        start, end = piece
        if not position <= start < end <= total:
            raise ResumeError(f"not a resumable state: [{start}, {end}) is not sorted and within {total} samples")
        pieces.append((start, end))
        position = end
    return pieces


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
        self.shards = _shards(urls, self._client)
        self._ends = list(itertools.accumulate(len(shard.samples) for shard in self.shards))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> T:
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"ShardMapDataset indices are integers, got {type(index).__name__}")
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        index %= len(self)
        shard = bisect.bisect_right(self._ends, index)
        sample = fetch_sample(self.shards[shard], index - (self._ends[shard - 1] if shard else 0), self._client)
        return self.transform(sample) if self.transform is not None else sample  # type: ignore[return-value]  # T is Sample without a transform
