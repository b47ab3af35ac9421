"""Resuming a position in a listing, checked so that a resume never skips or repeats objects silently: a
dataset's count of items read (which means something only over the same listing in the same order, so a
fingerprint of both is saved with it), and a lister's last object (which must be one its input lists)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._ops.patterns import NameFilter
from .._ops.urls import brief, parse_url, printable
from ..errors import InvalidURIError, ResumeError
from .epoch_order import Consumed, Split, epoch_order, order_nodes

__all__ = [
    "check_listing_position",
    "elastic_position",
    "elastic_start",
    "fingerprint",
    "listing_position",
    "loader_dataset_states",
    "resume_position",
]

_SHA256 = re.compile(r"[0-9a-f]{64}")


def fingerprint(urls: Sequence[str]) -> dict[str, Any]:
    """The listing ``urls`` (in order) in brief: how many, and a SHA-256 of them. Generations are left out:
    an object rewritten keeps its place in the order, and a resume reads what it holds now."""
    digest = hashlib.sha256()
    for url in urls:
        encoded = url.encode("utf-8", "surrogatepass")
        digest.update(b"%d:%b" % (len(encoded), encoded))  # lengths first: no two listings hash alike by joining
    return {"objects": len(urls), "sha256": digest.hexdigest()}


def _count(state: Mapping[str, Any], key: str, what: str = "the") -> int:
    """``state[key]``, which must be an integer >= 0 (``what`` names what holds it in the message)."""
    value = state.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ResumeError(f"not a resumable state: {what} {key!r} must be an integer >= 0, got {brief(value)}")
    return value


def resume_position(state: object, listing: dict[str, Any], order: dict[str, Any], share: int) -> tuple[int, int, int]:
    """``(epoch, seed, done)`` from a saved ``state``, checked against this process's ``listing`` (its
    :func:`fingerprint`), ``order`` (what else decides which objects come where: shuffle, split, where the
    epoch's run started) and ``share`` (how many items this epoch holds here).

    A state of ``done == 0`` fits any listing: nothing was read. Otherwise ``ResumeError`` says what differs,
    or what is malformed; a state saved without a fingerprint (by an older version) cannot be checked, and
    is refused too."""
    epoch, seed, done = _position(state)
    if done == 0:
        return epoch, seed, done
    restart = f"load {{'epoch': {epoch}, 'seed': {seed}, 'done': 0}} to read epoch {epoch} from its start"
    assert isinstance(state, Mapping)
    saved, saved_order = state.get("listing"), state.get("order")
    if saved is None and saved_order is None:
        raise ResumeError(
            f"this state (done {done}) holds no fingerprint of the listing it was taken over (an older version"
            f" saved it), so nothing shows that this dataset lists the same objects in the same order; resuming"
            f" could skip or repeat objects: {restart}"
        )
    if not (isinstance(saved, Mapping) and isinstance(saved_order, Mapping)):
        raise ResumeError(
            f"not a resumable state: 'listing' and 'order' must be dicts, got {brief(saved)}, {brief(saved_order)}"
        )
    _check_listing(saved, listing, f"resuming after {done} items would skip or repeat objects", restart)
    keys = [*order, *(key for key in _DEFAULTS if key not in order)]  # a key left out means its default
    then, now = ({key: kept.get(key, _DEFAULTS.get(key)) for key in keys} for kept in (saved_order, order))
    differs = [f"{key} {brief(then[key])} then, {now[key]!r} now" for key in keys if then[key] != now[key]]
    if differs:
        raise ResumeError(
            f"this state was taken in another order ({', '.join(differs)}): resuming after {done} items would skip"
            f" or repeat objects; {restart}"
        )
    if done > share:
        raise ResumeError(f"not a resumable state: done {done}, but the epoch holds {share} items here")
    return epoch, seed, done


_DEFAULTS: dict[str, Any] = {"batch_size": 1, "start": [0, []], "nodes": 1}
"""What a state saved before these keys existed, or without node locality, meant by leaving them out."""


def elastic_position(states: Sequence[object]) -> dict[str, Any]:
    """The position that the saved states of every worker of one rank describe, the same for every rank
    (ranks step in lockstep): ``{"epoch", "seed", "listing", "shuffle", "consumed"}``, which
    :func:`elastic_start` reads on any world size and worker count. ``ResumeError`` if the states are
    malformed, disagree, or are not one per worker."""
    if not states:
        raise ResumeError("not a resumable state: it holds no dataset state (was it saved before iterating?)")
    positions = [_position(state) for state in states]
    mappings = [state for state in states if isinstance(state, Mapping)]
    first = mappings[0]
    listing, order = first.get("listing"), first.get("order")
    if not (isinstance(listing, Mapping) and isinstance(order, Mapping)):
        raise ResumeError(
            f"not a resumable state: 'listing' and 'order' must be dicts, got {brief(listing)}, {brief(order)}"
        )
    workers = order.get("workers")
    for index, (state, position) in enumerate(zip(mappings, positions, strict=True)):
        their_order = state.get("order")
        if (
            position[:2] != positions[0][:2]
            or state.get("listing") != listing
            or not isinstance(their_order, Mapping)
            or {**their_order, "worker": 0} != {**order, "worker": 0}
            or their_order.get("worker") != index
        ):
            raise ResumeError(
                f"not a resumable state: the states of worker 0 and worker {index} are not of one epoch of one run"
                f" ({brief(dict(first))} and {brief(dict(state))})"
            )
    if workers != len(states):
        raise ResumeError(
            f"not a resumable state: it holds {len(states)} workers' states, but they were {brief(workers)}"
        )
    count = _count(listing, "objects", "the listing's")
    split = Split(
        world=_count(order, "world_size"),
        workers=len(states),
        block=_count(order, "batch_size") if "batch_size" in order else 1,
        drop_last=bool(order.get("drop_last")),
        nodes=_count(order, "nodes") if "nodes" in order else 1,
    )
    if split.world < 1 or split.block < 1:
        raise ResumeError(f"not a resumable state: world size and batch size must be >= 1, got {brief(dict(order))}")
    if split.nodes < 1 or split.world % split.nodes:
        raise ResumeError(
            f"not a resumable state: the world size must be a multiple of the nodes (>= 1), got {brief(dict(order))}"
        )
    start = Consumed.from_state(order.get("start", _DEFAULTS["start"]), count)
    done = [position[2] for position in positions]
    for worker, n in enumerate(done):
        holds = start.share_size(count, dataclasses.replace(split, worker=worker))
        if n > holds:
            raise ResumeError(f"not a resumable state: worker {worker} delivered {n} items of a share of {holds}")
    epoch, seed, _ = positions[0]
    shuffle = bool(order.get("shuffle"))
    homes = order_nodes(epoch_order(count, seed, epoch, shuffle), seed, split.nodes, shuffle) if split.nodes > 1 else []
    return {
        "epoch": epoch,
        "seed": seed,
        "listing": dict(listing),
        "shuffle": shuffle,
        "consumed": start.after(count, split, done, homes).to_state(),
    }


def elastic_start(state: Mapping[str, Any], listing: dict[str, Any], shuffle: bool) -> tuple[int, int, Consumed]:
    """``(epoch, seed, consumed)`` from a position :func:`elastic_position` made, checked against this
    process's ``listing`` and ``shuffle``; ``ResumeError`` says what differs or is malformed."""
    epoch, seed = _count(state, "epoch"), state.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ResumeError(f"not a resumable state: the 'seed' must be an integer, got {brief(seed)}")
    restart = f"load {{'epoch': {epoch}, 'seed': {seed}, 'done': 0}} to read epoch {epoch} from its start"
    saved = state.get("listing")
    if not isinstance(saved, Mapping):
        raise ResumeError(f"not a resumable state: 'listing' must be a dict, got {brief(saved)}")
    consumed = Consumed.from_state(state.get("consumed"), _count(saved, "objects", "the listing's"))
    _check_listing(saved, listing, f"resuming after {consumed.count()} items would skip or repeat objects", restart)
    if state.get("shuffle") is not shuffle:
        raise ResumeError(
            f"this state was taken in another order (shuffle {brief(state.get('shuffle'))} then, {shuffle!r} now):"
            f" resuming would skip or repeat objects; {restart}"
        )
    return epoch, seed, consumed


def loader_dataset_states(state: Mapping[str, Any]) -> list[object]:
    """The dataset states a ``StatefulDataLoader``'s ``state_dict()`` holds: one per worker, or its own
    without workers; ``ResumeError`` for a state that does not say what each worker delivered."""
    if "_snapshot" not in state:  # a StatefulDataLoader without workers
        return [state.get("dataset_state", state)]
    snapshot = state["_snapshot"]
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get("_worker_snapshots"), Mapping):
        raise ResumeError(
            f"not a resumable state: a StatefulDataLoader's '_snapshot' holds no worker states: {brief(snapshot)}"
        )
    if state.get("_steps_since_snapshot", 0):
        raise ResumeError(
            "this StatefulDataLoader state was saved between its workers' snapshots (snapshot_every_n_steps > 1):"
            " it does not say what each worker delivered; save with snapshot_every_n_steps=1 (the default)"
        )
    workers = snapshot["_worker_snapshots"]
    return [
        workers[f"worker_{index}"].get("dataset_state") if isinstance(workers.get(f"worker_{index}"), Mapping) else None
        for index in range(len(workers))
    ]


def _position(state: object) -> tuple[int, int, int]:
    """``(epoch, seed, done)`` of a saved dataset state, each checked."""
    if not isinstance(state, Mapping):
        raise ResumeError(f"not a resumable state: expected a dict from state_dict(), got {type(state).__name__}")
    if "epoch" not in state and "done" not in state:
        raise ResumeError(f"not a resumable state: {_whose(state)}")
    epoch, seed, done = _count(state, "epoch"), state.get("seed"), _count(state, "done")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ResumeError(f"not a resumable state: the 'seed' must be an integer, got {brief(seed)}")
    return epoch, seed, done


def _whose(state: Mapping[str, Any]) -> str:
    """What a dict that is no dataset's state most likely is, and what to do with it instead."""
    if "_snapshot" in state or "dataset_state" in state:
        return (
            "this is a StatefulDataLoader's state_dict(); on the same ranks and workers give it to the loader's"
            " load_state_dict, on any others give the dataset elastic_state(state)"
        )
    if "root" in state and "num_yielded" in state:
        return (
            "this is a torchdata.nodes Loader's state_dict(); give it to the Loader's load_state_dict, which"
            " resumes on any number of ranks"
        )
    return f"expected a dataset's state_dict() or a position from elastic_state(), got a dict of {brief(sorted(state))}"


def _check_listing(saved: Mapping[str, Any], listing: dict[str, Any], harm: str, restart: str) -> None:
    """``ResumeError`` unless the ``saved`` fingerprint is this ``listing``'s; ``harm`` says what resuming would do."""
    objects, digest = _count(saved, "objects", "the listing's"), saved.get("sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise ResumeError(f"not a resumable state: the listing's 'sha256' must be 64 hex digits, got {brief(digest)}")
    if digest != listing["sha256"] or objects != listing["objects"]:
        changed = "" if objects != listing["objects"] else " (as many, but not the same names in the same order)"
        raise ResumeError(
            f"this state was taken over a listing of {objects:,} objects; this dataset lists {listing['objects']:,}"
            f"{changed}: {harm}. Make the dataset over the same objects (the (url, ObjectInfo) pairs, or a"
            f" manifest=), or {restart}"
        )


def listing_position(state: object) -> tuple[int, str] | None:
    """The position in a lister's saved state, ``{"after": [input index, URL of the last object handed out]}``
    (``None``: from the start), as a tuple; ``ResumeError`` if the state is anything else."""
    if not isinstance(state, Mapping) or "after" not in state:
        raise ResumeError(f"not a resumable state: expected {{'after': ...}} from a lister, got {brief(state)}")
    after = state["after"]
    if after is None:
        return None
    if (
        isinstance(after, Sequence)
        and not isinstance(after, str)
        and len(after) == 2
        and isinstance(after[0], int)
        and not isinstance(after[0], bool)
        and after[0] >= 0
        and isinstance(after[1], str)
    ):
        try:
            parse_url(after[1], allow_prefix=False)
        except InvalidURIError as exc:
            raise ResumeError(f"not a resumable state: 'after' names no object ({exc})") from None
        return after[0], after[1]
    raise ResumeError(
        f"not a resumable state: 'after' must be None or [input index >= 0, gs:// URL], got {brief(after)}"
    )


def check_listing_position(after: tuple[int, str], inputs: Sequence[str]) -> None:
    """Raise ``ResumeError`` unless the object ``after`` names is one its input (``inputs[index]``) lists: a
    state taken over other inputs would resume in the wrong place, skipping or repeating objects."""
    index, url = after
    if index < len(inputs):
        bucket, name = parse_url(inputs[index])
        listed_bucket, listed = parse_url(url)
        if listed_bucket == bucket and (listed == name or listed.startswith(NameFilter.of(name).root)):
            return
    here = f"input {index} is {printable(inputs[index])}" if index < len(inputs) else f"there are {len(inputs)} inputs"
    raise ResumeError(
        f"this state resumes after {printable(url)}, listed from input {index}, but here {here}: it was taken"
        " over other inputs, and resuming would skip or repeat objects"
    )
