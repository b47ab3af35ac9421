"""Compose runs of small objects server-side, download each composite once, split it back.

One :class:`Composer` serves one iteration. Consecutive objects of one bucket and one storage class
are grouped (at most ``MAX_SOURCES`` and ``max_bytes`` each), as GCS composes only sources of one
class, and only classes the caller allows (Standard by default: a composite has its sources' class,
and deleting a cold one pays its minimum storage duration); others are loaded directly. A group is
composed in one call, its sources pinned to their listed generations; the composite is read through
the loader's data path and cut back by the listed sizes, each piece checked against its listed
crc32c. A group whose compose is refused, or whose composite is wrong, is loaded object by object, so
a changed object raises (or is skipped) exactly as ``load_files_by_gcs`` would.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from concurrent.futures import Future as ConcurrentFuture
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from .._ops.checksums import ObjectInfo, crc32c_base64, crc32c_of_concatenation, crc32c_value
from .._ops.client import Client
from .._ops.objects import MAX_SOURCES, TEMPORARY_CLASS, compose_object, create_object, delete_object
from .._ops.paging import MAX_PAGE_SIZE
from .._ops.temporaries import DeletePrefix, delete_temporary, new_job_id
from .._ops.urls import TEMPORARY_PREFIX, format_url, parse_url, validate_object_name
from .._transport import lifecycle, reaper
from .._transport.context import RequestContext
from .._transport.loop import run, submit, wait_unless_on_io_loop
from ..config import require_integer
from ..errors import (
    AccessDeniedError,
    ComposeFallbackWarning,
    GCSError,
    IntegrityError,
    InvalidURIError,
    NotFoundError,
    PreconditionFailedError,
)
from .download import CachedReads, Loaded, Outcome, Unit, deliver_in_order, fetch_object, load_one
from .listing import describe, list_objects_async
from .local_cache import CacheEntry, LocalCache

logger = logging.getLogger(__name__)

__all__ = [
    "COMPOSED_CLASSES",
    "Composer",
    "KEPT_COMPOSITES_REMEMBERED",
    "check_reuse_prefix",
    "Composing",
    "check_storage_classes",
]

COMPOSED_CLASSES = ("STANDARD",)
"""Storage classes whose objects are composed by default: a composite has its sources' class, and a
Nearline, Coldline or Archive one deleted after reading pays 30, 90 or 365 days of storage."""

_DESCRIBE_BATCH = 256  # plain URLs whose metadata is fetched at once
_CLOSE_TIMEOUT = 60.0

KEPT_COMPOSITES_REMEMBERED = 100_000
"""Kept composites whose generation a process remembers (about 200 bytes each): past that, the one used
longest ago is forgotten, and composed again if it is met again."""

_composed: OrderedDict[tuple[str, str, str], int] = OrderedDict()
"""(endpoint, bucket, name) -> generation of each kept composite this process composed (a forked
worker inherits its parent's), the most recently used last: the only versions of kept composites read."""


def _remember(key: tuple[str, str, str], generation: int) -> None:
    _composed[key] = generation
    _composed.move_to_end(key)
    while len(_composed) > KEPT_COMPOSITES_REMEMBERED:
        _composed.popitem(last=False)


def check_reuse_prefix(prefix: str | None) -> None:
    """Raise ``InvalidURIError`` unless ``prefix`` (if given) can hold kept composites: an object-name
    prefix ending in ``/``, outside the temporary objects' prefix."""
    if prefix is None:
        return
    validate_object_name(prefix, allow_empty=False)
    if not prefix.endswith("/") or prefix.startswith(TEMPORARY_PREFIX):
        raise InvalidURIError(f"reuse_prefix must end with '/' and lie outside {TEMPORARY_PREFIX!r}, got {prefix!r}")


def check_storage_classes(storage_classes: Iterable[str]) -> tuple[str, ...]:
    """``storage_classes`` as a tuple; ``ValueError`` unless it is a collection of class names such
    as ``"STANDARD"`` (a bare string is one name, not a collection of letters)."""
    names = (storage_classes,) if isinstance(storage_classes, str) else tuple(storage_classes)
    if isinstance(storage_classes, str) or not all(isinstance(n, str) and n.isupper() for n in names):
        raise ValueError(f"storage_classes must be a collection of names such as 'STANDARD', got {storage_classes!r}")
    return names


Member = tuple[str, str, ObjectInfo]  # url, object name, listed version


# Temporary composites live under ``TEMPORARY_PREFIX/<time>-<host>-<pid>-<random>/`` and are deleted once
# downloaded; Composer.close waits for composes still running and deletes whatever is left, and runs at
# the end of iteration, on early stop, on exceptions, and at interpreter or worker exit. Before a bucket's
# first temporary object is written, its job prefix is handed to the process's reaper, which deletes
# every version under it if the process ends (SIGTERM, SIGKILL) before the composer is closed. With
# ``reuse_prefix`` composites are kept, named by a hash of their sources, and that prefix's listing is
# the manifest later iterations consult.
class Composer:
    """One iteration's compose-and-split work and the temporary objects it owns; ``client`` is the
    front end's handle, whose context serves the iteration."""

    def __init__(
        self,
        client: Client,
        *,
        max_sources: int,
        max_bytes: int,
        reuse_prefix: str | None,
        storage_classes: Iterable[str] = COMPOSED_CLASSES,
    ) -> None:
        self.client = client
        self.context = client.context()
        self.max_sources = max_sources
        self.storage_classes = frozenset(storage_classes)
        self.max_bytes = min(max_bytes, self.context.budget.limit // 2)  # a composite is always held whole
        self.reuse_prefix = reuse_prefix
        self.job_id = new_job_id()
        self._names = 0
        self._prepared: dict[str, ConcurrentFuture[tuple[bool, str | None]]] = {}  # bucket -> its preparation
        self._usable: dict[str, bool] = {}  # bucket -> may compose there
        self._cache: dict[str, dict[str, ObjectInfo]] = {}  # bucket -> kept composites (reuse mode)
        self._cached_before: set[str] = set()  # buckets whose cache was not empty at the start
        self._unsettled: set[tuple[str, str]] = set()  # composites that may exist and are not ours to keep
        self._running: set[asyncio.Future[Any]] = set()  # composes and deletes in flight
        self._found = 0  # groups whose kept composite existed (reuse mode)
        self._warned_unknown_class = False
        self._warned_refusal = False
        self._watches: list[reaper.Watch | None] = []  # this job's prefixes in the reaper's hands
        self._closed = False
        _live.add(self)
        lifecycle.cleanup(_close_all, pending=_any_live)  # at interpreter and worker exit
        lifecycle.after_fork(_forget_after_fork)
        lifecycle.watch_parent()
        reaper.start_soon()

    # -- planning (consumer thread; preparation in a worker thread) ---------------------------------------------

    def units(self, items: Iterable[tuple[str, ObjectInfo | None]], cache: CachedReads | None = None) -> Iterator[Unit]:
        """Group consecutive items of one bucket and storage class into compose units; the rest become
        single-object loads. With a ``cache``, an object found there ends the run and is read from it, and
        the members of a composite are kept there (the objects, not the composite)."""
        group: list[Member] = []
        group_key = ("", "")
        group_bytes = 0

        def flush() -> Iterator[Unit]:
            nonlocal group, group_bytes
            if len(group) == 1:
                url, _, info = group[0]
                yield cache.loading(url, info) if cache is not None else functools.partial(load_one, url, info)
            elif group:
                yield functools.partial(self._load_group, group, cache)
            group, group_bytes = [], 0

        for url, info in self._described(items):
            if isinstance(info, NotFoundError):
                yield from flush()
                yield functools.partial(_missing, url, info)
                continue
            bucket, name = parse_url(url, allow_prefix=False)
            found = cache.found(url, info) if cache is not None else None
            if found is not None:
                yield from flush()
                yield found
                continue
            if info.size > self.max_bytes or not self._may_compose(url, info) or not self._may_compose_in(bucket):
                yield from flush()
                yield cache.loading(url, info) if cache is not None else functools.partial(load_one, url, info)
                continue
            key = (bucket, info.storage_class or "")
            if key != group_key or len(group) == self.max_sources or group_bytes + info.size > self.max_bytes:
                yield from flush()
            group_key = key
            group.append((url, name, info))
            group_bytes += info.size
        yield from flush()

    def _described(
        self, items: Iterable[tuple[str, ObjectInfo | None]]
    ) -> Iterator[tuple[str, ObjectInfo | NotFoundError]]:
        """The items with metadata, a plain URL's fetched (in concurrent batches) only when unknown.
        Each bucket's preparation starts as its first item passes, and runs meanwhile."""
        pending: list[str] = []

        def resolve() -> Iterator[tuple[str, ObjectInfo | NotFoundError]]:
            yield from zip(pending, run(describe(self.context, pending)), strict=True)
            pending.clear()

        for url, info in items:
            self._prepare_soon(parse_url(url, allow_prefix=False)[0])
            if info is None:
                pending.append(url)
                if len(pending) == _DESCRIBE_BATCH:
                    yield from resolve()
                continue
            if pending:
                yield from resolve()
            yield url, info
        if pending:
            yield from resolve()

    def _prepare_soon(self, bucket: str) -> ConcurrentFuture[tuple[bool, str | None]]:
        """Start preparing ``bucket`` (see :meth:`_prepare`) on the I/O loop, once."""
        future = self._prepared.get(bucket)
        if future is None:

            async def prepare() -> tuple[bool, str | None]:
                return await self._track(self._prepare(bucket))

            future = self._prepared[bucket] = submit(prepare())
        return future

    async def _prepare(self, bucket: str) -> tuple[bool, str | None]:
        """Whether composites may be written and deleted in ``bucket`` (with the reason if not): tried
        once, by writing and deleting a probe object; in reuse mode, also read the kept composites."""
        client = self.client
        prefix = f"{TEMPORARY_PREFIX}{self.job_id}/"
        task = DeletePrefix(bucket, prefix, client)
        self._watches.append(await asyncio.to_thread(reaper.watch, task))  # waits for the reaper's process
        probe = f"{prefix}probe"
        try:
            self._unsettled.add((bucket, probe))
            generation = await create_object(
                client.call_context(), bucket, probe, b"", if_generation_match=0, storage_class=TEMPORARY_CLASS
            )
            await delete_object(client.call_context(), bucket, probe, generation=generation)
            self._unsettled.discard((bucket, probe))
        except AccessDeniedError as exc:
            self._unsettled.discard((bucket, probe))
            return False, str(exc)
        if self.reuse_prefix is not None:
            listed = [batch async for batch in list_objects_async(client, bucket, self.reuse_prefix, MAX_PAGE_SIZE)]
            self._cache[bucket] = {item["name"]: ObjectInfo.from_json(item) for batch in listed for item in batch}
            if self._cache[bucket]:
                self._cached_before.add(bucket)
        return True, None

    def _may_compose(self, url: str, info: ObjectInfo) -> bool:
        """Whether the object may be a compose source: its storage class is one composed. An unknown
        class (an ``ObjectInfo`` made without it) may be a cold one: loaded directly, with one warning."""
        if info.storage_class is None and not self._warned_unknown_class:
            self._warned_unknown_class = True
            warnings.warn(
                f"compose_shards_by_gcs loads {url} and every other object of unknown storage class one by one: "
                "a composite of cold objects is cold too, and deleting it pays early-deletion charges (give "
                "ObjectInfo a storage_class, or feed list_files_by_gcs(with_metadata=True) or plain URLs)",
                ComposeFallbackWarning,
                stacklevel=4,
            )
        return info.storage_class in self.storage_classes

    def _may_compose_in(self, bucket: str) -> bool:
        """Whether composites may be used in ``bucket``: waits for its preparation if it is still
        running; a refusal means direct loads and one warning."""
        usable = self._usable.get(bucket)
        if usable is None:
            usable, refusal = self._prepare_soon(bucket).result()
            if refusal is not None:
                warnings.warn(
                    f"compose_shards_by_gcs loads objects of gs://{bucket} one by one: these credentials may "
                    f"not create and delete its temporary composites ({refusal})",
                    ComposeFallbackWarning,
                    stacklevel=3,
                )
            self._usable[bucket] = usable
        return usable

    # -- one group (I/O loop) --------------------------------------------------------------------

    async def _load_group(
        self, members: list[Member], cache: CachedReads | None, context: RequestContext, seq: int
    ) -> tuple[list[Outcome], int]:
        outcomes, held = await self._load_members(members, context, seq)
        if cache is not None:
            for (url, _, info), (_, data) in zip(members, outcomes, strict=True):
                await cache.keep(CacheEntry.of(url, info), data)
        return outcomes, held

    async def _load_members(
        self, members: list[Member], context: RequestContext, seq: int
    ) -> tuple[list[Outcome], int]:
        bucket = parse_url(members[0][0], allow_prefix=False)[0]
        name = self._composite_name(members)
        expected = _composite_info(members)
        kept = self._cache.get(bucket, {}).get(name) if self.reuse_prefix is not None else None
        if kept is not None:
            self._found += 1
            if self._made_here(bucket, name, kept):
                loaded = await self._download(bucket, name, kept, expected, members, context, seq)
                if loaded is not None:
                    context.stats.reused += 1
                    return loaded
                logger.warning("kept composite gs://%s/%s does not match its sources: rebuilding it", bucket, name)
        try:
            composite = await self._compose(bucket, name, members, context, kept)
        except (NotFoundError, PreconditionFailedError) as exc:  # a source changed since it was listed
            logger.info(
                "composing %d objects into gs://%s/%s failed (%s): loading them directly",
                len(members),
                bucket,
                name,
                exc,
            )
            return await _load_each(members, context, seq)
        except AccessDeniedError as exc:
            warnings.warn(
                f"compose refused in gs://{bucket}: loading directly ({exc})", ComposeFallbackWarning, stacklevel=1
            )
            self._usable[bucket] = False
            return await _load_each(members, context, seq)
        except GCSError as exc:  # refused for another reason (400, retries run out): this group only
            self._report_refusal(len(members), exc)
            return await _load_each(members, context, seq)
        if self.reuse_prefix is not None:
            _remember((context.session.endpoint, bucket, name), composite.generation)
        loaded = await self._download(bucket, name, composite, expected, members, context, seq)
        return loaded if loaded is not None else await _load_each(members, context, seq)

    # Anyone who may write the reuse prefix may replace a kept composite with bytes of the same size and
    # crc32c (a checksum, not a seal), so one is read only at the generation recorded when this process
    # (or the parent it was forked from) composed it; any other is composed again in its place first.
    def _made_here(self, bucket: str, name: str, kept: ObjectInfo) -> bool:
        """Whether the listed ``kept`` composite is the version this process composed; if not (composed
        elsewhere, or replaced since), it is composed again in its place."""
        key = (self.context.session.endpoint, bucket, name)
        made = _composed.get(key)
        if made == kept.generation:
            _composed.move_to_end(key)
            return True
        if made is None:
            logger.info("kept composite gs://%s/%s was not composed here: composing it again", bucket, name)
        else:
            logger.warning(
                "kept composite gs://%s/%s was replaced (generation %d, composed as %d): composing it again",
                bucket,
                name,
                kept.generation,
                made,
            )
        return False

    def _report_refusal(self, count: int, error: GCSError) -> None:
        """Say that a compose was refused and its objects are loaded directly: the first time in this
        iteration as a warning, later ones in the log."""
        message = f"a compose of {count} objects was refused, loading them directly: {error}"
        if self._warned_refusal:
            logger.info("%s", message)
            return
        self._warned_refusal = True
        warnings.warn(
            f"{message} (later refusals in this iteration are logged only)", ComposeFallbackWarning, stacklevel=1
        )

    def _composite_name(self, members: list[Member]) -> str:
        if self.reuse_prefix is None:
            self._names += 1
            return f"{TEMPORARY_PREFIX}{self.job_id}/{self._names:09d}"
        identity = json.dumps([(name, info.generation, info.size, info.crc32c) for _, name, info in members])
        return self.reuse_prefix + hashlib.sha256(identity.encode()).hexdigest()

    async def _compose(
        self, bucket: str, name: str, members: list[Member], context: RequestContext, kept: ObjectInfo | None
    ) -> ObjectInfo:
        """Ask GCS to concatenate the members (each pinned to its generation) into ``name``, in place of
        the ``kept`` composite if any, else only if ``name`` does not exist (so the compose is retried)."""
        new_name = self.reuse_prefix is None
        if new_name:
            self._unsettled.add((bucket, name))
        sources = [(source, info.generation) for _, source, info in members]
        context.stats.composes += 1
        replaced = 0 if kept is None else kept.generation
        compose = compose_object(context, bucket, name, sources, if_generation_match=replaced, unique_name=new_name)
        # Shielded: a compose already sent may still land, so it runs to its end and close() waits for it.
        return await asyncio.shield(self._track(compose))

    async def _download(
        self,
        bucket: str,
        name: str,
        composite: ObjectInfo,
        expected: ObjectInfo,
        members: list[Member],
        context: RequestContext,
        seq: int,
    ) -> tuple[list[Outcome], int] | None:
        """Read the composite and cut it into the members' bytes; ``None`` if it is gone or is not the
        concatenation of the listed sources (then a kept one is dropped, to be rebuilt)."""
        url = format_url(bucket, name)
        try:
            if composite.size != expected.size or expected.crc32c not in (None, composite.crc32c):
                raise IntegrityError(f"{url} is not the concatenation of its {len(members)} listed sources", url=url)
            data, reserved = await fetch_object(context, url, composite, seq)  # its bytes checked against its crc32c
        except (NotFoundError, IntegrityError) as exc:
            logger.info("reading %s failed (%s)", url, exc)
            self._forget(bucket, name)
            return None
        finally:
            if self.reuse_prefix is None:
                self._delete_soon(bucket, name, composite.generation)
        chunks = [data] if isinstance(data, bytes) else data
        assert isinstance(chunks, list), "a composite is at most half the byte budget, so never a stream"
        return _split(chunks, members), reserved

    def _forget(self, bucket: str, name: str) -> None:
        """Drop a kept composite that proved wrong from the manifest, so that it is rebuilt: the new compose
        replaces it in place (deleting it first would race that compose wherever delete preconditions are not
        enforced, as on the emulator)."""
        if self.reuse_prefix is not None:
            self._cache.get(bucket, {}).pop(name, None)

    # -- temporary objects -----------------------------------------------------------------------

    def _track(self, coroutine: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coroutine)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    def _delete_soon(self, bucket: str, name: str, generation: int | None) -> None:
        self._track(self._delete(bucket, name, generation))

    async def _delete(self, bucket: str, name: str, generation: int | None) -> None:
        if await delete_temporary(self.context, bucket, name, generation):
            self._unsettled.discard((bucket, name))

    async def _settle(self) -> bool:
        """Wait for composes and deletes in flight, then delete every temporary composite left; ``True``."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)
        await asyncio.gather(*(self._delete(bucket, name, None) for bucket, name in list(self._unsettled)))
        return True

    def close(self) -> None:
        """Delete this iteration's temporary composites (idempotent; safe from any thread but the I/O loop)."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        try:
            if not wait_unless_on_io_loop(self._settle(), timeout=_CLOSE_TIMEOUT):
                return  # finalized on the I/O thread: the deletes are scheduled, not waited for
        except (FutureTimeout, RuntimeError) as exc:
            logger.warning("could not settle the temporary composites of job %s: %r", self.job_id, exc)
        if self._unsettled:
            left = ", ".join(format_url(bucket, name) for bucket, name in sorted(self._unsettled))
            logger.warning("temporary composites could not be deleted: %s; `torchdata-gcs clean` removes them", left)
        else:  # what is left stays in the reaper's hands, for another try when the process ends
            for watched in self._watches:
                reaper.release(watched)
        for bucket in self._cached_before:
            if self.context.stats.composes and not self._found:
                warnings.warn(
                    f"no kept composite under gs://{bucket}/{self.reuse_prefix} was reused: they are reused only "
                    "when the same objects arrive in the same order (shuffle after compose_shards_by_gcs)",
                    ComposeFallbackWarning,
                    stacklevel=2,
                )


async def _missing(url: str, error: NotFoundError, context: RequestContext, seq: int) -> tuple[list[Outcome], int]:
    return [(url, error)], 0


async def _load_each(members: list[Member], context: RequestContext, seq: int) -> tuple[list[Outcome], int]:
    """The members read one request each (pinned to their listed generations), concurrently."""
    results = await asyncio.gather(*(load_one(url, info, context, seq) for url, _, info in members))
    return [outcome for outcomes, _ in results for outcome in outcomes], sum(held for _, held in results)


def _composite_info(members: list[Member]) -> ObjectInfo:
    """Size and crc32c the members' composite must have, from their listed ones (crc32c ``None``
    unless every member's is known)."""
    infos = [info for _, _, info in members]
    crc = None
    if all(info.crc32c is not None for info in infos):
        crc = crc32c_base64(crc32c_of_concatenation((crc32c_value(i.crc32c), i.size) for i in infos))  # type: ignore[arg-type]  # every crc32c is known (checked above)
    return ObjectInfo(sum(info.size for info in infos), 0, crc)


def _split(chunks: list[bytes] | list[memoryview], members: list[Member]) -> list[Outcome]:
    """Cut a composite (as received, in chunks) into its members' bytes, as views: nothing is copied.

    The composite was checked whole against a crc32c that equals the members' listed checksums
    combined in order, with the listed sizes, so each piece matches its listed size and crc32c.
    """
    views = (memoryview(chunk) for chunk in chunks if chunk)
    current = memoryview(b"")
    outcomes: list[Outcome] = []
    for url, _, info in members:
        parts, needed = [], info.size
        while needed:
            if not current:
                current = next(views)
            parts.append(current[:needed])
            current = current[needed:]
            needed -= len(parts[-1])
        outcomes.append((url, parts))
    return outcomes


@dataclass(frozen=True)
class Composing:
    """Read runs of small objects as server-side composites (see ``compose_shards_by_gcs``): at most
    ``max_sources`` objects and ``max_bytes`` bytes in one, of ``storage_classes`` only, kept under
    ``reuse_prefix`` for later epochs if given (a grouping of ``reading.read_in_order``)."""

    max_sources: int = MAX_SOURCES
    max_bytes: int = 32 * 1024 * 1024
    reuse_prefix: str | None = None
    storage_classes: Collection[str] = COMPOSED_CLASSES

    def __post_init__(self) -> None:
        require_integer("max_sources", self.max_sources, 2, MAX_SOURCES)
        require_integer("max_composite_bytes", self.max_bytes, 1)
        check_reuse_prefix(self.reuse_prefix)
        object.__setattr__(self, "storage_classes", check_storage_classes(self.storage_classes))

    def load(
        self,
        items: Iterable[tuple[str, ObjectInfo | None]],
        client: Client,
        *,
        skip_missing: bool,
        cache: LocalCache | None = None,
    ) -> Iterator[tuple[str, Loaded]]:
        """Yield ``(url, bytes or stream)`` for each item in input order, small runs of ``storage_classes``
        loaded as composites; with a ``cache``, the objects found there read from it, the others kept."""
        composer = Composer(
            client,
            max_sources=self.max_sources,
            max_bytes=self.max_bytes,
            reuse_prefix=self.reuse_prefix,
            storage_classes=self.storage_classes,
        )
        try:
            reads = CachedReads(cache, composer.context) if cache is not None else None
            yield from deliver_in_order(
                composer.units(items, reads),
                composer.context,
                2 * client.transfer.max_in_flight,
                skip_missing=skip_missing,
            )
        finally:
            composer.close()


# -- leftovers at exit ------------------------------------------------------------------------------

_live: weakref.WeakSet[Composer] = weakref.WeakSet()


def _close_all() -> None:
    for composer in list(_live):
        composer.close()


def _any_live() -> bool:
    return bool(_live)


def _forget_after_fork() -> None:
    _live.clear()  # the parent's composers are the parent's to close
