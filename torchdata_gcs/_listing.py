"""Sequential listing of a ``gs://`` URL into the objects it names, in GCS's name order."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ._client import Transport
from ._metadata import ObjectInfo
from ._retry import call_with_retry
from ._uri import format_url
from .config import RetryConfig
from .errors import GCSError, NotFoundError

logger = logging.getLogger(__name__)

_ITEM_FIELDS = "name,size,generation,crc32c"
MAX_PAGE_SIZE = 1000  # GCS never returns more per page


def _list_prefix(
    transport: Transport, bucket: str, prefix: str, retry: RetryConfig, page_size: int
) -> Iterator[dict[str, Any]]:
    """Every object resource whose name starts with ``prefix``, page by page."""
    url = format_url(bucket, prefix)
    params: dict[str, Any] = {
        "prefix": prefix,
        "maxResults": page_size,
        "projection": "noAcl",
        "fields": f"items({_ITEM_FIELDS}),nextPageToken",
    }
    path = transport.bucket_objects_path(bucket)
    previous = ""
    while True:
        page = call_with_retry(lambda: transport.get_json(path, url=url, params=params), retry, url=url)
        logger.debug("listed %d objects of %s", len(page.get("items", ())), url)
        for item in page.get("items", ()):
            if item["name"] <= previous:
                raise GCSError(f"listing of {url} came back out of order at {item['name']!r}", url=url)
            previous = item["name"]
            yield item
        token = page.get("nextPageToken")
        if not token:
            return
        params["pageToken"] = token


def _get_object(transport: Transport, bucket: str, name: str, retry: RetryConfig) -> dict[str, Any] | None:
    url = format_url(bucket, name)
    path = transport.object_path(bucket, name)
    try:
        return call_with_retry(
            lambda: transport.get_json(path, url=url, params={"fields": _ITEM_FIELDS}), retry, url=url
        )
    except NotFoundError:
        return None


def list_objects(
    transport: Transport, bucket: str, name: str, retry: RetryConfig, page_size: int
) -> Iterator[tuple[str, ObjectInfo]]:
    """Expand ``gs://bucket/name`` into ``(url, info)`` pairs in GCS's name order.

    An empty name or one ending in ``/`` is a prefix: every object under it. Any other name is an
    object and a folder: the object of that exact name (if it exists), then everything under
    ``name/`` (so ``gs://b/data`` never picks up ``gs://b/database.csv``). Zero-byte ``.../``
    folder placeholders are skipped. A missing bucket raises ``NotFoundError``.
    """
    if name and not name.endswith("/"):
        exact = _get_object(transport, bucket, name, retry)
        items: Iterator[dict[str, Any]] = _list_prefix(transport, bucket, name + "/", retry, page_size)
        if exact is not None:
            yield f"gs://{bucket}/{name}", ObjectInfo.from_json(exact)
    else:
        items = _list_prefix(transport, bucket, name, retry, page_size)
    for item in items:
        info = ObjectInfo.from_json(item)
        if info.size == 0 and item["name"].endswith("/"):
            continue
        yield f"gs://{bucket}/{item['name']}", info
