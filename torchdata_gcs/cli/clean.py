"""``torchdata-gcs clean``: delete the temporary objects killed jobs left, abort the multipart uploads
they left open, and say what the bucket's soft delete policy still keeps of them."""

from __future__ import annotations

import argparse
import datetime
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .._ops.batch import delete_objects
from .._ops.client import Client
from .._ops.temporaries import list_soft_deleted, list_versions
from .._ops.uploads import UPLOAD_MARKERS, abort_upload, unfinished_uploads, upload_marker
from .._ops.urls import TEMPORARY_PREFIX, format_url, printable
from ..config import RetryConfig
from ..errors import AccessDeniedError, GCSError, NoMultipartListing
from .options import client_config
from .sizes import human_size

__all__ = ["checked_age", "clean", "leftovers", "rfc3339_seconds", "temporary_versions"]

T = TypeVar("T")

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def checked_age(text: str) -> str:
    """Accept ``0s``, ``90s``, ``30m``, ``6h`` or ``2d``."""
    if _AGE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"expected an age such as 30m, 6h or 2d, got {text!r}")
    return text


def _seconds(age: str) -> float:
    number, unit = _AGE.fullmatch(age).groups()  # type: ignore[union-attr]  # argparse checked the form
    return float(number) * _SECONDS[unit]


def _done(action: Callable[[T], bool], items: list[T], dry_run: bool) -> list[T]:
    """The items ``action`` took effect on, 16 at a time; all of them for a dry run, which runs nothing."""
    if dry_run:
        return items
    with ThreadPoolExecutor(16) as pool:
        return [item for item, done in zip(items, pool.map(action, items), strict=True) if done]


def _delete_versions(client: Client, bucket: str, versions: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Delete ``versions`` (name, generation) for good, in batch requests of up to 100; those that were there."""
    outcomes = client.run(delete_objects, bucket, versions, live=False)
    failure = next((outcome for outcome in outcomes if isinstance(outcome, GCSError)), None)
    if failure is not None:
        raise failure
    return [version for version, outcome in zip(versions, outcomes, strict=True) if outcome is True]


def clean(args: argparse.Namespace) -> int:
    """Run ``torchdata-gcs clean`` with the parsed ``args``; the exit code."""
    client = Client(client_config(args), RetryConfig())
    bucket, age, older_than = args.bucket, args.older_than, _seconds(args.older_than)
    versions = temporary_versions(client, bucket)  # one listing, before any abort: markers are among them
    found = leftovers(versions, older_than)
    now = time.time()
    try:
        old = [
            upload
            for upload in unfinished_uploads(client, bucket)
            if now - rfc3339_seconds(upload.initiated) >= older_than
        ]
    except NoMultipartListing as exc:
        print(f"multipart uploads not listed: {exc}, not with the uploads (an emulator without the XML API?)")
    else:
        marked = {item["name"] for item in versions if item["name"].startswith(UPLOAD_MARKERS)}
        ours = [upload for upload in old if args.all_uploads or upload_marker(upload.upload_id) in marked]
        aborted = _done(lambda upload: client.run(abort_upload, bucket, upload), ours, args.dry_run)
        verb = "would abort" if args.dry_run else "aborted"
        for upload in aborted:
            print(
                f"{verb} multipart upload {printable(format_url(bucket, upload.name))} "
                f"(upload ID {upload.upload_id}, initiated {upload.initiated})"
            )
        print(f"{verb} {len(aborted)} unfinished multipart upload(s) older than {age} in gs://{bucket}")
        if len(old) > len(ours):
            print(
                f"left {len(old) - len(ours)} unfinished multipart upload(s) older than {age} "
                "that torchdata-gcs did not start (--all-uploads aborts them too)"
            )

    deleted = found if args.dry_run else _delete_versions(client, bucket, found)
    verb = "would delete" if args.dry_run else "deleted"
    for name, _ in deleted:
        print(f"{verb} {printable(format_url(bucket, name))}")
    print(f"{verb} {len(deleted)} temporary object(s) older than {age} in gs://{bucket}/{TEMPORARY_PREFIX}")
    _report_soft_deleted(client, bucket)
    return 0


def _report_soft_deleted(client: Client, bucket: str) -> None:
    """Say how many deleted temporary objects the bucket's soft delete policy keeps, billed, and until when.
    Listing them is a report only: a refusal or failure is said, never raised."""
    where = f"gs://{bucket}/{TEMPORARY_PREFIX}"
    try:
        kept = list(list_soft_deleted(client, bucket, TEMPORARY_PREFIX))
    except GCSError as exc:
        refused = " (storage.objects.list refused)" if isinstance(exc, AccessDeniedError) else ""
        print(printable(f"soft-deleted temporary objects not listed{refused}: {str(exc).splitlines()[0]}"))
        return
    if not kept:
        print(f"no soft-deleted temporary objects under {where}")
        return
    if not all(item.get("softDeleteTime") for item in kept):  # GCS sets it on every soft-deleted object
        print(
            "soft-deleted temporary objects not listed: the endpoint answered softDeleted=true with live objects "
            "(an emulator without soft delete?)"
        )
        return
    size = human_size(sum(int(item.get("size", 0)) for item in kept))
    ends = [item["hardDeleteTime"] for item in kept if item.get("hardDeleteTime")]
    last = f", the last at {max(ends, key=rfc3339_seconds)}" if ends else ""
    print(
        f"{len(kept)} soft-deleted temporary object(s), {size}, under {where} stay billed until they expire{last}: "
        "no request removes them sooner (turning soft delete off spares only objects deleted after it)"
    )


def temporary_versions(client: Client, bucket: str) -> list[dict[str, Any]]:
    """Every version under ``TEMPORARY_PREFIX`` in ``bucket``, noncurrent ones included (object
    versioning keeps deleted ones, billed), with ``name``, ``generation`` and ``timeCreated``."""
    return list(list_versions(client, bucket, TEMPORARY_PREFIX))


def leftovers(versions: list[dict[str, Any]], older_than: float) -> list[tuple[str, int]]:
    """The ``versions`` created more than ``older_than`` seconds ago, as ``(name, generation)``.

    Age is the version's own creation time: the job time in a name is when the job started, and a
    long job keeps writing under it.
    """
    now = time.time()
    return [
        (item["name"], int(item["generation"]))
        for item in versions
        if now - rfc3339_seconds(item["timeCreated"]) >= older_than
    ]


def rfc3339_seconds(value: str) -> float:
    """A GCS timestamp (``2026-11-24T10:00:00.123Z``) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
