"""What is stored: ``info``, ``ls``, ``find`` and ``glob`` from GCS listings (answered from the listings cache
where it holds them), every version of an object, directories as GCS shows them (prefixes, folder
placeholders, the folders of a hierarchical namespace), and the project whose buckets ``ls("")`` lists."""

from __future__ import annotations

import contextvars
import datetime
from collections.abc import AsyncIterator
from typing import Any

from fsspec.asyn import sync_wrapper

from .._engines.listing import list_objects_async
from .._ops.client import RequestContext
from .._ops.objects import check_bucket, list_buckets, list_page, object_resource, storage_layout
from .._ops.paging import MAX_PAGE_SIZE, PageTrail
from .._ops.patterns import tree_glob
from .._ops.urls import TEMPORARY_PREFIX, brief, format_url
from ..errors import GCSError, NotFoundError
from .cache import ListingsCache
from .calls import on_io_loop
from .options import PROJECT_VARIABLE, default_project
from .paths import InvalidPathError

__all__ = ["LISTED", "Listing", "pages"]

LS_FIELDS = "items,prefixes,nextPageToken"
"""What ``ls`` asks of a listing: every object's whole resource (but its ACL, which listings leave out), as
``info`` and gcsfs give it."""

LISTING_CONCURRENCY = 8
"""List requests at once for ``find`` (and the ``rm``, ``copy`` and ``get`` built on it)."""

LISTED: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("listed", default=None)
"""Where ``find`` notes the generation of each file it lists, while an ``rm`` expands its paths."""


class Listing(ListingsCache):
    """Metadata and listing: what a path is, what is under it, and the project whose buckets are listed."""

    _project: str | None
    _project_known: bool
    _hierarchical: dict[str, bool]  # bucket -> whether it has a hierarchical namespace

    @property
    def project(self) -> str | None:
        """The project whose buckets ``ls("")`` lists and in which ``mkdir("bucket")`` creates one: ``project=``,
        else ``GCSFS_DEFAULT_PROJECT``, else the credentials' own (see :func:`.options.default_project`), looked up once
        when first needed; ``None`` if none names one."""
        if not self._project_known:
            self._project, self._project_known = default_project(self.client.config), True
        return self._project

    def _project_for(self, purpose: str) -> str:
        if not self.project:
            raise ValueError(
                f"to {purpose}, GCSFileSystem needs project= (or {PROJECT_VARIABLE}, or credentials that name a "
                "project): the Google Cloud project they belong to"
            )
        return self.project

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        """fsspec's, and a path GCS would refuse does not exist (``isdir`` says so already)."""
        try:
            exists: bool = await super()._exists(path, **kwargs)
        except InvalidPathError:
            return False
        return exists

    @on_io_loop
    async def _info(self, path: str, refresh: bool = False, **kwargs: Any) -> dict[str, Any]:
        """What ``path`` is: from the cached listing of its parent if there is one (as gcsfs answers), else
        from GCS; ``refresh=True`` always asks GCS (reads do: they need the live version)."""
        bucket, name, generation = self._split_version(path)
        cached = None if refresh or not name or generation is not None else self._cached_entries(f"{bucket}/{name}")
        if cached:
            return next((entry for entry in cached if entry["type"] == "file"), cached[0])
        context = self._context()
        if not name:
            await check_bucket(context, bucket)  # NotFoundError, a FileNotFoundError, if missing
            return self._directory(bucket)
        directory_only = self._strip_protocol(path).endswith("/")  # "f.txt/" is not the object f.txt
        resource = None if directory_only else await object_resource(context, bucket, name, None, generation=generation)
        if resource is not None:
            return self._file(bucket, resource)
        if generation is not None:
            url = f"{format_url(bucket, name)}#{generation}"
            raise NotFoundError(f"{url}: no such object version", url=url)
        if await self._is_directory(context, bucket, name):
            return self._directory(f"{bucket}/{name}")
        raise NotFoundError(f"{format_url(bucket, name)}: no such object or directory", url=format_url(bucket, name))

    async def _versions(self, context: RequestContext, bucket: str, name: str) -> list[dict[str, Any]]:
        """Every version, noncurrent ones too, of the object ``name`` and of the objects under ``name/`` (all
        of the bucket's for an empty name), each named ``name#<generation>``, in name order."""
        params = {
            "prefix": name,
            "versions": "true",
            "maxResults": MAX_PAGE_SIZE,
            "fields": "items,nextPageToken",  # every version's whole resource, as info gives it
        }
        under = f"{name.rstrip('/')}/" if name else ""
        entries = [
            self._file(bucket, item, versions=True)
            async for page in pages(context, bucket, params)
            for item in page.get("items", [])
            if item["name"] == name or item["name"].startswith(under)
        ]
        return sorted(entries, key=lambda entry: entry["name"])

    @staticmethod
    async def _is_directory(context: RequestContext, bucket: str, name: str) -> bool:
        """Whether ``name/`` holds objects, or is a folder of a bucket with a hierarchical namespace (empty
        ones too), with ``storage.objects.list`` alone: a listing of ``name``'s level from ``name/`` to
        ``name0`` (``0`` follows ``/``) holds at most that one prefix."""
        name = name.rstrip("/")
        parent = name.rpartition("/")[0]
        params: dict[str, Any] = {
            "prefix": f"{parent}/" if parent else "",
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",
            "startOffset": f"{name}/",
            "endOffset": f"{name}0",
            "maxResults": 1,
            "fields": "prefixes,nextPageToken",
        }
        # GCS may answer a page with nothing in it but a token; the range holds one prefix at most
        return any([page.get("prefixes") async for page in pages(context, bucket, params)])

    @on_io_loop
    async def _ls(
        self, path: str, detail: bool = False, refresh: bool = False, versions: bool = False, **kwargs: Any
    ) -> list[Any]:
        """The entries one level under ``path`` (a file lists as itself). A directory's listing is kept in
        ``dircache`` (fsspec's options ``use_listings_cache``, ``listings_expiry_time``, ``max_paths``) and
        answers later calls until it expires or is invalidated; ``refresh=True`` drops it and lists anew.
        ``versions``: every version of each file, noncurrent ones too, each named ``name#<generation>``, as
        gcsfs lists them (never cached)."""
        if not self._strip_protocol(path):  # "" or "gs://": the project's buckets, as gcsfs lists them
            buckets = await list_buckets(self._context(), self._project_for("list buckets"))
            found = sorted(({**b, **self._directory(b["name"])} for b in buckets), key=lambda b: b["name"])
            return found if detail else [b["name"] for b in found]
        bucket, name = self.split_path(path)
        key = f"{bucket}/{name}".rstrip("/")
        if refresh:
            self.invalidate_cache(key)
        cached = None if versions else self.dircache.get(key)
        if cached is None and not versions:
            itself = self._cached_entries(key)  # a file lists as itself; a name its parent lacks raises
            cached = itself if itself and all(entry["type"] == "file" for entry in itself) else None
        if cached is not None:
            return [dict(entry) for entry in cached] if detail else [entry["name"] for entry in cached]
        keep = not versions and not self._writing_under(key)  # an open writer's object shows when it closes
        epoch = self._epoch  # an invalidation while listing: the listing may not hold what was changed
        prefix = f"{name}/" if name else ""
        params: dict[str, Any] = {
            "prefix": prefix,
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",  # folders of a hierarchical namespace, empty ones too
            "maxResults": MAX_PAGE_SIZE,
            "fields": LS_FIELDS,
            **({"versions": "true"} if versions else {}),
        }
        context = self._context()
        entries: list[dict[str, Any]] = []
        folders: set[str] = set()  # a page may name again a prefix an earlier page named
        placeholder = False  # a zero-byte "name/" object: a folder made in the console, empty or not
        async for page in pages(context, bucket, params):
            folders.update(page.get("prefixes", []))
            for item in page.get("items", []):
                if item["name"] == prefix and item["size"] == "0":
                    placeholder = True
                else:
                    entries.append(self._file(bucket, item, versions))
        entries += (self._directory(f"{bucket}/{p}") for p in folders - {TEMPORARY_PREFIX})
        if placeholder:  # the folder lists itself, as gcsfs lists it (and as info describes it)
            entries.append(self._directory(key))
        entries.sort(key=lambda entry: entry["name"])
        if entries and keep and self._epoch == epoch:
            self.dircache[key] = [dict(entry) for entry in entries]
        if not entries and name:
            entries = [await self._info(path)]  # a file lists as itself; nothing at all raises
            if entries[0]["type"] == "directory":
                entries = []
            elif versions:  # each of its versions
                entries = await self._versions(context, bucket, name)
        return entries if detail else [entry["name"] for entry in entries]

    def created(self, path: str) -> datetime.datetime:
        """When the object was created (its ``timeCreated``), timezone-aware, as gcsfs gives it."""
        return self._file_time(path, "ctime")

    def modified(self, path: str) -> datetime.datetime:
        """When the object or its metadata last changed (its ``updated``), timezone-aware, as gcsfs gives it."""
        return self._file_time(path, "mtime")

    def _file_time(self, path: str, key: str) -> datetime.datetime:
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(f"{path} is a directory: GCS keeps times for objects only")
        moment: datetime.datetime = info[key]
        return moment

    async def _getxattr(self, path: str, attr: str) -> str:
        """The user metadata value ``attr`` of an object; ``KeyError`` if it has none, as gcsfs raises."""
        value: str = (await self._info(path)).get("metadata", {})[attr]
        return value

    getxattr = sync_wrapper(_getxattr)

    async def _glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        """fsspec's glob, with GCS asked for the names it may select only (``matchGlob``, see ``_find``)."""
        narrowed = tree_glob(self.split_path(path)[1])
        return await super()._glob(path, maxdepth=maxdepth, **kwargs, **({"match_glob": narrowed} if narrowed else {}))

    async def _find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        match_glob: str | None = None,
        prefix: str = "",
        **kwargs: Any,
    ) -> Any:
        """Everything under ``path`` (and ``path`` itself if it is an object) from one parallel flat listing,
        at most ``maxdepth`` levels below ``path`` if given (as gcsfs does: a missing bucket raises).
        ``prefix``, as gcsfs's: only the names under ``path`` that start with ``path/prefix``, which GCS
        selects (its ``prefix`` parameter); ``path`` itself is not among them, and with ``withdirs`` only the
        directories that start so are. ``match_glob``: a GCS ``matchGlob`` that GCS may apply to the listing
        (the caller still filters). It neither reads nor fills the listings cache."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__} {brief(prefix)}")
        bucket, name, generation = self._split_version(path)
        within = name
        if prefix:
            within = (name if not name or name.endswith("/") else f"{name}/") + prefix
            self.split_path(f"{bucket}/{within}")  # a prefix GCS would refuse raises InvalidPathError
        if generation is not None:  # one version: itself alone, never the live object or what is under its name
            version = self._strip_protocol(path)
            try:
                found = {version: {**await self._info(path), "name": version}}
            except FileNotFoundError:
                found = {}
        elif kwargs.get("versions"):  # every version of every object, each named name#<generation>, as gcsfs does
            found = {
                entry["name"]: entry
                for entry in await self._versions(self._context(), bucket, name)
                if entry["name"].startswith(f"{bucket}/{within}")
            }
        else:
            top = f"{bucket}/{name}".rstrip("/")
            # a whole listing is kept as gcsfs keeps it, but not for an rm, which drops what it listed
            whole = not prefix and match_glob is None and not self._writing_under(top) and LISTED.get() is None
            epoch = self._epoch  # an invalidation while listing: the listing may not hold what was changed
            batches = [
                batch
                async for batch in list_objects_async(
                    self._gcs,
                    bucket,
                    within,
                    MAX_PAGE_SIZE,
                    LISTING_CONCURRENCY,
                    match_glob=match_glob,
                    as_prefix=bool(prefix),
                    item_fields=None,
                    placeholders=True,
                )
            ]
            found = {entry["name"]: entry for batch in batches for entry in (self._file(bucket, b) for b in batch)}
            if whole and await self._objects_tell_folders(bucket):
                self._keep_listings(top, [entry for n, entry in found.items() if n.startswith(f"{top}/")], epoch)
        if withdirs:
            top = f"{bucket}/{within}" if prefix else f"{bucket}/{name}".rstrip("/")
            for entry_name in list(found):
                parent = entry_name.rpartition("/")[0]
                while "/" in parent and parent.startswith(top) and parent not in found:  # never the bucket
                    found[parent] = self._directory(parent)
                    parent = parent.rpartition("/")[0]
        if maxdepth is not None:
            deepest = f"{bucket}/{name}".rstrip("/").count("/") + maxdepth
            found = {entry_name: entry for entry_name, entry in found.items() if entry_name.count("/") <= deepest}
        listed = LISTED.get()
        if listed is not None:  # an rm deletes what it found only while it is the generation listed
            listed.update((n, entry["generation"]) for n, entry in found.items() if entry["type"] == "file")
        names = sorted(found)
        return {n: found[n] for n in names} if detail else names

    async def _objects_tell_folders(self, bucket: str) -> bool:
        """Whether a listing of the bucket's objects tells all its folders: not in a hierarchical namespace,
        whose empty folders hold no object."""
        try:
            return not await self._has_folders(self._context(), bucket)
        except NotFoundError:  # GCS answers it for every bucket it lists: a server without it has no folders
            self._hierarchical[bucket] = False
            return True
        except GCSError:  # not known: the listings stay GCS's
            return False

    async def _has_folders(self, context: RequestContext, bucket: str) -> bool:
        """Whether the bucket has a hierarchical namespace, whose folders outlive their objects (asked once)."""
        if bucket not in self._hierarchical:
            layout = await storage_layout(context, bucket)
            self._hierarchical[bucket] = bool((layout.get("hierarchicalNamespace") or {}).get("enabled"))
        return self._hierarchical[bucket]


async def pages(context: RequestContext, bucket: str, params: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The pages of the listing ``params`` asks for, following ``nextPageToken`` (``params`` is updated)."""
    url = format_url(bucket, params.get("prefix") or params.get("startOffset", ""))
    trail = PageTrail(url)
    while True:
        page = await list_page(context, bucket, params, url=url)
        yield page
        token = trail.follow_json(page)
        if token is None:
            return
        params["pageToken"] = token
