"""Listing of a ``gs://`` URL into the objects it names, in GCS's name order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._client import Transport
from ._metadata import ObjectInfo
from ._parallel_listing import ITEM_FIELDS, ListingStats, list_prefix_parallel
from ._retry import call_with_retry
from ._uri import format_url
from .config import RetryConfig
from .errors import NotFoundError

MAX_PAGE_SIZE = 1000  # GCS never returns more per page


def _get_object(transport: Transport, bucket: str, name: str, retry: RetryConfig) -> dict[str, Any] | None:
    url = format_url(bucket, name)
    path = transport.object_path(bucket, name)
    try:
        return call_with_retry(
            lambda: transport.get_json(path, url=url, params={"fields": ITEM_FIELDS}), retry, url=url
        )
    except NotFoundError:
        return None


def list_objects(
    transport: Transport,
    bucket: str,
    name: str,
    retry: RetryConfig,
    page_size: int,
    concurrency: int = 1,
    stats: ListingStats | None = None,
) -> Iterator[tuple[str, ObjectInfo]]:
    """Expand ``gs://bucket/name`` into ``(url, info)`` pairs in GCS's name order.

    An empty name or one ending in ``/`` is a prefix: every object under it. Any other name is an
    object and a folder: the object of that exact name (if it exists), then everything under
    ``name/`` (so ``gs://b/data`` never picks up ``gs://b/database.csv``). Zero-byte ``.../``
    folder placeholders are skipped. A missing bucket raises ``NotFoundError``. Up to
    ``concurrency`` list requests run at once; ``stats`` counts them.
    """
    stats = stats if stats is not None else ListingStats()
    if name and not name.endswith("/"):
        exact = _get_object(transport, bucket, name, retry)
        items = list_prefix_parallel(transport, bucket, name + "/", retry, page_size, concurrency, stats)
        if exact is not None:
            yield f"gs://{bucket}/{name}", ObjectInfo.from_json(exact)
    else:
        items = list_prefix_parallel(transport, bucket, name, retry, page_size, concurrency, stats)
    for item in items:
        info = ObjectInfo.from_json(item)
        if info.size == 0 and item["name"].endswith("/"):
            continue
        yield f"gs://{bucket}/{item['name']}", info
