"""Resuming a position in an ordered listing: a fingerprint of the listing to save with the position, and the
check that a saved position belongs to the listing and order it is loaded into, so that a resume never
skips or repeats objects silently (a position counts items, which only means something in the same order)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ResumeError

__all__ = ["fingerprint", "resume_position"]

_SHA256 = re.compile(r"[0-9a-f]{64}")


def fingerprint(urls: Sequence[str]) -> dict[str, Any]:
    """The listing ``urls`` (in order) in brief: how many, and a SHA-256 of them. Generations are left out:
    an object rewritten keeps its place in the order, and a resume reads what it holds now."""
    digest = hashlib.sha256()
    for url in urls:
        encoded = url.encode("utf-8", "surrogatepass")
        digest.update(b"%d:%b" % (len(encoded), encoded))  # lengths first: no two listings hash alike by joining
    return {"objects": len(urls), "sha256": digest.hexdigest()}


def _count(state: Mapping[str, Any], key: str, what: str) -> int:
    value = state.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ResumeError(f"not a resumable state: {what} {key!r} must be an integer >= 0, got {value!r}")
    return value


def resume_position(state: object, listing: dict[str, Any], order: dict[str, Any], share: int) -> tuple[int, int, int]:
    """``(epoch, seed, done)`` from a saved ``state``, checked against this process's ``listing`` (its
    :func:`fingerprint`), ``order`` (what else decides which objects come where: shuffle, split) and
    ``share`` (how many items this epoch holds here).

    A state of ``done == 0`` fits any listing: nothing was read. Otherwise ``ResumeError`` says what differs,
    or what is malformed; a state saved without a fingerprint (by an older version) cannot be checked, and
    is refused too."""
    if not isinstance(state, Mapping):
        raise ResumeError(f"not a resumable state: expected a dict from state_dict(), got {type(state).__name__}")
    epoch, seed, done = _count(state, "epoch", "the"), state.get("seed"), _count(state, "done", "the")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ResumeError(f"not a resumable state: the 'seed' must be an integer, got {seed!r}")
    if done == 0:
        return epoch, seed, done
    restart = f"load {{'epoch': {epoch}, 'seed': {seed}, 'done': 0}} to read epoch {epoch} from its start"
    saved, saved_order = state.get("listing"), state.get("order")
    if saved is None and saved_order is None:
        raise ResumeError(
            f"this state (done {done}) holds no fingerprint of the listing it was taken over (an older version"
            f" saved it), so nothing shows that this dataset lists the same objects in the same order; resuming"
            f" could skip or repeat objects: {restart}"
        )
    if not (isinstance(saved, Mapping) and isinstance(saved_order, Mapping)):
        raise ResumeError(f"not a resumable state: 'listing' and 'order' must be dicts, got {saved!r}, {saved_order!r}")
    objects, digest = _count(saved, "objects", "the listing's"), saved.get("sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise ResumeError(f"not a resumable state: the listing's 'sha256' must be 64 hex digits, got {digest!r}")
    if digest != listing["sha256"] or objects != listing["objects"]:
        changed = "" if objects != listing["objects"] else " (as many, but not the same names in the same order)"
        raise ResumeError(
            f"this state was taken over a listing of {objects:,} objects; this dataset lists {listing['objects']:,}"
            f"{changed}: resuming after {done} items would skip or repeat objects. Make the dataset over the same"
            f" objects (the (url, ObjectInfo) pairs, or a manifest=), or {restart}"
        )
    differs = [
        f"{key} {saved_order.get(key)!r} then, {value!r} now"
        for key, value in order.items()
        if saved_order.get(key) != value
    ]
    if differs:
        raise ResumeError(
            f"this state was taken in another order ({', '.join(differs)}): resuming after {done} items would skip"
            f" or repeat objects; {restart}"
        )
    if done > share:
        raise ResumeError(f"not a resumable state: done {done}, but the epoch holds {share} items here")
    return epoch, seed, done
