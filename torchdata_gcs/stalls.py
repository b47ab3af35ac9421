"""Data-stall figures while training: how long the training loop waits for each batch, and how long each
process that reads (the rank's own, each DataLoader worker) waits for its next object, with the objects,
requests, bytes, retries and 429 answers behind them; as a dict to log (TensorBoard, W&B) and, when
asked, as lines on the ``torchdata_gcs.stalls`` logger. Nothing is logged unless asked."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from ._engines.stalls import WaitHistogram, flatten, log_report, stall_report, timed

__all__ = ["StallWatch"]

T = TypeVar("T")


class StallWatch(Generic[T]):
    """Wraps the loader a training loop iterates (``DataLoader``, ``StatefulDataLoader``, ``DataLoader2``,
    ``torchdata.nodes.Loader``, any iterable) and times the wait for each batch in the rank's process,
    with no thread and two clock reads per batch; anything else (``len``, ``state_dict``, ``set_epoch``
    on the sampler...) goes to the loader.

    :meth:`report` gives this rank's figures as a dict, :meth:`scalars` the same flat. Waits are given
    as ``count``, ``total``, ``p50``, ``p95``, ``p99`` and ``max`` in seconds, from fixed-size histograms
    (exact to within an eighth below): ``batch_wait_s``, the training loop's wait for the next batch,
    and ``object_wait_s``, the reading processes' wait for their next object (the I/O read-ahead did
    not hide), in all and per process under ``workers`` (``"main"`` for the rank's own process, a
    DataLoader worker's id for a worker), each with its ``objects``, ``requests``, ``bytes``,
    ``retries``, ``throttled`` (429 answers) and, with a ``LocalCache``, ``cache_hits``, ``cache_misses`` and
    ``cache_bytes``.

    Args:
        loader: what the training loop iterates.
        log_every: seconds between two reports logged on the ``torchdata_gcs.stalls`` logger, checked
            as batches come: one line per rank at INFO, one per reading process at DEBUG. ``None``
            (the default) logs nothing.
        source: what reports the reading processes (an object with ``stall_stats()``: our datasets,
            nodes and DataPipes); by default the loader's ``dataset`` if it is one, or the one reading
            DataPipe of the graph a ``DataLoader2`` reads (a copy of the one it was given: naming a
            DataPipe of the original raises ``ValueError``), else none.

    Examples:
        >>> import json
        >>> from torch.utils.data import DataLoader
        >>> from torchdata_gcs import GCSMapDataset
        >>> from torchdata_gcs.stalls import StallWatch
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {f"{i}.txt": b"x" for i in range(8)})
        ...     ds = GCSMapDataset("gs://demo/", client=emulator.client_config)
        ...     loader = StallWatch(DataLoader(ds, batch_size=4, num_workers=2))
        ...     for batch in loader:
        ...         pass  # train
        ...     report = loader.report()
        >>> len(loader), report["batch_wait_s"]["count"], report["requests"], sorted(report["workers"])
        (2, 2.0, 8, ['0', '1'])
        >>> scalars = loader.scalars()
        >>> scalars["data/batch_wait_s/p95"] >= scalars["data/batch_wait_s/p50"] > 0
        True
        >>> report == json.loads(json.dumps(report))
        True
    """

    def __init__(self, loader: Iterable[T], *, log_every: float | None = None, source: Any = None) -> None:
        if log_every is not None and not (isinstance(log_every, (int, float)) and 0 < log_every < math.inf):
            raise ValueError(f"log_every must be a positive number of seconds or None, got {log_every!r}")
        reporting = _reporting(loader)
        if source is None:
            source = next(iter(reporting), None) if len(reporting) <= 1 else None
        elif not callable(getattr(source, "stall_stats", None)):
            raise TypeError(f"source must have a stall_stats() method, got {type(source).__name__}")
        elif hasattr(loader, "datapipe") and not any(pipe is source for pipe in reporting):
            raise ValueError(
                "source is not in the graph this DataLoader2 reads (it reads a copy of the one it was given):"
                " leave source out, and the watch finds the copy's reading DataPipe"
            )
        self.loader, self.log_every, self.source = loader, log_every, source
        self.batch_waits = WaitHistogram()

    def __iter__(self) -> Iterator[T]:
        if self.log_every is None:
            yield from timed(self.loader, self.batch_waits)
            return
        due = time.monotonic() + self.log_every
        for batch in timed(self.loader, self.batch_waits):
            if time.monotonic() >= due:
                log_report(self.report())
                due = time.monotonic() + self.log_every
            yield batch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # len() of a loader without one raises, as the loader's own would

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet: no loader to ask
            raise AttributeError(name)
        return getattr(self.loader, name)

    def report(self) -> dict[str, Any]:
        """This rank's figures: ``rank``, ``batch_wait_s``, ``object_wait_s``, ``objects``, ``requests``,
        ``bytes``, ``retries``, ``throttled``, ``cache_hits``, ``cache_misses``, ``cache_bytes`` and
        ``workers``; JSON-serializable."""
        figures = self.source.stall_stats() if self.source is not None else stall_report({})
        return {"rank": figures.pop("rank"), "batch_wait_s": self.batch_waits.summary(), **figures}

    def scalars(self, prefix: str = "data/") -> dict[str, float]:
        """:meth:`report` flat, nested keys joined by ``/`` after ``prefix``
        (``"data/workers/0/object_wait_s/p99"``), as TensorBoard's ``add_scalar`` and W&B's ``log`` take them."""
        return flatten(self.report(), prefix)


def _reporting(loader: Any) -> list[Any]:
    """What in ``loader`` gives stall figures: its ``dataset`` (a DataLoader's), or the DataPipes of the
    graph a ``DataLoader2`` reads (its own copy of the one it was given)."""
    dataset = getattr(loader, "dataset", None)
    if callable(getattr(dataset, "stall_stats", None)):
        return [dataset]
    datapipe = getattr(loader, "datapipe", None)
    if datapipe is None:
        return []
    pipes = get_all_graph_pipes(traverse_dps(datapipe))
    return [pipe for pipe in pipes if callable(getattr(pipe, "stall_stats", None))]
