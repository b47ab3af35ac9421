"""The listings cache: fsspec's ``dircache`` kept as gcsfs keeps it (each directory's listing, as ``ls`` and
``info`` give its entries), dropped where this filesystem writes or deletes, kept for no directory a writer
still open writes under, and filled from the whole listings ``find`` makes."""

from __future__ import annotations

import datetime
import itertools
import weakref
from collections.abc import Iterable
from typing import Any

from .._engines.publishing import StreamingWriter
from .._ops.urls import format_url
from ..errors import NotFoundError
from .calls import Calls

__all__ = ["ListingsCache"]


class ListingsCache(Calls):
    """The entries listings hold, and the cache of them."""

    _invalidations: itertools.count[int]
    _epoch: int  # changes with every invalidation of the listings cache
    _writers: dict[int, weakref.ref[StreamingWriter]]  # writers opened here, until seen closed

    @staticmethod
    def _file(bucket: str, resource: dict[str, Any], versions: bool = False) -> dict[str, Any]:
        """The ``info`` of an object: its JSON resource as GCS gives it (``contentType``, ``md5Hash``,
        ``metadata``, ``timeCreated``, ``etag``...), as gcsfs returns it, with ``name`` the path (with
        ``versions``, ``name#<generation>``, as listings of versions name them), ``type``, ``size``,
        ``generation`` and ``metageneration`` as ints, and ``mtime``/``ctime``, aware datetimes of
        ``updated``/``timeCreated``."""
        entry = {
            **resource,
            "name": f"{bucket}/{resource['name']}" + (f"#{resource['generation']}" if versions else ""),
            "type": "file",
            "size": int(resource["size"]),
            "generation": int(resource["generation"]),
            "crc32c": resource.get("crc32c"),
        }
        if "metageneration" in resource:
            entry["metageneration"] = int(resource["metageneration"])
        for field, key in (("updated", "mtime"), ("timeCreated", "ctime")):
            if field in resource:
                entry[key] = _timestamp(resource[field])
        return entry

    @staticmethod
    def _directory(path: str) -> dict[str, Any]:
        return {"name": path.rstrip("/"), "type": "directory", "size": 0}

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget the listings cached for ``path``, its parents and every directory under it (all of them if
        ``None``): the next ``ls``, ``info`` or ``exists`` there asks GCS. Writes and deletes through this
        filesystem do it themselves; call it after another process wrote, or pass ``refresh=True`` to ``ls``."""
        if path is None:
            self.dircache.clear()
            self._epoch = next(self._invalidations)
        else:
            self._drop_listings([path], under=True)

    def _drop_listings(self, paths: Iterable[str], under: bool = False, written: bool = False) -> None:
        """Forget the listings cached for ``paths`` and their parents, which an object written or deleted at
        one of them changes; with ``under``, those of every directory under them too (a tree removed), in
        one pass over the cache. With ``written`` (objects written, none deleted), a directory's listing that
        names the directory below already stays, as gcsfs keeps it: a write there cannot change it."""
        keys = {self._strip_protocol(path).rstrip("/") for path in paths}
        doomed: set[str] = set()
        for key in keys:
            doomed.add(key)
            child, parent = key, key.rpartition("/")[0]
            while parent and parent not in doomed:
                doomed.add(parent)
                child, parent = parent, parent.rpartition("/")[0]
                if written and parent and self._lists_directory(parent, child):
                    break
        for cached in list(self.dircache) if under else []:
            above = cached.rpartition("/")[0]
            while above and above not in keys:
                above = above.rpartition("/")[0]
            if above:
                doomed.add(cached)
        for key in doomed:
            self.dircache.pop(key, None)
        self._epoch = next(self._invalidations)

    def _lists_directory(self, key: str, name: str) -> bool:
        """Whether the listing cached for ``key`` names the directory ``name``."""
        listing = self.dircache.get(key) or []
        return any(entry["name"] == name and entry["type"] == "directory" for entry in listing)

    def _track(self, writer: StreamingWriter) -> StreamingWriter:
        """Note ``writer`` until it closes: the listings over its object are dropped now, and none is kept
        while it is open, as its object appears when it closes (which the writer tells no one)."""
        for number, ref in list(self._writers.items()):
            if (noted := ref()) is None or noted.closed:
                self._writers.pop(number, None)
        self._writers[id(writer)] = weakref.ref(writer)
        self._drop_listings([writer.url], written=True)
        return writer

    def _writing_under(self, key: str) -> bool:
        """Whether a writer of this filesystem that has not closed yet writes under the directory ``key``."""
        for ref in list(self._writers.values()):
            writer = ref()
            if writer is not None and not writer.closed and self._strip_protocol(writer.url).startswith(f"{key}/"):
                return True
        return False

    def _cached_entries(self, key: str) -> list[dict[str, Any]] | None:
        """Copies of the entries named ``key`` (a file, a directory or both) in the cached listing of its
        parent; ``None`` if that listing is not cached; ``FileNotFoundError`` if it is and names neither."""
        parent = key.rpartition("/")[0]
        listing = self.dircache.get(parent) if parent and not key.endswith("/") else None
        if listing is None:
            return None
        entries = [dict(entry) for entry in listing if entry["name"] == key]
        if not entries:
            url = format_url(*self.split_path(key))
            raise NotFoundError(
                f"{url}: no such object or directory in the cached listing of gs://{parent}/ (refresh=True or "
                "invalidate_cache() asks GCS again)",
                url=url,
            )
        return entries

    def _keep_listings(self, top: str, entries: list[dict[str, Any]], epoch: int) -> None:
        """Keep in ``dircache`` the listing of ``top`` and of every directory under it, as ``ls`` lists them,
        from ``entries``: every object under ``top/`` (as gcsfs's ``find`` does), unless the listings cache
        was invalidated since ``epoch``."""
        listings: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        for entry in entries:
            child = entry["name"].rpartition("/")[0]
            if entry["name"].endswith("/") and entry["size"] == 0:  # a folder placeholder: the folder lists itself
                listings.setdefault(child, {})[child, "directory"] = self._directory(child)
            else:
                listings.setdefault(child, {})[entry["name"], "file"] = entry
            while len(child) > len(top):  # each directory is an entry of its parent's listing
                parent = child.rpartition("/")[0]
                listings.setdefault(parent, {})[child, "directory"] = self._directory(child)
                child = parent
        if self._epoch != epoch:
            return
        for key, listing in listings.items():
            ordered = sorted(listing.items(), key=lambda item: (item[0][0], item[0][1] != "file"))
            self.dircache[key] = [dict(entry) for _, entry in ordered]


def _timestamp(text: str) -> datetime.datetime:
    """A timezone-aware datetime of a GCS RFC 3339 time (``2026-11-26T19:24:13.719Z``)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
