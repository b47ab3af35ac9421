"""Removing: objects deleted one by one or in batches, each only while it is the version listed, with the
folder placeholders and the folders of a hierarchical namespace under a tree removed; buckets are never
deleted here."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .._ops.batch import delete_objects
from .._ops.client import RequestContext
from .._ops.objects import check_bucket, delete_folder, delete_object, live_generation
from .._ops.paging import MAX_PAGE_SIZE
from .._ops.patterns import has_magic
from .._ops.urls import format_url
from ..errors import AccessDeniedError, NotFoundError, PreconditionFailedError
from .calls import in_bulk_on_io_loop, on_io_loop
from .listing import LISTED, Listing, pages
from .paths import folders_of

__all__ = ["Removing"]

logger = logging.getLogger(__name__)


class Removing(Listing):
    """Deleting objects, and the folders that go with them."""

    @on_io_loop
    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        bucket, name, url = self._object(path, version=True)
        try:
            deleted = await delete_object(self._context(), bucket, name, generation=self._split_version(path)[2])
        finally:
            self._drop_listings([path])
        if not deleted:
            raise NotFoundError(f"{url}: no such object", url=url)

    @in_bulk_on_io_loop
    async def _rm(
        self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None, **kwargs: Any
    ) -> None:
        """Delete every object ``path`` expands to; directories go with their objects (a directory without
        ``recursive=True`` raises ``IsADirectoryError``), and with ``recursive=True`` and no ``maxdepth`` the
        folders of a hierarchical namespace go too; a glob without it skips the directories it matches. Buckets
        are never deleted: one named without ``recursive=True`` raises ``IsADirectoryError`` (gcsfs deletes an
        empty one), and with it only its objects go (an empty one: nothing, and no error).

        One object goes by a plain delete; more go in batch requests of up to 100 deletes, each only if the
        object is still the generation its listing found (else its live generation is asked first), and an
        object replaced since is deleted alone, as a single ``rm`` deletes it."""
        listed: dict[str, int] = {}
        watching = LISTED.set(listed)
        try:
            paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        finally:
            LISTED.reset(watching)
        context = self._context()
        objects = [(p, *self._object(p, version=True)[:2]) for p in paths if self.split_path(p)[1]]
        buckets = [p for p in paths if not self.split_path(p)[1]]
        if buckets and not recursive:  # gcsfs deletes an empty bucket here; buckets are not deleted by rm
            await check_bucket(context, buckets[0])  # NotFoundError, a FileNotFoundError, if missing
            raise IsADirectoryError(f"{buckets[0]} is a bucket: rm does not delete buckets")
        try:
            deleted = await self._delete_objects(context, objects, listed)
        finally:
            self._drop_listings(p for p, _, _ in objects)
        named = {self._strip_protocol(p) for p in ([path] if isinstance(path, str) else path)}
        missed = [p for (p, _, _), gone in zip(objects, deleted, strict=True) if not gone]
        if not recursive:  # a directory a glob matched is skipped, as gcsfs does; one named is refused
            missed = [p for p in missed if p in named or not await self._isdir(p)]
        emptied = {
            folder for p, gone in zip(objects, deleted, strict=True) if gone for folder in folders_of(p[0])
        }  # named with what they held (as rm(find(path, withdirs=True)) names them), gone with it
        for p in missed if not recursive else []:
            if await self._isdir(p):
                raise IsADirectoryError(f"{p} is a directory: remove it with recursive=True")
            if self._strip_protocol(p).rstrip("/") not in emptied:
                raise NotFoundError(f"gs://{p}: no such object", url=f"gs://{p}")
        if recursive:
            tops = [] if maxdepth is not None else [path] if isinstance(path, str) else path  # deeper ones stay
            tops = [top for top in tops if self._split_version(top)[2] is None]  # a version is no folder
            folders = await asyncio.gather(
                *(self._remove_folders(context, *self.split_path(top)) for top in tops if not has_magic(top))
            )
            if not any(deleted) and not any(folders) and not buckets:  # an existing bucket names something
                raise NotFoundError(f"nothing to remove under {path}", url=str(path))

    async def _remove_folders(self, context: RequestContext, bucket: str, name: str) -> int:
        """Delete the folder ``name/`` of a bucket with a hierarchical namespace and every folder under it,
        deepest first, once their objects are gone (GCS deletes only empty folders, and keeps them otherwise);
        returns how many went, folder placeholders included. A flat bucket pays one listing: only if something
        is left under ``name/`` are its placeholders looked for and the bucket's storage layout asked (once per
        bucket). Without ``storage.folders.delete`` the folders stay, with a warning: the objects are gone,
        which is what removing them asked. A whole bucket (``name`` empty) pays one listing, for placeholders."""
        if not name:
            return await self._remove_placeholders(context, bucket, name)
        if not await self._is_directory(context, bucket, name):
            return 0
        placeholders = await self._remove_placeholders(context, bucket, name)
        if not await self._has_folders(context, bucket):
            return placeholders
        level, folders = [f"{name}/"], [f"{name}/"]
        while level:
            below = await asyncio.gather(*(self._subfolders(context, bucket, folder) for folder in level))
            level = [folder for found in below for folder in found]
            folders += level
        removed = placeholders
        try:
            for depth in sorted({folder.count("/") for folder in folders}, reverse=True):
                at_depth = [folder for folder in folders if folder.count("/") == depth]
                removed += sum(await asyncio.gather(*(delete_folder(context, bucket, folder) for folder in at_depth)))
        except AccessDeniedError as exc:
            logger.warning(
                "the objects under %s are removed, its empty folders stay: %s", format_url(bucket, name), exc
            )
        finally:
            self.invalidate_cache(f"{bucket}/{name}")
        return removed

    @staticmethod
    async def _remove_placeholders(context: RequestContext, bucket: str, name: str) -> int:
        """Delete the folder placeholders under ``name/`` (the whole bucket if ``name`` is empty): zero-byte
        ``.../`` objects, such as ``touch("dir/")`` writes (left if made meanwhile); each only while it is the
        generation listed. How many went."""
        params = {
            "prefix": f"{name}/" if name else "",
            "maxResults": MAX_PAGE_SIZE,
            "fields": "items(name,size,generation),nextPageToken",
        }
        left = [
            (item["name"], int(item["generation"]))
            async for page in pages(context, bucket, params)
            for item in page.get("items", [])
            if item["name"].endswith("/") and int(item["size"]) == 0
        ]
        gone = await asyncio.gather(*(delete_object(context, bucket, n, if_generation_match=g) for n, g in left))
        return sum(gone)

    @staticmethod
    async def _subfolders(context: RequestContext, bucket: str, folder: str) -> list[str]:
        """The folders (and prefixes of objects) one level under ``folder``."""
        params = {
            "prefix": folder,
            "delimiter": "/",
            "includeFoldersAsPrefixes": "true",
            "maxResults": MAX_PAGE_SIZE,
            "fields": "prefixes,nextPageToken",
        }
        listed = [prefix async for page in pages(context, bucket, params) for prefix in page.get("prefixes", [])]
        return list(dict.fromkeys(listed))  # a page may name again a prefix an earlier page named

    async def _delete_objects(
        self, context: RequestContext, objects: list[tuple[str, str, str]], listed: dict[str, int]
    ) -> list[bool]:
        """Delete ``objects`` (path, bucket, name), those of ``listed`` paths by that generation; whether each
        was there to delete."""
        pinned = {p: g for p, _, _ in objects if (g := self._split_version(p)[2]) is not None}
        if len(objects) == 1 or pinned:  # a version named by its generation goes for good, by a delete of its own
            deletes = (delete_object(context, bucket, name, generation=pinned.get(p)) for p, bucket, name in objects)
            return list(await asyncio.gather(*deletes))
        unknown = [(bucket, name) for p, bucket, name in objects if p not in listed]
        found = await asyncio.gather(*(live_generation(context, bucket, name) for bucket, name in unknown))
        generations = {
            **dict(zip(unknown, found, strict=True)),
            **{(b, n): listed[p] for p, b, n in objects if p in listed},
        }
        deleted = dict.fromkeys(generations, False)
        for bucket in {bucket for _, bucket, _ in objects}:
            versions = [(n, g) for (b, n), g in generations.items() if b == bucket and g]
            for (name, _), outcome in zip(
                versions, await delete_objects(context, bucket, versions, live=True), strict=True
            ):
                if isinstance(outcome, PreconditionFailedError):  # replaced since it was listed
                    outcome = await delete_object(context, bucket, name)
                if isinstance(outcome, BaseException):
                    raise outcome
                deleted[bucket, name] = outcome
        return [deleted[bucket, name] for _, bucket, name in objects]
