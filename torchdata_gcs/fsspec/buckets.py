"""Bucket operations, as gcsfs has them: ``mkdir`` of a bucket creates it in the filesystem's project,
``rmdir`` deletes an empty one, ``buckets`` names the project's; GCS has no directories below a bucket to
make or delete."""

from __future__ import annotations

import contextlib
from typing import Any

from fsspec.asyn import sync_wrapper

from .._ops.objects import check_bucket, create_bucket, delete_bucket
from .._ops.urls import format_url
from ..errors import AccessDeniedError, GCSError, NotFoundError
from .calls import on_io_loop
from .listing import Listing

__all__ = ["BucketExistsError", "BucketNotEmptyError", "Buckets"]


class BucketExistsError(GCSError, FileExistsError):
    """``mkdir`` of a bucket whose name is taken (GCS answers 409): bucket names are global, so a bucket of
    another project takes the name as well."""


class BucketNotEmptyError(GCSError, OSError):
    """``rmdir`` of a bucket that holds objects (GCS answers 409): GCS deletes only empty buckets."""


class Buckets(Listing):
    """Making, deleting and naming buckets."""

    default_location: str | None

    @property
    def buckets(self) -> list[str]:
        """The names of ``project``'s buckets, as gcsfs's ``buckets``: ``ls("")``."""
        names: list[str] = self.ls("")
        return names

    @on_io_loop
    async def _mkdir(self, path: str, create_parents: bool = False, location: str | None = None, **kwargs: Any) -> None:
        """As gcsfs's: ``mkdir("bucket")`` creates the bucket in ``project`` (in ``location``, else
        ``default_location``, else GCS's default) unless it exists (``BucketExistsError`` if its name is taken
        elsewhere). A deeper path has nothing to make (GCS has no directories) but its bucket: a missing one
        is created with ``create_parents=True`` and raises ``FileNotFoundError`` otherwise. An identity that
        may write objects but not list them (Storage Object Creator) cannot tell whether the bucket exists:
        a deeper path passes, and its first write will say."""
        bucket, name = self.split_path(path)
        exists = await self._bucket_exists(bucket)
        if exists or (exists is None and name):
            return
        if name and not create_parents:
            url = format_url(bucket)
            raise NotFoundError(f"bucket {bucket!r} does not exist: mkdir creates it with create_parents=True", url=url)
        try:
            await create_bucket(
                self._context(), self._project_for("create a bucket"), bucket, location or self.default_location
            )
        except GCSError as exc:
            if exc.status != 409:
                raise
            raise BucketExistsError(f"a bucket named {bucket!r} exists already: {exc}", url=exc.url) from None
        self.invalidate_cache(bucket)

    @on_io_loop
    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Nothing to make (GCS has no directories; buckets are made by ``mkdir``); a bucket that does not
        exist raises ``FileNotFoundError``."""
        with contextlib.suppress(AccessDeniedError):  # listing refused: its first write will say
            await check_bucket(self._context(), self.split_path(path)[0])  # NotFoundError if missing

    @on_io_loop
    async def _rmdir(self, path: str) -> None:
        """As gcsfs's: delete the bucket ``path`` names, if empty (``BucketNotEmptyError`` otherwise); a deeper
        path has nothing to delete (GCS has no directories)."""
        bucket, name = self.split_path(path)
        if name:
            return
        try:
            await delete_bucket(self._context(), bucket)
        except GCSError as exc:
            if exc.status != 409:
                raise
            raise BucketNotEmptyError(f"bucket {bucket!r} holds objects: {exc}", url=exc.url) from None
        finally:
            self.invalidate_cache(bucket)

    rmdir = sync_wrapper(_rmdir)  # fsspec makes no blocking twin of _rmdir itself

    async def _bucket_exists(self, bucket: str) -> bool | None:
        """Whether the bucket exists, asked with ``storage.objects.list`` alone; ``None`` if listing is refused."""
        try:
            await check_bucket(self._context(), bucket)
        except NotFoundError:
            return False
        except AccessDeniedError:
            return None
        return True
