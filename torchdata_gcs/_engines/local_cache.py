"""A node's own copy of objects: entries on local disk, shared by every process of the machine, bounded.

An entry is one object version, named by a hash of its bucket and name, its generation and its crc32c; it is
written under a temporary name and renamed into place, and its bytes are checked against the crc32c in its name
whenever it is read, so nothing torn or damaged is ever served, and a new generation never finds an old entry.
A byte-range lock per entry (``fcntl``: the kernel drops it when its holder dies) lets one process download an
object while the others of the node wait for it. The total of the entries never exceeds the limit: a full cache
keeps what it holds and admits nothing new (on a cyclic or reshuffled scan larger than the cache, evicting
would throw away each entry before its next use), except that entries left unread for ``evict_idle_after``
seconds make room. Any failure of the disk costs speed only: one warning, and the read goes to GCS.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c

from .._ops.checksums import ObjectInfo
from .._transport import lifecycle
from .._transport.context import LoadStats
from ..errors import CacheWarning

__all__ = [
    "LAYOUT",
    "LOCK_POLL",
    "CacheEntry",
    "CacheStore",
    "FolderReport",
    "LocalCache",
    "check_cache",
    "clear_folder",
    "folder_report",
    "parse_limit",
    "read_through",
    "store_of",
]

LAYOUT = "torchdata-gcs-cache-v1"
"""The folder under the cache's path that holds it (another layout would take another name)."""

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)b?\s*$", re.IGNORECASE)
_TOUCH_EVERY = 3600.0
"""An entry's last read is written down at most this often (seconds): a hit costs no write most of the time."""
_RESCAN_EVERY = 60.0
"""A full cache looks for idle entries at most this often (seconds)."""
LOCK_POLL = 0.02
"""Seconds between looks at an entry another process is downloading."""
_CLAIM = 64 * 1024 * 1024
"""The most room a process claims on the limit at once."""
_RECENT_READS = 10_000
"""The state file's recent hit rate is of the latest reads, from when this many were counted."""


def parse_limit(limit: int | str) -> int:
    """Bytes, from an ``int`` or a string such as ``"200GB"``, ``"1.5TiB"``, ``"500M"``.

    >>> parse_limit("200GB"), parse_limit("1.5KiB"), parse_limit(4096)
    (200000000000, 1536, 4096)
    """
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        raise TypeError(f"limit must be a number of bytes or a string such as '200GB', got {type(limit).__name__}")
    if isinstance(limit, int):
        value = limit
    else:
        match = _SIZE.match(limit)
        if match is None:
            raise ValueError(f"limit {limit!r} is not a size: write bytes, or a number with KB, MB, GB, TB or KiB...")
        number, prefix, binary = match.groups()
        unit = 1024 ** "kmgtp".index(prefix.lower()) * 1024 if binary and prefix else _UNITS[prefix.lower()]
        value = int(float(number) * unit)
    if value <= 0:
        raise ValueError(f"limit must be positive, got {limit!r}")
    return value


class LocalCache:
    """A cache of objects on this machine's disk at ``path``, shared by every process that names it: ranks,
    DataLoader workers (fork or spawn), other jobs. At most ``limit`` bytes of entries (an ``int``, or a
    string such as ``"200GB"``). Give it as ``cache=`` to a dataset, a node, ``load_files_by_gcs``,
    ``safetensors.load_file`` or ``checkpoint.load``: objects are read from it when their version is there,
    from GCS otherwise (and then kept, while there is room). A full cache keeps what it holds; entries not
    read for ``evict_idle_after`` seconds make room for new ones. It pickles as its settings.

    Examples:
        >>> import tempfile
        >>> from torchdata_gcs import GCSMapDataset, LocalCache
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator, tempfile.TemporaryDirectory() as folder:
        ...     emulator.seed("demo", {"a.txt": b"alpha"})
        ...     cache = LocalCache(folder, limit="1GB")
        ...     first = GCSMapDataset("gs://demo/", cache=cache, client=emulator.client_config)[0]
        ...     again = GCSMapDataset("gs://demo/", cache=cache, client=emulator.client_config)
        ...     again[0], again.stats.cache_hits
        (('gs://demo/a.txt', b'alpha'), 1)
    """

    __slots__ = ("evict_idle_after", "limit", "path")

    def __init__(self, path: str | os.PathLike[str], *, limit: int | str, evict_idle_after: float = 86400.0) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise TypeError(f"path must be a folder's path, got {path!r}")
        if isinstance(evict_idle_after, bool) or not isinstance(evict_idle_after, (int, float)):
            raise TypeError(f"evict_idle_after must be seconds, got {type(evict_idle_after).__name__}")
        if evict_idle_after <= 0:
            raise ValueError(f"evict_idle_after must be positive, got {evict_idle_after}")
        self.path = os.path.abspath(os.fspath(path))
        self.limit = parse_limit(limit)
        self.evict_idle_after = float(evict_idle_after)

    def _settings(self) -> tuple[str, int, float]:
        return self.path, self.limit, self.evict_idle_after

    def __repr__(self) -> str:
        return f"LocalCache({self.path!r}, limit={self.limit}, evict_idle_after={self.evict_idle_after})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalCache) and self._settings() == other._settings()

    def __hash__(self) -> int:
        return hash(self._settings())

    def __getstate__(self) -> tuple[str, int, float]:
        return self._settings()

    def __setstate__(self, state: tuple[str, int, float]) -> None:
        self.path, self.limit, self.evict_idle_after = state


def check_cache(cache: object) -> LocalCache | None:
    """``cache`` if it is a :class:`LocalCache` or ``None``; ``TypeError`` for anything else (a path, say)."""
    if cache is not None and not isinstance(cache, LocalCache):
        raise TypeError(f"cache must be a LocalCache, such as LocalCache('/mnt/cache', limit='200GB'), got {cache!r}")
    return cache


@dataclass(frozen=True)
class CacheEntry:
    """Where one object version lives in the cache, and what its bytes must hash to."""

    key: str  # a hash of the object's URL: the entry's folder and its lock
    generation: int
    crc32c: int
    size: int

    @classmethod
    def of(cls, url: str, info: ObjectInfo | None) -> CacheEntry | None:
        """The entry of the version ``info`` describes; ``None`` where it does not name one (no generation or
        no crc32c: nothing to key it by or check it against)."""
        if info is None or info.generation is None or not info.crc32c:
            return None
        key = hashlib.sha256(url.encode()).hexdigest()[:40]  # the URL names bucket and object, one way only
        crc = int.from_bytes(base64.b64decode(info.crc32c), "big")
        return cls(key, int(info.generation), crc, info.size)

    @property
    def path(self) -> str:
        """Where it is under the entries' folder: one of 256 folders, then key, generation and crc32c."""
        return f"{self.key[:2]}/{self.key}.{self.generation}.{self.crc32c:08x}"

    @property
    def lock_offset(self) -> int:
        return int(self.key[:15], 16)


class CacheStore:
    """One process's way into a :class:`LocalCache`'s folder. Every method is safe to call from any thread;
    every failure of the disk is turned into one warning (per cause) and a miss, or a write not made."""

    def __init__(self, cache: LocalCache) -> None:
        self.cache = cache
        self.root = Path(cache.path, LAYOUT)
        self.entries, self.temporary = self.root / "entries", self.root / "tmp"
        self._entries = str(self.entries)  # entry paths are joined as text: a hit costs no pathlib
        self._temporary = str(self.temporary)
        self._lock = threading.Lock()  # this process's threads, around the state file and the warnings
        self._warned: set[tuple[str, str]] = set()
        self._broken: str | None = None  # why the cache is off in this process
        self._lock_file = -1
        self._held: set[int] = set()  # lock offsets this process holds (fcntl locks are the process's)
        self._counted = [0, 0]  # hits and misses not yet written to the state file
        self._idle: deque[Path] = deque()  # entries found unread for evict_idle_after, the longest first
        self._claim = 0  # bytes of the limit this process has claimed and not used yet
        self._claiming = threading.Lock()  # this process's writers, around the claim
        try:
            self.temporary.mkdir(parents=True, exist_ok=True)
            if not (self.entries / "ff").is_dir():
                for prefix in range(256):
                    (self.entries / f"{prefix:02x}").mkdir(parents=True, exist_ok=True)
            self._lock_file = os.open(self.root / "locks", os.O_RDWR | os.O_CREAT, 0o644)
            self._check_locks()
            self._remove_abandoned()
        except OSError as exc:
            self._turn_off(exc)

    def _check_locks(self) -> None:
        """Whether byte-range locks work on this file system: an ``OSError`` if not (``ENOLCK`` where an NFS
        mount has no lock daemon); held by another process at this moment counts as working."""
        try:
            fcntl.lockf(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            return
        fcntl.lockf(self._lock_file, fcntl.LOCK_UN, 1, 0)

    @property
    def usable(self) -> bool:
        return self._broken is None

    def warn(self, what: str, exc: OSError | str) -> None:
        """Warn once per kind of failure, naming the cache's path and the cause; the read goes on from GCS."""
        cause = (
            exc if isinstance(exc, str) else str(exc.strerror or exc) + (f": {exc.filename}" if exc.filename else "")
        )
        with self._lock:
            if (what, cause) in self._warned:
                return
            self._warned.add((what, cause))
        warnings.warn(f"local cache {self.cache.path}: {what} ({cause}); reading from GCS", CacheWarning, stacklevel=2)

    def _turn_off(self, exc: OSError) -> None:
        self._broken = str(exc)
        self.warn("cannot be used", exc)

    # reading

    def read(self, entry: CacheEntry) -> bytes | None:
        """The entry's bytes, checked; ``None`` if it is not there (or was damaged: then it is removed)."""
        if self._broken:
            return None
        path = f"{self._entries}/{entry.path}"
        try:
            with open(path, "rb", buffering=0) as file:
                data = file.read()
                modified = os.fstat(file.fileno()).st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.warn("an entry cannot be read", exc)
            return None
        if len(data) != entry.size or google_crc32c.value(data) != entry.crc32c:
            self.warn("a damaged entry was removed", path)
            self._remove(Path(path))
            return None
        if time.time() - modified > min(_TOUCH_EVERY, self.cache.evict_idle_after / 24):
            try:
                os.utime(path)  # its last read: what idle eviction goes by
            except OSError:
                pass
        return data

    # writing

    def has_room(self, size: int) -> bool:
        """Whether an entry of ``size`` bytes may be admitted now, as far as the state file says (read without
        its lock: a hint that spares writing an entry a full cache would drop)."""
        if self._broken or size > self.cache.limit:
            return False
        if size <= self._claim or self._idle:
            return True
        try:
            state = self._read_state()
        except OSError:
            return True
        return state["bytes"] + size <= self.cache.limit or time.time() >= state["next_scan"]

    def keep(self, entry: CacheEntry, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Keep an object's verified bytes (in the parts they came in) as its entry, if there is room: written
        under a temporary name, renamed into place. Nothing is kept if the disk fails."""
        if not self.has_room(entry.size):
            return
        temporary = f"{self._temporary}/{os.getpid()}.{secrets.token_hex(6)}"
        try:
            with open(temporary, "wb") as file:
                for part in parts:
                    file.write(part)
            if self._admit(entry, temporary):
                return
        except OSError as exc:
            self.warn("an entry cannot be written", exc)
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.warn("a temporary file cannot be removed", exc)

    def _admit(self, entry: CacheEntry, temporary: str) -> bool:
        """Rename the written entry into place if the limit allows (``False`` if not). The bytes come out of
        this process's claim on the limit; the state file is locked only to claim more. (Older generations of
        the object are never served, and go at the next walk of the folder.)"""
        with self._claiming:  # the rename too: a walk of the folder must not miss an entry already counted
            if entry.size > self._claim:
                with self._state_locked() as state:
                    if not self._claim_more(state, entry.size):
                        return False
            os.replace(temporary, f"{self._entries}/{entry.path}")
            self._claim -= entry.size
        return True

    def _claim_more(self, state: dict[str, Any], size: int) -> bool:
        """Give back what is left of this process's claim and claim room for ``size`` bytes and, where the limit
        allows, a sixteenth of it more (at most :data:`_CLAIM`): the next admissions need no lock."""
        state["bytes"] = max(0, state["bytes"] - self._claim)
        self._claim = 0
        for wanted in (max(size, min(self.cache.limit // 16, _CLAIM)), size):
            if state["bytes"] + wanted <= self.cache.limit or self._make_room(state, wanted):
                state["bytes"] += wanted
                self._claim = wanted
                return True
        return False

    def give_back_claim(self) -> None:
        """Return what is left of this process's claim to the state file (at the end of the process)."""
        with self._claiming:
            if self._claim and not self._broken:
                with self._state_locked() as state:
                    state["bytes"] = max(0, state["bytes"] - self._claim)
                    self._claim = 0

    def _make_room(self, state: dict[str, Any], size: int) -> bool:
        """Evict entries unread for ``evict_idle_after`` (the longest unread first) until ``size`` fits. The
        candidates come from one walk of the folder, which also sets the total right (entries removed by
        others), kept for the admissions that follow: one walk per turnover, not one per entry."""
        now = time.time()
        idle_before = now - self.cache.evict_idle_after
        if not self._idle and now >= state["next_scan"]:
            on_disk, self._idle, youngest = self._walk(idle_before)
            state["claims"] = {pid: claim for pid, claim in state["claims"].items() if _alive(int(pid))}
            state["bytes"] = on_disk + sum(claim for pid, claim in state["claims"].items() if int(pid) != os.getpid())
            state["next_scan"] = max(now + min(_RESCAN_EVERY, self.cache.evict_idle_after), youngest)
        while self._idle and state["bytes"] + size > self.cache.limit:
            path = self._idle.popleft()
            try:
                if path.stat().st_mtime < idle_before:  # not read since the walk
                    state["bytes"] = max(0, state["bytes"] - _remove_file(path))
            except FileNotFoundError:
                continue
        return state["bytes"] + size <= self.cache.limit

    def _walk(self, idle_before: float) -> tuple[int, deque[Path], float]:
        """Every entry's size summed, the idle ones (longest unread first), and when the first of the others
        becomes idle; entries of an object's older generations (never served again) are removed."""
        entries = []
        for file in _entry_files(self.root):
            try:
                facts = file.stat()
            except FileNotFoundError:
                continue
            entries.append((facts.st_mtime, facts.st_size, Path(file.path)))
        entries, superseded = _newest_generations(entries)
        for path in superseded:
            _remove_file(path)
        entries.sort()
        idle = deque(path for modified, _, path in entries if modified < idle_before)
        youngest = min((modified for modified, _, _ in entries if modified >= idle_before), default=idle_before)
        return sum(size for _, size, _ in entries), idle, youngest + self.cache.evict_idle_after

    def _remove(self, path: Path) -> None:
        try:
            with self._state_locked() as state:
                state["bytes"] = max(0, state["bytes"] - _remove_file(path))
        except OSError as exc:
            self.warn("an entry cannot be removed", exc)

    # the state file: total bytes, hits and misses

    @contextmanager
    def _state_locked(self) -> Iterator[dict[str, Any]]:
        """The state file, locked against every process, with this process's counts added to it."""
        with self._lock, locked_state(self.root) as state:
            hits, misses = self._counted
            self._counted = [0, 0]
            state["hits"] += hits
            state["misses"] += misses
            recent = state["recent"] if sum(state["recent"]) < _RECENT_READS else [0, 0]
            state["recent"] = [recent[0] + hits, recent[1] + misses]
            state["limit"] = self.cache.limit
            yield state
            claims = {pid: claim for pid, claim in state["claims"].items() if int(pid) != os.getpid()}
            state["claims"] = {**claims, str(os.getpid()): self._claim} if self._claim else claims

    def _read_state(self) -> dict[str, Any]:
        return read_state(self.root)

    def count(self, hit: bool) -> None:
        """Count a read from the cache or from GCS; written down with the next change of the state file, every
        thousand reads, and when the process ends."""
        with self._lock:
            self._counted[0 if hit else 1] += 1
            due = sum(self._counted) >= 1000
        if due:
            self.flush_counts()

    def flush_counts(self, *, quietly: bool = False) -> None:
        """Add this process's counts to the state file (an ``OSError`` raised ``quietly``, else warned of)."""
        if self._broken or not any(self._counted):
            return
        try:
            with self._state_locked():
                pass
        except OSError as exc:
            if quietly:
                raise
            self.warn("its state cannot be written", exc)

    # one download per node

    def try_lock(self, entry: CacheEntry) -> bool:
        """Take the entry's lock if no process holds it (this one included); ``True`` if taken."""
        offset = entry.lock_offset
        with self._lock:
            if offset in self._held:
                return False
            try:
                fcntl.lockf(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                return False
            self._held.add(offset)
            return True

    def lock_waiting(self, entry: CacheEntry, wait: float) -> bool:
        """Take the entry's lock, waiting up to ``wait`` seconds while another process holds it; ``False`` if it
        is not taken (the wait ran out, or locks failed: one warning)."""
        deadline = time.monotonic() + wait
        try:
            while not self.try_lock(entry):
                if time.monotonic() > deadline:
                    return False
                time.sleep(LOCK_POLL)
        except OSError as exc:
            self.warn("its locks failed", exc)
            return False
        return True

    def unlock(self, entry: CacheEntry) -> None:
        offset = entry.lock_offset
        with self._lock:
            self._held.discard(offset)
            fcntl.lockf(self._lock_file, fcntl.LOCK_UN, 1, offset)

    def _remove_abandoned(self) -> None:
        """Remove temporary files whose writer is gone (killed mid-write)."""
        for file in os.scandir(self.temporary):
            pid = file.name.partition(".")[0]
            if pid.isdigit() and not _alive(int(pid)):
                try:
                    os.unlink(file.path)
                except FileNotFoundError:
                    pass


def read_through(
    cache: LocalCache, url: str, info: ObjectInfo, read: Callable[[memoryview], None], stats: LoadStats, wait: float
) -> bytes | bytearray:
    """An object's stored bytes, whole: its entry's if its version is in ``cache``, else read by ``read`` into a
    buffer of its size (``read`` checks them) and kept. One process of the node reads it while the others wait
    for it, at most ``wait`` seconds (then they read it too)."""
    store = store_of(cache)
    entry = CacheEntry.of(url, info) if store.usable else None
    buffer = bytearray(info.size)
    if entry is None:
        read(memoryview(buffer))
        return buffer
    locked = store.lock_waiting(entry, wait)
    try:
        data = store.read(entry)
        if data is not None:
            store.count(hit=True)
            stats.cache_hits += 1
            stats.cache_bytes += len(data)
            return data
        read(memoryview(buffer))
        store.count(hit=False)
        stats.cache_misses += 1
        store.keep(entry, [buffer])
        return buffer
    finally:
        if locked:
            store.unlock(entry)


def read_state(root: Path) -> dict[str, Any]:
    """The state file of the cache at ``root`` (its folder :data:`LAYOUT`), as last written, unlocked."""
    state: dict[str, Any] = {
        "bytes": 0,  # of the entries, and of the room processes have claimed for theirs (claims)
        "claims": {},
        "hits": 0,
        "misses": 0,
        "recent": [0, 0],
        "next_scan": 0,
        "limit": None,
    }
    try:
        state.update(json.loads((root / "state.json").read_text()))
    except FileNotFoundError:
        pass
    except ValueError:  # torn by a machine's crash: the next scan counts the bytes again
        state["next_scan"] = 0
    return state


@contextmanager
def locked_state(root: Path) -> Iterator[dict[str, Any]]:
    """The state file of the cache at ``root``, locked against every process (``flock``, dropped by the kernel
    if the holder dies); what the block leaves in it is written back, by a rename."""
    descriptor = os.open(root / "state.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        state = read_state(root)
        yield state
        scratch = root / f"state.json.{os.getpid()}"
        scratch.write_text(json.dumps(state))
        os.replace(scratch, root / "state.json")
    finally:
        os.close(descriptor)  # and the flock with it


@dataclass(frozen=True)
class FolderReport:
    """What a cache's folder holds: entries and their bytes, the limit it was last used with, and the reads
    counted (all of them, and the latest few thousand: the hit rate now)."""

    entries: int
    bytes: int
    limit: int | None
    hits: int
    misses: int
    recent_hits: int
    recent_misses: int


def folder_report(path: str | os.PathLike[str]) -> FolderReport:
    """What the cache at ``path`` holds, counted on disk; ``FileNotFoundError`` if there is none."""
    root = _existing(path)
    sizes = [file.stat().st_size for file in _entry_files(root)]
    state = read_state(root)
    return FolderReport(len(sizes), sum(sizes), state["limit"], state["hits"], state["misses"], *state["recent"])


def clear_folder(path: str | os.PathLike[str]) -> FolderReport:
    """Remove every entry of the cache at ``path`` and its counts; what it held. Processes reading it meanwhile
    read from GCS what is gone."""
    root = _existing(path)
    with locked_state(root) as state:
        sizes = [_remove_file(Path(file.path)) for file in _entry_files(root)]
        held = FolderReport(len(sizes), sum(sizes), state["limit"], state["hits"], state["misses"], *state["recent"])
        state.update(bytes=0, hits=0, misses=0, recent=[0, 0], next_scan=0)
    return held


def _existing(path: str | os.PathLike[str]) -> Path:
    root = Path(os.fspath(path), LAYOUT)
    if not root.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no local cache here", os.fspath(path))
    return root


def _newest_generations(
    entries: list[tuple[float, int, Path]],
) -> tuple[list[tuple[float, int, Path]], list[Path]]:
    """The entries of each object's newest generation, and the others (never served again)."""
    newest: dict[str, tuple[int, tuple[float, int, Path]]] = {}
    superseded = []
    for entry in entries:
        key, generation, _ = entry[2].name.split(".")
        kept = newest.get(key)
        if kept is not None and kept[0] >= int(generation):
            superseded.append(entry[2])
            continue
        if kept is not None:
            superseded.append(kept[1][2])
        newest[key] = (int(generation), entry)
    return [entry for _, entry in newest.values()], superseded


def _remove_file(path: Path) -> int:
    """Remove a file; its size, or 0 if another process removed it first."""
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


def _entry_files(root: Path) -> Iterator[os.DirEntry[str]]:
    for folder in (root / "entries").glob("*"):
        try:
            yield from os.scandir(folder)
        except FileNotFoundError:  # emptied and removed meanwhile
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_STORES: dict[tuple[int, tuple[str, int, float]], CacheStore] = {}
_STORES_LOCK = threading.Lock()


def store_of(cache: LocalCache) -> CacheStore:
    """This process's store for ``cache`` (made on first use; a forked child makes its own: locks are a
    process's). Its counts are written down when the process ends."""
    key = (os.getpid(), cache._settings())
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = CacheStore(cache)
            lifecycle.cleanup(_flush_counts)
        return store


def _flush_counts() -> None:
    """At the end of a process: its claim given back and its counts written, quietly (nothing is printed at
    exit; a folder removed meanwhile loses only counts)."""
    for (pid, _), store in list(_STORES.items()):
        if pid == os.getpid() and store.root.is_dir():
            try:
                store.give_back_claim()
                store.flush_counts(quietly=True)
            except OSError:
                pass
