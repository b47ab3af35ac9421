"""Bucket settings the emulator lacks, and what two of them do to deletes: soft delete and default holds.

fake-gcs-server reports every bucket as Standard, without Autoclass, lifecycle rules or a soft delete
policy; it deletes objects for good, ignores ``softDeleted=true`` (answering with the live objects) and
never holds an object. :class:`BucketOverlay` keeps, per bucket, the settings a test gives it, merges them
into ``buckets.get`` answers, and makes soft delete, default event-based holds and the default storage
class act as GCS documents (what each does, and what is not modelled, is said beside the class).
"""

from __future__ import annotations

import datetime
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from .._ops.paging import MAX_PAGE_SIZE
from ._gcs_rules import NO_SUCH_BUCKET, Refusal

__all__ = ["SETTINGS", "BucketOverlay", "Deletion"]

SETTINGS = frozenset({"storageClass", "autoclass", "defaultEventBasedHold", "lifecycle", "softDeletePolicy"})
"""The ``buckets.get`` fields a test may set."""

Ask = Callable[[str], "tuple[int, bytes]"]
"""A GET of a path upstream: its status and body."""


def _rfc3339(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _field_names(fields: str | None) -> set[str] | None:
    """The top-level names a ``fields`` selector keeps (``None``: everything).

    Examples:
        >>> sorted(_field_names("location,softDeletePolicy/retentionDurationSeconds,autoclass(enabled)"))
        ['autoclass', 'location', 'softDeletePolicy']
    """
    if fields is None:
        return None
    names, depth, current = set(), 0, ""
    for char in fields + ",":
        if char == "," and depth == 0:
            names.add(current.split("/")[0].split("(")[0].strip())
            current = ""
            continue
        depth += (char == "(") - (char == ")")
        current += char
    return names - {""}


@dataclass
class Deletion:
    """A DELETE the front is about to forward: GCS's refusal of it (a held object), or, in a bucket with soft
    delete, the soft-deleted copy recorded before it goes (so a listing right after its answer shows it);
    :meth:`settle` drops that copy again if the object is still there afterwards (the delete failed)."""

    refusal: Refusal | None = None
    settle: Callable[[], None] = field(default=lambda: None)


# What the settings do, as GCS documents:
# - with ``softDeletePolicy.retentionDurationSeconds`` above 0, an object deleted through the front is kept
#   as soft deleted (``softDeleteTime``, ``hardDeleteTime``) until its ``hardDeleteTime``; only a
#   ``softDeleted=true`` listing shows it, and no request removes it sooner (disabling soft delete keeps
#   what is already soft deleted);
# - with ``defaultEventBasedHold``, every object created from then on is held (``eventBasedHold: true``):
#   its delete is refused with GCS's 403;
# - with ``storageClass``, an object created by a JSON API multipart upload whose metadata names no class
#   takes the bucket's (the emulator would make it Standard).
# Not modelled: releasing a hold, overwrites of held objects, restores, soft delete of objects replaced
# by an upload or of noncurrent versions, the default class of objects created otherwise (media and
# resumable uploads, XML API writes).
class BucketOverlay:
    """Per-bucket settings layered over the emulator's, and the soft-deleted objects they keep.

    Examples:
        >>> overlay = BucketOverlay(lambda path: (404, b""))
        >>> overlay.update("bkt", {"storageClass": "NEARLINE"})
        >>> overlay.settings("bkt")
        {'storageClass': 'NEARLINE'}
    """

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._lock = threading.Lock()
        self._settings: dict[str, dict[str, Any]] = {}
        self._held_from: dict[str, int] = {}  # bucket -> first generation (µs since the epoch, as GCS's) held
        self._soft_deleted: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}

    def update(self, bucket: str, settings: Mapping[str, Any]) -> None:
        """Set ``settings`` (fields of :data:`SETTINGS`, as GCS's bucket resource spells them) on ``bucket``;
        ``None`` removes one. Turning ``defaultEventBasedHold`` on holds every object created from now on."""
        unknown = set(settings) - SETTINGS
        if unknown:
            raise ValueError(f"not a bucket setting the front models: {', '.join(sorted(unknown))}")
        with self._lock:
            current = self._settings.setdefault(bucket, {})
            for key, value in settings.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            if current.get("defaultEventBasedHold"):
                self._held_from.setdefault(bucket, int(time.time() * 1e6))
            else:
                self._held_from.pop(bucket, None)

    def settings(self, bucket: str) -> dict[str, Any]:
        """The settings given for ``bucket`` (a copy)."""
        with self._lock:
            return dict(self._settings.get(bucket, {}))

    def soft_deleted(self, bucket: str) -> list[dict[str, Any]]:
        """The soft-deleted objects of ``bucket`` not yet past their ``hardDeleteTime``, by name and generation."""
        now = time.time()
        with self._lock:
            kept = self._soft_deleted.get(bucket, {})
            for key in [key for key, item in kept.items() if item["_hard_delete"] <= now]:
                del kept[key]
            items = [kept[key] for key in sorted(kept)]
        return [{key: value for key, value in item.items() if not key.startswith("_")} for item in items]

    def soft_delete(self, bucket: str, name: str, generation: int, size: int) -> bool:
        """Keep ``bucket/name#generation`` as soft deleted if the bucket's policy says so; whether it was kept."""
        seconds = int((self.settings(bucket).get("softDeletePolicy") or {}).get("retentionDurationSeconds", 0))
        if seconds <= 0:
            return False
        now = time.time()
        item = {
            "kind": "storage#object",
            "bucket": bucket,
            "name": name,
            "generation": str(generation),
            "size": str(size),
            "softDeleteTime": _rfc3339(now),
            "hardDeleteTime": _rfc3339(now + seconds),
            "_hard_delete": now + seconds,
        }
        with self._lock:
            self._soft_deleted.setdefault(bucket, {})[(name, generation)] = item
        return True

    def forget(self, bucket: str, name: str, generation: int) -> None:
        """Drop a soft-deleted copy recorded for a delete that did not happen."""
        with self._lock:
            self._soft_deleted.get(bucket, {}).pop((name, generation), None)

    def held(self, bucket: str, generation: int) -> bool:
        """Whether an object of ``bucket`` at ``generation`` carries the default event-based hold."""
        with self._lock:
            start = self._held_from.get(bucket)
        return start is not None and generation >= start

    @staticmethod
    def hold_refusal(bucket: str, name: str) -> Refusal:
        """GCS's 403 for deleting a held object."""
        message = (
            f"Object '{bucket}/{name}' is under active Event-Based hold and cannot be deleted, overwritten or "
            "archived until hold is removed."
        )
        return 403, "Forbidden", message

    # -- the front's hooks ------------------------------------------------------------------------

    def answer(self, path: str, body: bytes) -> bytes:
        """A JSON answer as GCS would give it with these settings: a ``buckets.get`` answer (``path`` is
        ``/storage/v1/b/B?query``) with B's settings merged in, and object resources (one, or a listing's
        ``items``) of a bucket with a default event-based hold marked ``eventBasedHold`` when held; each
        trimmed to the request's ``fields`` as GCS trims. Other answers unchanged."""
        route, _, query = path.partition("?")
        parts = route.split("/")
        if len(parts) < 5 or parts[1:4] != ["storage", "v1", "b"]:
            return body
        bucket = unquote(parts[4])
        settings = self.settings(bucket)
        if not settings:
            return body
        wanted = _field_names(dict(parse_qsl(query, keep_blank_values=True)).get("fields"))
        document = json.loads(body)
        if len(parts) == 5:
            document.update({key: value for key, value in settings.items() if wanted is None or key in wanted})
        elif wanted is None or "eventBasedHold" in wanted or "items" in wanted:
            for resource in document.get("items", [document]):
                if "generation" in resource and self.held(bucket, int(resource["generation"])):
                    resource["eventBasedHold"] = True
        return json.dumps(document).encode()

    def deletion(self, bucket: str | None, name: str | None, params: Mapping[str, str]) -> Deletion | None:
        """What a JSON API object DELETE meets in this bucket: a hold's refusal, or a soft-deleted copy kept;
        ``None`` where the overlay has nothing to do (no hold, no soft delete, not an object)."""
        if bucket is None or name is None:
            return None
        settings = self.settings(bucket)
        soft = int((settings.get("softDeletePolicy") or {}).get("retentionDurationSeconds", 0)) > 0
        if not soft and not settings.get("defaultEventBasedHold"):
            return None
        version = self._version(bucket, name, params.get("generation"))
        if version is None:  # upstream answers the 404
            return None
        generation, size = version
        if self.held(bucket, generation):
            return Deletion(refusal=self.hold_refusal(bucket, name))
        if not self.soft_delete(bucket, name, generation, size):
            return None

        def settle() -> None:
            if self._version(bucket, name, str(generation)) is not None:
                self.forget(bucket, name, generation)

        return Deletion(settle=settle)

    def upload_body(self, path: str, content_type: str, body: Iterator[bytes]) -> tuple[Iterator[bytes], int]:
        """A JSON API multipart upload's body (``path`` is ``/upload/storage/v1/b/B/o?query``) with B's default
        storage class in the object's metadata where it names none, as GCS gives a new object, and how many
        bytes longer it got. Other requests, and bodies not of that form, go unchanged (upstream answers them)."""
        route, _, query = path.partition("?")
        parts = route.split("/")
        if len(parts) < 7 or parts[1:5] != ["upload", "storage", "v1", "b"]:
            return body, 0
        default = self.settings(unquote(parts[5])).get("storageClass")
        if not default or dict(parse_qsl(query)).get("uploadType") != "multipart":
            return body, 0
        first = next(body, b"")
        kept = itertools.chain([first], body)
        boundary = content_type.partition("boundary=")[2].split(";")[0].strip().strip('"').encode()
        start = first.find(b"\r\n\r\n") + 4  # the metadata part's JSON, the first piece holds it whole
        end = first.find(b"\r\n--" + boundary, start) if boundary and start >= 4 else -1
        try:
            resource = json.loads(first[start:end]) if end > 0 else None
        except ValueError:
            resource = None
        if not isinstance(resource, dict) or "storageClass" in resource:
            return kept, 0
        metadata = json.dumps({**resource, "storageClass": default}).encode()
        rewritten = first[:start] + metadata + first[end:]
        return itertools.chain([rewritten], body), len(rewritten) - len(first)

    def listing(self, path: str) -> dict[str, Any] | Refusal | None:
        """GCS's answer to a ``softDeleted=true`` object listing (``path`` is ``/storage/v1/b/B/o?query``), which
        the emulator ignores; ``None`` for any other request. ``prefix``, ``maxResults`` (at most 1,000) and
        ``pageToken`` apply; ``versions=true`` with it is refused with 400."""
        route, _, query = path.partition("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        parts = route.rstrip("/").split("/")
        if params.get("softDeleted") != "true" or len(parts) != 6 or parts[1:4] != ["storage", "v1", "b"]:
            return None
        bucket = unquote(parts[4])
        if params.get("versions") == "true":
            return 400, "Bad Request", "softDeleted and versions cannot both be true in one listing."
        if self._ask(f"/storage/v1/b/{quote(bucket, safe='')}?fields=name")[0] != 200:
            return 404, "Not Found", NO_SUCH_BUCKET
        prefix, after = params.get("prefix", ""), params.get("pageToken", "")
        size = min(int(params.get("maxResults") or MAX_PAGE_SIZE), MAX_PAGE_SIZE)
        items = [
            item
            for item in self.soft_deleted(bucket)
            if item["name"].startswith(prefix) and f"{item['name']}#{int(item['generation']):020d}" > after
        ]
        page: dict[str, Any] = {"kind": "storage#objects"}
        if items[:size]:
            page["items"] = items[:size]
        if len(items) > size:
            last = items[size - 1]
            page["nextPageToken"] = f"{last['name']}#{int(last['generation']):020d}"
        return page

    def _version(self, bucket: str, name: str, generation: str | None) -> tuple[int, int] | None:
        """Generation and size of ``bucket/name`` (at ``generation``, else the live one) upstream, if it exists."""
        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?fields=generation,size"
        status, body = self._ask(path + (f"&generation={generation}" if generation else ""))
        if status != 200:
            return None
        resource = json.loads(body)
        return int(resource["generation"]), int(resource.get("size", 0))
