"""Listing of a ``gs://`` URL into the objects it names, in GCS's name order, and the metadata of
objects named one by one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from contextlib import aclosing
from typing import Any

from .._ops.checksums import REQUIRED_FIELDS, ObjectInfo
from .._ops.client import Client
from .._ops.objects import object_resource
from .._ops.paging import ITEM_FIELDS
from .._ops.urls import TEMPORARY_PREFIX, parse_url
from .._transport.context import RequestContext
from .._transport.http import is_missing_bucket
from .._transport.loop import iterate
from ..errors import NotFoundError
from .parallel_listing import ListingStats, list_prefix_async


async def list_objects_async(
    client: Client,
    bucket: str,
    name: str,
    page_size: int,
    concurrency: int = 1,
    stats: ListingStats | None = None,
    after: str | None = None,
    match_glob: str | None = None,
    *,
    as_prefix: bool = False,
    item_fields: str | None = ITEM_FIELDS,
    placeholders: bool = False,
) -> AsyncGenerator[list[dict[str, Any]], None]:
    """Expand ``gs://bucket/name`` into batches of object resources in GCS's name order.

    Each resource holds ``item_fields``: by default those ``ObjectInfo.from_json`` reads (``None``: all of
    them but the ACL). Batches hold the resources alone, no pair per object: a tuple holding a dict stays
    tracked by the garbage collector, and 100,000 of them brought on a full collection of the process's heap.

    An empty name or one ending in ``/`` is a prefix: every object under it. Any other name is an
    object and a folder: the object of that exact name (if it exists), then everything under
    ``name/`` (so ``gs://b/data`` never picks up ``gs://b/database.csv``). Zero-byte ``.../``
    folder placeholders are skipped unless ``placeholders``, and so are temporary objects under
    ``TEMPORARY_PREFIX`` unless that is what is listed. A missing bucket raises ``NotFoundError``. Up to
    ``concurrency`` list requests run at once; ``stats`` counts them. With ``after``, only names
    greater than it are listed (how an interrupted listing resumes). With ``match_glob`` GCS lists
    only the names under the prefix that this glob selects (``matchGlob``; the object of the exact
    name is asked for whatever the glob). With ``as_prefix``, ``name`` is a prefix of the names listed
    whatever it ends with (``dir/ab``: ``dir/ab.txt`` and ``dir/abc/x``), with no object asked for.
    To be iterated on the I/O loop; closing it cancels the listing.
    """
    stats = stats if stats is not None else ListingStats()
    prefix = name
    if name and not name.endswith("/") and not as_prefix:
        prefix = name + "/"
        exact = (
            await object_resource(client.call_context(), bucket, name, item_fields)
            if after is None or name > after
            else None
        )
        if exact is not None:
            yield [exact]
    hidden = "" if prefix.startswith(TEMPORARY_PREFIX) else TEMPORARY_PREFIX  # another job's composites
    pages = list_prefix_async(client, bucket, prefix, page_size, concurrency, stats, after, match_glob, item_fields)
    async with aclosing(pages):
        async for page in pages:
            yield [
                item
                for item in page
                if (placeholders or not (item["name"].endswith("/") and item["size"] == "0"))
                and not (hidden and item["name"].startswith(hidden))
            ]


def list_objects(
    client: Client,
    bucket: str,
    name: str,
    page_size: int,
    concurrency: int = 1,
    stats: ListingStats | None = None,
    after: str | None = None,
    match_glob: str | None = None,
    *,
    as_prefix: bool = False,
    item_fields: str | None = ITEM_FIELDS,
) -> Generator[list[dict[str, Any]], None, None]:
    """:func:`list_objects_async` for a blocking caller, each batch handed over as it is ready; closing
    the iterator, or Ctrl-C while it waits, cancels the listing."""
    return iterate(
        list_objects_async(
            client,
            bucket,
            name,
            page_size,
            concurrency,
            stats,
            after,
            match_glob,
            as_prefix=as_prefix,
            item_fields=item_fields,
        )
    )


async def describe(context: RequestContext, urls: Sequence[str]) -> list[ObjectInfo | NotFoundError]:
    """Each object's size, generation, crc32c and storage class (one metadata request each, as many at
    once as ``context``'s slots allow), or the error saying it does not exist; a missing bucket raises."""

    async def one(url: str) -> ObjectInfo | NotFoundError:
        bucket, name = parse_url(url, allow_prefix=False)
        try:
            resource = await object_resource(
                context, bucket, name, ITEM_FIELDS, required=REQUIRED_FIELDS, missing_ok=False
            )
        except NotFoundError as exc:
            if is_missing_bucket(exc):  # never a missing object to skip
                raise
            return exc
        return ObjectInfo.from_json(resource)  # type: ignore[arg-type]  # missing_ok=False: never None

    return await asyncio.gather(*(one(url) for url in urls))


def describe_objects(client: Client, urls: Sequence[str], batch: int = 1024) -> Iterator[ObjectInfo | NotFoundError]:
    """:func:`describe` for a blocking caller, ``batch`` objects at a time (as one call of the client: its
    requests under the default concurrency limit), in the order of ``urls``."""
    for start in range(0, len(urls), batch):
        yield from client.run(describe, urls[start : start + batch])
