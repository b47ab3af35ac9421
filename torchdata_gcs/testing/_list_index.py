"""List pages answered from a sorted snapshot of a bucket's objects, as GCS would answer them.

fake-gcs-server re-reads and sorts the whole bucket for every list page (its cost per page is in
``benchmarks/README.md``, the rig), so a listing benchmark on it measures the emulator. A :class:`ListingIndex`
answers the same requests from memory in microseconds, so the client's side is what gets measured.
It supports what listing clients use: ``prefix``, ``startOffset``, ``endOffset``, ``maxResults``
(capped at 1,000 like GCS), ``pageToken`` and ``fields``; anything else (``delimiter``,
``versions``, ``matchGlob``, ...) is left to the emulator.
"""

from __future__ import annotations

import base64
import bisect
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from .._ops.paging import MAX_PAGE_SIZE

__all__ = ["ListingIndex", "ListingSnapshots", "parse_fields"]

_SUPPORTED = frozenset(
    {
        "prefix",
        "startOffset",
        "endOffset",
        "maxResults",
        "pageToken",
        "fields",
        "projection",
        "prettyPrint",
        "userProject",
    }
)


def parse_fields(fields: str) -> dict[str, set[str] | None]:
    """Parse a ``fields`` selector such as ``items(name,size),nextPageToken``.

    Returns each top-level field with its selected sub-fields (``None``: the whole value).

    >>> selected = parse_fields("items(name,size),nextPageToken")
    >>> sorted(selected["items"]), selected["nextPageToken"]
    (['name', 'size'], None)
    """
    selected: dict[str, set[str] | None] = {}
    depth, start = 0, 0
    for index, char in enumerate(fields + ","):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            entry = fields[start:index].strip()
            start = index + 1
            if not entry:
                continue
            name, _, inner = entry.partition("(")
            selected[name.strip()] = {part.strip() for part in inner.rstrip(")").split(",")} if inner else None
    if depth != 0:
        raise ValueError(f"unbalanced parentheses in fields={fields!r}")
    return selected


def _encode_token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii")


def _decode_token(token: str) -> str:
    return base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")


class ListingIndex:
    """A bucket's object resources, sorted by name (GCS's order: code points, which UTF-8 bytes follow)."""

    def __init__(self, resources: Iterable[Mapping[str, Any]]) -> None:
        self._resources = sorted(resources, key=lambda resource: resource["name"])
        self._names = [resource["name"] for resource in self._resources]

    def __len__(self) -> int:
        return len(self._names)

    def page(self, params: Mapping[str, str]) -> dict[str, Any] | None:
        """The JSON answer to a list request with ``params``, or ``None`` if it uses what is unsupported.

        Raises ``ValueError`` for a malformed ``maxResults``, ``pageToken`` or ``fields``.
        """
        if not params.keys() <= _SUPPORTED:
            return None
        prefix = params.get("prefix", "")
        size = min(int(params.get("maxResults", MAX_PAGE_SIZE)), MAX_PAGE_SIZE)
        if size < 1:
            raise ValueError(f"maxResults must be positive, got {size}")
        first = max(prefix, params.get("startOffset", ""))
        if "pageToken" in params:
            first = max(first, _decode_token(params["pageToken"]))
        index = bisect.bisect_left(self._names, first)
        end_offset = params.get("endOffset")
        items: list[Mapping[str, Any]] = []
        while index < len(self._names) and len(items) < size:
            name = self._names[index]
            if not name.startswith(prefix) or (end_offset and name >= end_offset):
                break
            items.append(self._resources[index])
            index += 1
        more = (
            index < len(self._names)
            and self._names[index].startswith(prefix)
            and not (end_offset and self._names[index] >= end_offset)
        )
        answer: dict[str, Any] = {"kind": "storage#objects"}
        if items:
            answer["items"] = items
        if more:
            answer["nextPageToken"] = _encode_token(self._names[index])
        if "fields" in params:
            answer = self._select(answer, parse_fields(params["fields"]))
        return answer

    @staticmethod
    def _select(answer: dict[str, Any], fields: dict[str, set[str] | None]) -> dict[str, Any]:
        selected: dict[str, Any] = {}
        for key, sub in fields.items():
            if key not in answer:
                continue
            value = answer[key]
            if sub is not None and key == "items":
                value = [{name: item[name] for name in sub if name in item} for item in value]
            selected[key] = value
        return selected


class ListingSnapshots:
    """The snapshots a front answers list requests from, by bucket (see ``GCSFront.index_listings``); a write
    through the front drops them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._indexes: dict[str, ListingIndex] = {}

    def keep(self, bucket: str, index: ListingIndex) -> None:
        with self._lock:
            self._indexes[bucket] = index

    def of(self, bucket: str) -> ListingIndex | None:
        return self._indexes.get(bucket)

    def forget(self) -> None:
        with self._lock:
            self._indexes = {}
