"""What a dataset shares with its DataLoader workers, through shared memory that forked workers inherit
and spawned ones receive with the dataset: load statistics and waits of every process, the epoch, and
which workers took a resumed position.

Each process counts into a plain :class:`LoadStats` of its own, so the I/O hot path stays an attribute
add. After each item a worker copies its totals into its row of a small shared-memory table; reading the
statistics sums the rows. Each process records its waits for the next object straight into its row of a
second table (a :class:`WaitHistogram`). The epoch is one shared integer, so ``set_epoch`` in the main
process reaches persistent workers, which are copies made once. A loaded position is for the next pass
only: workers forked for a later one must find it taken.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
from collections.abc import Iterator
from multiprocessing.context import get_spawning_popen
from typing import Any

from torch.utils.data import get_worker_info

from .._transport.context import LoadStats
from .stalls import SLOTS, WaitHistogram, process_name

__all__ = ["MAX_WORKERS", "SharedEpoch", "SharedTurns", "WorkerStats"]

FIELDS = tuple(field.name for field in dataclasses.fields(LoadStats))
KINDS = tuple(type(getattr(LoadStats(), name)) for name in FIELDS)
MAX_WORKERS = 256
"""Workers with a row of their own; a worker numbered beyond counts only in its own process."""


class WorkerStats:
    """The :class:`LoadStats` and waits of one process and its DataLoader workers: :meth:`local` and
    :meth:`waits` are what this process counts into, :meth:`publish` shares the counts, :meth:`total`
    sums every process's, :meth:`processes` gives each one's."""

    def __init__(self, table: Any = None, waits: Any = None, spawned: bool = True) -> None:
        """New tables, or (a worker being spawned) the tables its parent made. Without ``spawned``, the
        tables go to forked workers only: for an owner pickled into bytes on its way to a spawned worker
        (as torch sends DataPipes), where shared memory cannot follow."""
        self._table: Any = (
            multiprocessing.RawArray(ctypes.c_double, (1 + MAX_WORKERS) * len(FIELDS)) if table is None else table
        )
        self._waits_table: Any = (
            multiprocessing.RawArray(ctypes.c_double, (1 + MAX_WORKERS) * SLOTS) if waits is None else waits
        )
        self._pid = os.getpid() if table is None else -1  # -1: learn the worker's row on first use
        self._local = LoadStats()
        self._row: int | None = 0  # the process that made it; a worker takes 1 + its id
        self._base = [0.0] * len(FIELDS)  # what earlier workers of the same id had published
        self._waits = self._histogram(0)
        self._spawned = spawned

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled to a worker being spawned, the tables go along (shared); pickled otherwise, a copy
        starts counting afresh."""
        if self._spawned and get_spawning_popen() is not None:
            return WorkerStats, (self._table, self._waits_table)
        return WorkerStats, (None, None, self._spawned)

    def local(self) -> LoadStats:
        """This process's statistics (a worker's own start from zero)."""
        if os.getpid() != self._pid:
            self._pid, self._local = os.getpid(), LoadStats()
            worker = get_worker_info()
            self._row = None if worker is None or worker.id >= MAX_WORKERS else 1 + worker.id
            self._base = self._read(self._row) if self._row is not None else [0.0] * len(FIELDS)
            self._waits = WaitHistogram() if self._row is None else self._histogram(self._row)
        return self._local

    def restart(self) -> LoadStats:
        """Count afresh in this process (one iteration's own), keeping what was counted in the totals."""
        local = self.local()
        self._base = [base + getattr(local, name) for name, base in zip(FIELDS, self._base, strict=True)]
        self._local = LoadStats()
        return self._local

    def waits(self) -> WaitHistogram:
        """This process's waits for its next object (a worker's add to its row's, kept across epochs)."""
        self.local()
        return self._waits

    def processes(self) -> dict[str, tuple[LoadStats, WaitHistogram]]:
        """Each process that read something, named as :func:`~.stalls.stall_report` takes them: its
        statistics (this process's live, a worker's as last published) and its waits."""
        found = {}
        for row, values in self._rows():
            stats, waits = self._stats(values), self._waits if row is None or row == self._row else self._histogram(row)
            if stats.requests or stats.objects or waits.count:
                name = process_name() if row is None else "main" if row == 0 else str(row - 1)
                found[name] = (stats, waits)
        return found

    def publish(self) -> None:
        """Share this worker's totals (the process that made the dataset is read live instead)."""
        if self._row:
            start = self._row * len(FIELDS)
            for offset, (name, base) in enumerate(zip(FIELDS, self._base, strict=True)):
                self._table[start + offset] = base + getattr(self._local, name)

    def total(self) -> LoadStats:
        """Every process's statistics summed: this process's live, the workers' as last published."""
        return self._stats([sum(column) for column in zip(*(values for _, values in self._rows()), strict=True)])

    def _rows(self) -> Iterator[tuple[int | None, list[float]]]:
        """Each row's statistics, this process's live (``None`` for a worker beyond the table)."""
        local = self.local()
        live = [base + getattr(local, name) for name, base in zip(FIELDS, self._base, strict=True)]
        if self._row is None:
            yield None, live
        for row in range(1 + MAX_WORKERS):
            yield row, live if row == self._row else self._read(row)

    @staticmethod
    def _stats(values: list[float]) -> LoadStats:
        return LoadStats(**{name: kind(value) for name, kind, value in zip(FIELDS, KINDS, values, strict=True)})

    def _read(self, row: int) -> list[float]:
        start = row * len(FIELDS)
        return list(self._table[start : start + len(FIELDS)])

    def _histogram(self, row: int) -> WaitHistogram:
        """The waits of ``row``, in place in the shared table."""
        return WaitHistogram(
            (ctypes.c_double * SLOTS).from_buffer(self._waits_table, row * SLOTS * ctypes.sizeof(ctypes.c_double))
        )


class SharedEpoch:
    """An epoch number that a process and its DataLoader workers read and set as one."""

    def __init__(self, value: int = 0, cell: Any = None) -> None:
        self._cell: Any = multiprocessing.RawValue(ctypes.c_int64, value) if cell is None else cell

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled to a worker being spawned, the cell goes along (shared); pickled otherwise, a copy holds
        the current value on its own."""
        if get_spawning_popen() is None:
            return SharedEpoch, (self.value,)
        return SharedEpoch, (0, self._cell)

    @property
    def value(self) -> int:
        return int(self._cell.value)

    @value.setter
    def value(self, epoch: int) -> None:
        self._cell.value = epoch


class SharedTurns:
    """Which of a process and its DataLoader workers took what is meant for one pass (a resumed position),
    shared with the workers: each worker of the next pass takes it once, and workers forked for a later
    pass find their turn taken. Each writes only its own slot, so no lock is needed (a lock made in one
    multiprocessing context cannot go to workers of another)."""

    def __init__(self, slots: Any = None) -> None:
        self._slots: Any = multiprocessing.RawArray(ctypes.c_bool, 1 + MAX_WORKERS) if slots is None else slots
        self._taken = False  # a worker numbered beyond MAX_WORKERS has no slot: its process's own flag

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled to a worker being spawned, the slots go along (shared); pickled otherwise, a copy starts
        with nothing taken."""
        return SharedTurns, (() if get_spawning_popen() is None else (self._slots,))

    def take(self) -> bool:
        """Whether this process or worker takes it now: the first time it asks."""
        worker = get_worker_info()
        slot = 0 if worker is None else 1 + worker.id
        if slot > MAX_WORKERS:
            taken, self._taken = self._taken, True
        else:
            taken, self._slots[slot] = bool(self._slots[slot]), True
        return not taken
