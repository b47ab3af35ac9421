"""One listing per job: where a ``torch.distributed`` default process group spans several ranks, rank 0
lists and sends the listing to the others, so a job lists once, not once per rank, and every rank holds
the same objects in the same order.

The ranks first compare a hash of what each asked to list (a rank asking for another listing is a bug
that would silently split the wrong objects); a listing that fails on rank 0 fails on every rank with
the same error. The listing travels over a gloo group of its own (CPU memory on any backend, and no
interleaving with the training loop's collectives), whose deadline is the default group's timeout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.utils.data import get_worker_info

from ..errors import ListingError
from .parallel_listing import ListingStats
from .process_groups import timeout_of
from .shared_listing import Entry

logger = logging.getLogger(__name__)

__all__ = ["job_size", "list_for_job"]

_listing = threading.Lock()
"""Held through each job listing (and so around the group's state): two threads' collectives never interleave."""
_PATIENCE = 60.0
"""Seconds a rank waits for the others before it logs a warning (or half the process group's timeout)."""
_group: tuple[Any, Any] | None = None
"""(the default process group, the gloo group job listings travel over) once one has been made."""


def job_size() -> int:
    """The number of ranks a listing here is shared with: the default process group's world size, or 1
    where none is initialized or this is a DataLoader worker (a forked one inherits its parent's group
    state, which only the parent may use). Only state is read; nothing is initialized."""
    if not (dist.is_available() and dist.is_initialized()) or get_worker_info() is not None:
        return 1
    return dist.get_world_size()


def list_for_job(
    request: Mapping[str, Any], list_here: Callable[[], Iterable[list[Entry]]], stats: ListingStats
) -> list[Entry]:
    """Every entry of the listing ``request`` describes: listed with ``list_here`` on rank 0 and received
    on the other ranks, which must ask for the same ``request`` at the same point.

    Raises ``ListingError`` on every rank if the ranks asked for different listings or did not meet within
    the default process group's timeout; rank 0's own error, on every rank, if its listing failed.
    """
    with _listing:  # one job listing at a time in a process: two threads' collectives never interleave
        return _list_for_job(request, list_here, stats)


def _list_for_job(
    request: Mapping[str, Any], list_here: Callable[[], Iterable[list[Entry]]], stats: ListingStats
) -> list[Entry]:
    key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
    group, timeout = _job_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    keys: list[str | None] = [None] * world
    _meet(lambda: dist.all_gather_object(keys, key, group=group), "compare what they list", rank, timeout)
    differ = sorted(other for other, asked in enumerate(keys) if asked != keys[0])
    if differ:
        raise ListingError(
            f"the ranks of this job asked for different listings: rank(s) {differ} asked for another than rank 0's; "
            "every rank must list the same inputs with the same masks and settings (or pass list_once=False "
            f"to list on each rank alone); this rank asked for {request['inputs']!r}, masks {request['masks']!r}"
        )
    payload: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            payload[0] = ([entry for batch in list_here() for entry in batch], stats.missing)
        except BaseException as exc:  # sent to every rank; rank 0 then raises its own
            failure, payload[0] = exc, _sendable(exc)

    def broadcast() -> None:
        dist.broadcast_object_list(payload, src=0, group=group)

    _meet(broadcast, "hear the listing", rank, timeout, "rank 0 is listing, and must finish within the timeout")
    if failure is not None:
        raise failure
    if isinstance(payload[0], BaseException):
        raise payload[0]
    entries, missing = payload[0]
    if rank != 0:
        stats.objects, stats.missing = len(entries), missing
        logger.debug("received %d listed objects from rank 0", len(entries))
    return entries


def _job_group() -> tuple[Any, timedelta | None]:
    """The gloo group job listings travel over (made once per default group, by every rank at its first
    job listing) and the default group's timeout (``None``: torch's default)."""
    global _group
    default = dist.group.WORLD
    timeout = timeout_of(default)
    if _group is None or _group[0] is not default:
        if not dist.is_gloo_available():
            raise ListingError(
                "one listing per job sends it over a gloo process group, and this torch has no gloo: "
                "pass list_once=False to list on each rank, or manifest= to share a listing through GCS"
            )
        made: list[Any] = []
        what = "make the listing's process group"
        _meet(lambda: made.append(dist.new_group(backend="gloo", timeout=timeout)), what, dist.get_rank(), timeout)
        _group = default, made[0]
    return _group[1], timeout


_SAME_POINT = "every rank must list at the same point; a listing on some ranks alone needs list_once=False"


def _meet(
    collective: Callable[[], object], what: str, rank: int, timeout: timedelta | None, why: str = _SAME_POINT
) -> None:
    """Run ``collective``, with a warning (saying ``why`` it may wait) logged if it waits long; torch's error
    (a rank that never came, or died) as a ``ListingError``."""
    global _group
    patience = _PATIENCE if timeout is None else min(_PATIENCE, timeout.total_seconds() / 2)
    message = "rank %d has waited %g s to %s with the job's other ranks (list_once): %s"
    warning = threading.Timer(patience, logger.warning, (message, rank, patience, what, why))
    warning.daemon = True
    warning.start()
    try:
        collective()
    except RuntimeError as exc:  # torch's DistBackendError and DistStoreError are RuntimeErrors
        _group = None  # a collective that failed leaves its group unusable
        within = "" if timeout is None else f" within the process group's timeout ({timeout.total_seconds():g} s)"
        raise ListingError(
            f"rank {rank} could not {what} with the job's other ranks{within}: every rank must make the dataset "
            "(or iterate the lister) at the same point, and rank 0 must finish listing within that timeout; pass "
            f"list_once=False to list on each rank alone ({exc})"
        ) from exc
    finally:
        warning.cancel()


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles (as the package's errors do), else a ``ListingError`` that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to pickle means it cannot travel
        return ListingError(f"the listing failed on rank 0: {type(exc).__name__}: {exc}")
    if not isinstance(exc, Exception):  # an interrupt on rank 0 is not the other ranks' to raise
        return ListingError(f"the listing was interrupted on rank 0 ({type(exc).__name__})")
    return exc
