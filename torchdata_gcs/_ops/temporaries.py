"""A job's temporary objects: the name of its prefix, every version under a prefix, and their deletion
for good, one at a time as the job goes or all of them (by the reaper once the job is gone, and listed by
``torchdata-gcs clean`` too)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

from .._transport.context import RequestContext
from ..errors import GCSError
from .batch import delete_objects
from .client import Client, ReaperTask
from .objects import delete_object
from .paging import MAX_PAGE_SIZE, PageTrail
from .urls import format_url, printable

__all__ = [
    "DeletePrefix",
    "delete_temporary",
    "list_soft_deleted",
    "list_versions",
    "new_job_id",
]

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 5.0
"""How long a prefix must stay empty before the reaper trusts it: requests the ended process had in
flight (a compose, an upload) can still complete on the server and create an object after it died."""


def new_job_id() -> str:
    """A name for one iteration's temporary composites: UTC start time, host, process and a random tag."""
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())[:32] or "host"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{host}-{os.getpid()}-{secrets.token_hex(3)}"


async def delete_temporary(context: RequestContext, bucket: str, name: str, generation: int | None) -> bool:
    """Delete the version ``generation`` of ``name`` for good (the live one if ``None``, which object
    versioning keeps as noncurrent), retried; ``True`` once it is gone, ``False`` if deleting failed (logged)."""
    try:
        await delete_object(context, bucket, name, generation=generation)
    except Exception as exc:  # noqa: BLE001 - the caller retries later or leaves it to `clean`
        logger.debug("deleting %s failed: %r", format_url(bucket, name), exc)
        return False
    return True


def list_versions(client: Client, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
    """Every version under ``prefix``, live and noncurrent (object versioning keeps a deleted or replaced
    object as noncurrent), as resources with ``name``, ``generation`` and ``timeCreated``; page by page."""
    return _listed(client, bucket, prefix, {"versions": "true"}, "name,generation,timeCreated")


def list_soft_deleted(client: Client, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
    """Every soft-deleted object under ``prefix`` (deleted, kept and billed until its ``hardDeleteTime`` by the
    bucket's soft delete policy), with ``name``, ``generation`` (one name may have several), ``size``,
    ``softDeleteTime`` and ``hardDeleteTime``; page by page. GCS lists them only when asked
    (``softDeleted=true``, which excludes ``versions=true``)."""
    return _listed(
        client, bucket, prefix, {"softDeleted": "true"}, "name,generation,size,softDeleteTime,hardDeleteTime"
    )


def _listed(
    client: Client, bucket: str, prefix: str, selector: dict[str, str], fields: str
) -> Iterator[dict[str, Any]]:
    url = f"gs://{bucket}/{prefix}"
    params: dict[str, Any] = {
        "prefix": prefix,
        **selector,
        "maxResults": MAX_PAGE_SIZE,
        "fields": f"items({fields}),nextPageToken",
    }
    trail = PageTrail(url)
    while True:
        page = client.list_page(bucket, params, url=url)
        yield from page.get("items", [])
        token = trail.follow_json(page)
        if token is None:
            return
        params["pageToken"] = token


class DeletePrefix(ReaperTask):
    """A reaper's task: delete every version under ``prefix`` in ``bucket`` for good."""

    def __init__(self, bucket: str, prefix: str, client: Client) -> None:
        super().__init__(client)
        self.bucket = bucket
        self.prefix = prefix

    def __str__(self) -> str:
        return f"deleting {printable(format_url(self.bucket, self.prefix))}"

    def run(self) -> None:
        client = self.client()
        tried: set[tuple[str, int]] = set()  # a version that could not be deleted is not tried again
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < SETTLE_SECONDS:
            listed = (
                (item["name"], int(item["generation"])) for item in list_versions(client, self.bucket, self.prefix)
            )
            versions = [version for version in listed if version not in tried]
            if versions:
                tried.update(versions)
                self._delete(client, versions)
                quiet_since = time.monotonic()
            time.sleep(1.0)

    def _delete(self, client: Client, versions: list[tuple[str, int]]) -> None:
        for (name, _), outcome in zip(
            versions, client.run(delete_objects, self.bucket, versions, live=False), strict=True
        ):
            if isinstance(outcome, GCSError):
                logger.warning(
                    "could not delete %s (%s): a lifecycle rule or `torchdata-gcs clean` removes it",
                    printable(format_url(self.bucket, name)),
                    outcome,
                )
