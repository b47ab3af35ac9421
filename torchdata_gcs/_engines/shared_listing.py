"""A listing shared by every replica of a job: listed by one, published as a manifest, read by all.

With N workers on each of M ranks, every replica of a DataPipe graph would list the bucket; here they
meet at a manifest folder in GCS, the manifest named by a hash of what was asked (input URLs and
masks). A replica that finds the manifest reads it (one GET). Otherwise the replicas race to create a
lock object with ``ifGenerationMatch=0``; the winner lists, streaming names to its own consumer, and
publishes the manifest when the listing is complete; the others poll the lock and read the manifest
once the lock is gone. The holder rewrites the lock every ``LEASE / 4`` seconds; a lock whose
generation stays the same for ``LEASE`` seconds belongs to a replica that died and is taken over. A
listing that fails publishes nothing and releases the lock, so another replica tries.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, final

from .._ops.checksums import ObjectInfo
from .._ops.client import Client
from .._ops.objects import TEMPORARY_CLASS
from .._ops.urls import format_url, parse_url
from ..errors import GCSError, IntegrityError, InvalidURIError, PreconditionFailedError

logger = logging.getLogger(__name__)

__all__ = ["LEASE", "Entry", "SharedListing"]

FORMAT = 2
"""Version of the manifest's lines (part of its name: a manifest of another version is never read).
2: each object's storage class after its size, generation and crc32c."""
_EXPANSION = 100
"""A manifest decompresses to at most this many times its size (its lines hold checksums and
generations, which compress little): a small object cannot unpack into gigabytes."""
LEASE = 30.0
"""Seconds a lock may go without being rewritten before other replicas take it over."""

Entry = tuple[int, str, ObjectInfo | None]
"""One listed object: the index of the input it came from, its URL, its metadata (if asked for)."""


class SharedListing:
    """The manifest and lock of one listing request under a ``gs://bucket/folder/`` URL; ``selects(index, url)``
    says whether listing ``inputs[index]`` could yield ``url`` (what a manifest's entries are checked against)."""

    def __init__(
        self, client: Client, folder: str, inputs: list[str], masks: list[str], selects: Callable[[int, str], bool]
    ) -> None:
        bucket, name = parse_url(folder)
        if name and not name.endswith("/"):
            raise InvalidURIError(f"a manifest folder must end with '/': {folder!r}", url=folder)
        self.client, self.bucket, self.selects = client, bucket, selects
        self.request: dict[str, Any] = {"format": FORMAT, "inputs": inputs, "masks": masks}
        key = hashlib.sha256(json.dumps(self.request, sort_keys=True).encode()).hexdigest()[:32]
        self.manifest_name = f"{name}{key}.jsonl.gz"
        self.lock_name = f"{name}{key}.lock"
        self.url = format_url(bucket, self.manifest_name)

    def entries(self, list_all: Callable[[], Iterable[list[Entry]]]) -> Iterator[list[Entry]]:
        """The listing in batches: read from the manifest, or listed here with ``list_all`` and published."""
        while True:
            published = self._read()
            if published is None and (lock := self._claim()) is not None:
                try:
                    published = self._read()  # published between our first look and the claim?
                except IntegrityError:
                    lock.release()
                    raise
                if published is None:
                    yield from self._list_and_publish(list_all, lock)
                    return
                lock.release()
            if published is not None:
                yield published
                return
            self._wait_for_lock_release()

    # Anyone who may write the folder may write the manifest, so it is checked when read: its header must
    # name this request, and every entry must be one that listing its input could have yielded (that
    # input's bucket, under its prefix, kept by its glob and masks), in listing order, with well-formed
    # metadata. A manifest that is not is refused, never rebuilt over: one that a replica read may
    # already have shaped the job's other replicas.
    def _read(self) -> list[Entry] | None:
        """The published listing; ``None`` if there is none; ``IntegrityError`` if it is not one this
        request published."""
        data = self.client.read(self.bucket, self.manifest_name)
        if data is None:
            return None
        try:
            entries = self._parse(data)
        except (OSError, EOFError, zlib.error, ValueError) as exc:  # gzip, JSON, UTF-8, URL or shape
            raise IntegrityError(
                f"manifest {self.url} is not one this listing published ({exc}): delete it, or give another "
                "manifest folder, to list anew",
                url=self.url,
            ) from exc
        logger.debug("read %d listed objects from %s", len(entries), self.url)
        return entries

    def _parse(self, data: bytes) -> list[Entry]:
        """The entries of a manifest's bytes; ``ValueError`` (or a decompression error) if it is not
        complete, not of this request, or holds an entry its input could not have listed."""
        unpacker = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip
        text = unpacker.decompress(data, _EXPANSION * len(data) + 65_536)
        if unpacker.unconsumed_tail or not unpacker.eof or unpacker.unused_data:
            raise ValueError("not one whole gzip stream of a listing's size")
        lines = text.decode("utf-8").split("\n")
        header = json.loads(lines[0])
        if not isinstance(header, dict) or {key: header.get(key) for key in self.request} != self.request:
            raise ValueError("its header names another listing")
        if header.get("objects") != len(lines) - 1:
            raise ValueError(f"its header counts {header.get('objects')!r} objects, it lists {len(lines) - 1}")
        entries: list[Entry] = []
        previous: tuple[int, str] = (-1, "")
        for number, line in enumerate(lines[1:], start=2):
            entry = self._entry(json.loads(line))
            if entry is None or (entry[0], entry[1]) <= previous:
                raise ValueError(f"line {number} is not an object its input lists, after the one before it")
            previous = entry[0], entry[1]
            entries.append(entry)
        return entries

    def _entry(self, fields: object) -> Entry | None:
        """One manifest line's entry, or ``None`` if it is not one that listing its input could yield."""
        if not isinstance(fields, list) or len(fields) != 6:
            return None
        index, url, size, generation, crc32c, storage_class = fields
        well_formed = (
            _whole(index, 0, len(self.request["inputs"]) - 1)
            and isinstance(url, str)
            and _whole(size, 0)
            and _whole(generation, 1)
            and (crc32c is None or (isinstance(crc32c, str) and len(crc32c) == 8))
            and (storage_class is None or isinstance(storage_class, str))
        )
        if not well_formed or not self.selects(index, url):
            return None
        return index, url, ObjectInfo(size, generation, crc32c, storage_class)

    def _claim(self) -> _Lock | None:
        """Create the lock; ``None`` if another replica holds it."""
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}".encode()
        try:
            generation = self.client.create(
                self.bucket, self.lock_name, owner, if_generation_match=0, storage_class=TEMPORARY_CLASS
            )
        except PreconditionFailedError:
            # A retried create may have met its own first attempt: the lock is ours if it holds our name.
            if self.client.read(self.bucket, self.lock_name) != owner:
                return None
            resource = self.client.head(self.bucket, self.lock_name, "generation")
            if resource is None:  # ours, and already taken over and released
                return None
            generation = int(resource["generation"])
        return _Lock(self, owner, generation)

    def _wait_for_lock_release(self) -> None:
        """Poll the lock until it is gone, taking it away from a holder that stopped rewriting it."""
        seen: str | None = None
        since, delay = time.monotonic(), 0.05
        while True:
            resource = self.client.head(self.bucket, self.lock_name, "generation")
            if resource is None:
                return
            if resource["generation"] != seen:
                seen, since = resource["generation"], time.monotonic()
            elif time.monotonic() - since > LEASE:
                logger.warning("taking over the listing lock %s: its holder stopped renewing it", self.lock_name)
                try:
                    self.client.delete(self.bucket, self.lock_name, if_generation_match=int(resource["generation"]))
                except PreconditionFailedError:  # renewed or taken over meanwhile: someone holds it
                    seen, since = None, time.monotonic()
                    continue
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _list_and_publish(self, list_all: Callable[[], Iterable[list[Entry]]], lock: _Lock) -> Iterator[list[Entry]]:
        """List on a background thread (so the manifest is published at listing speed) and stream."""
        recorded: list[list[Entry]] = []
        outcome: list[BaseException | None] = []  # one element once the listing has ended
        changed = threading.Condition()

        def run() -> None:
            error: BaseException | None = None
            try:
                with lock:
                    for batch in list_all():
                        with changed:
                            recorded.append(batch)
                            changed.notify_all()
                    self._publish([entry for batch in recorded for entry in batch])
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                error = exc
            with changed:
                outcome.append(error)
                changed.notify_all()

        threading.Thread(target=run, name="torchdata-gcs-shared-listing", daemon=True).start()
        position = 0

        def more_or_ended() -> bool:
            return len(recorded) > position or bool(outcome)

        while True:
            with changed:
                changed.wait_for(more_or_ended)
                ready = recorded[position:]
            position += len(ready)
            yield from ready
            if not ready and outcome:
                if outcome[0] is not None:
                    raise outcome[0]
                return

    def _publish(self, entries: list[Entry]) -> None:
        header = json.dumps({**self.request, "objects": len(entries), "created": time.time()})
        lines = [header] + [json.dumps([index, url, *info]) for index, url, info in entries]  # type: ignore[misc]  # a manifest's entries always carry their metadata
        data = gzip.compress("\n".join(lines).encode("utf-8"), compresslevel=5)
        try:
            self.client.create(
                self.bucket, self.manifest_name, data, if_generation_match=0, content_type="application/gzip"
            )
        except PreconditionFailedError:
            pass  # a replica that took over a lock thought stale published first; its listing stands
        logger.debug("published %d listed objects to %s", len(entries), self.url)


def _whole(value: object, low: int, high: int | None = None) -> bool:
    """Whether ``value`` is an integer (a JSON number without a fraction) from ``low`` to ``high``."""
    return type(value) is int and value >= low and (high is None or value <= high)


@final
class _Lock:
    """A held listing lock, rewritten every ``LEASE / 4`` seconds while held."""

    def __init__(self, shared: SharedListing, owner: bytes, generation: int) -> None:
        self.shared, self.owner, self.generation = shared, owner, generation
        self._released = threading.Event()
        self._mutex = threading.Lock()  # a renewal and the release never interleave

    def __enter__(self) -> _Lock:
        threading.Thread(target=self._renew, name="torchdata-gcs-listing-lock", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        shared = self.shared
        with self._mutex:
            self._released.set()
            try:
                shared.client.delete(shared.bucket, shared.lock_name, if_generation_match=self.generation)
            except GCSError as exc:  # taken over meanwhile: the new holder removes it
                logger.warning("could not remove the listing lock %s: %s", shared.lock_name, exc)

    def _renew(self) -> None:
        shared = self.shared
        while not self._released.wait(LEASE / 4):
            with self._mutex:
                if self._released.is_set():
                    return
                try:
                    self.generation = shared.client.create(
                        shared.bucket,
                        shared.lock_name,
                        self.owner,
                        if_generation_match=self.generation,
                        storage_class=TEMPORARY_CLASS,
                    )
                except GCSError as exc:  # taken over; this listing still completes and publishes
                    logger.warning("could not renew the listing lock %s: %s", shared.lock_name, exc)
                    return
