"""Epochs of tar shards, read and resumed: what :mod:`.shard_plan` plans for one worker, read through
:mod:`.shard_reading`, with the state that resumes it exactly (a count of samples yielded, the buffer's
samples worked out from the plan and read again by their own GETs) or elastically (the positions every
rank's workers yielded, worked out from one rank's state). Every front end over shards stands on it."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from .._ops.client import Client
from ..errors import GCSError, ResumeError, ShardWarning
from .epoch_order import epoch_order
from .resume import fingerprint, loader_dataset_states
from .shard_plan import (
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
from .shard_reading import Shard, fetch_sample, read_run

__all__ = ["Place", "Sample", "ShardEpochs"]

Sample = dict[str, Any]
"""``{"__key__": key, "__url__": shard URL, extension: bytes, ...}``, as WebDataset yields them."""
Place = Mapping[str, int]
"""Which worker reads: ``{"rank", "world", "worker", "workers"}``."""


class ShardEpochs:
    """The epochs of ``shards`` as one worker reads them (see :mod:`.shard_plan` for the plan)."""

    def __init__(
        self,
        shards: list[Shard],
        client: Client,
        *,
        shuffle: bool,
        seed: int,
        shuffle_buffer: int,
        shards_open: int,
        skip_bad_shards: bool,
    ) -> None:
        for name, value in (("shuffle_buffer", shuffle_buffer), ("shards_open", shards_open)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.shards, self._client = shards, client
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.shuffle_buffer, self.shards_open, self.skip_bad_shards = shuffle_buffer, shards_open, skip_bad_shards
        self._listing = fingerprint([shard.url for shard in shards])
        self._start: tuple[int, list[Piece]] | None = None  # (epoch, consumed) where a resume starts
        self._resume: tuple[int, int] | None = None  # (epoch, done) where a worker's own state resumes
        self._done = 0
        self.skipped_samples = 0

    @property
    def samples(self) -> int:
        """How many samples the shards hold."""
        return sum(len(shard.samples) for shard in self.shards)

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

    def _simulate(self, runs: list[Run], epoch: int, place: Mapping[str, int], done: int, keep: bool) -> Shuffled:
        """Where a worker reading ``runs`` stands once it yielded ``done`` samples, worked out from the plan alone."""
        generator = generator_for(self.seed, epoch, place["rank"], place["worker"])
        return simulate(read_order(runs, self.shards_open), self._buffer_size, generator, done, keep)

    @property
    def _buffer_size(self) -> int:
        return self.shuffle_buffer if self.shuffle else 1

    def read(self, place: Place) -> Iterator[Sample]:
        """The samples ``place``'s worker reads of the current epoch, from where a resume left it."""
        epoch, consumed = self.epoch, self._consumed()
        done = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume, self._done = None, done
        runs = self._runs(epoch, consumed, place)
        state = self._simulate(runs, epoch, place, done, keep=False)
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

    def _deliver(self, items: list[tuple[int, int, Sample | None]]) -> Iterator[Sample]:
        for _, _, sample in items:
            self._done += 1
            if sample is not None:
                yield sample

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

    def state(self, place: Place) -> dict[str, Any]:
        """How far ``place``'s worker has read the current epoch, and what decides its order."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "done": self._done,
            "listing": self._listing,
            "place": dict(place),
            "settings": self._settings(),
            "consumed": [list(piece) for piece in self._consumed()],
        }

    def load(self, state: Mapping[str, Any], place: Place) -> None:
        """Resume from this worker's own ``state`` (same place and settings), or from a position :meth:`elastic`
        made (any ranks and workers). ``ResumeError`` for anything else, nothing changed."""
        if not isinstance(state, Mapping) or state.get("listing") != self._listing:
            raise ResumeError(
                "this state was taken over other shards (or is no state of a shard reader): resuming would skip or"
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
        here = {"place": dict(place), "settings": self._settings()}
        for what, value in here.items():
            if state.get(what) != value:
                raise ResumeError(
                    f"this state was taken with {what} {state.get(what)!r}, here it is {value!r}: resume with"
                    " elastic_state(state) to read the rest on other ranks or workers"
                )
        self.epoch, self._start, self._resume = (
            state["epoch"],
            (state["epoch"], consumed),
            (state["epoch"], state["done"]),
        )

    def elastic(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The position in an epoch that one rank's saved state describes (a ``StatefulDataLoader``'s
        ``state_dict()`` over a dataset of these shards, or a worker's own), which :meth:`load` takes on any
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
                runs = self._runs(epoch, consumed, place)
                out = self._simulate(runs, epoch, place, one["done"], keep=True).out
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
