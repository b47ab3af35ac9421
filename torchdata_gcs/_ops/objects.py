"""Single-request verbs of the JSON API, as coroutines retried under a request context: a bucket's
list page and settings, an object's metadata, a small object's bytes, create, compose, delete; and a
project's buckets: list, create, delete.
:class:`~torchdata_gcs._ops.client.Client` is their synchronous twin."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

from .._transport.context import RequestContext, with_retry
from .._transport.http import is_missing_bucket, missing_bucket
from ..errors import (
    AccessDeniedError,
    GCSError,
    IntegrityError,
    NotFoundError,
    PreconditionFailedError,
    TransientError,
)
from .checksums import REQUIRED_FIELDS, ObjectInfo, crc32c_base64, reported_crc32c, verify_bytes
from .paging import MAX_PAGE_SIZE, PageTrail
from .urls import format_url

__all__ = [
    "MAX_SOURCES",
    "TEMPORARY_CLASS",
    "bucket_resource",
    "check_bucket",
    "check_published",
    "compose_object",
    "create_bucket",
    "create_object",
    "delete_bucket",
    "delete_folder",
    "delete_object",
    "delete_request",
    "is_delete_answer",
    "list_buckets",
    "list_page",
    "live_generation",
    "multipart_body",
    "object_resource",
    "patch_object",
    "read_object",
    "rewrite_object",
    "storage_layout",
]

T = TypeVar("T")

MAX_SOURCES = 32
"""GCS composes at most this many source objects in one call."""

TEMPORARY_CLASS = "STANDARD"
"""The storage class of the library's temporary objects, whatever the bucket's default: the other classes
bill a minimum storage duration (30 to 365 days) to an object deleted minutes after it was written."""


async def _get_json(
    context: RequestContext, url: str, path: str, params: dict[str, Any], required: Sequence[str] = ()
) -> Any:
    async def attempt() -> Any:
        # listing pages shrink several times compressed; json_answer decompresses
        async with context.session.send("GET", url, path, params, headers={"Accept-Encoding": "gzip"}) as response:
            return await context.session.json_answer(response, url, required)

    return await with_retry(context, url, attempt)


async def list_page(context: RequestContext, bucket: str, params: dict[str, Any], *, url: str) -> dict[str, Any]:
    """One page of the bucket's object listing for the query ``params`` (``url`` names it in errors); a
    404 can only mean that the bucket does not exist, whatever the answer's words."""
    try:
        return await _get_json(context, url, context.session.bucket_path(bucket) + "/o", params)
    except NotFoundError:
        raise missing_bucket(bucket, url) from None


async def check_bucket(context: RequestContext, bucket: str) -> None:
    """Make sure the bucket exists, with object permissions only: a listing of at most one object
    (``storage.objects.list``, which Storage Object Viewer, User and Admin hold) answers 404 for a missing
    bucket, where getting the bucket needs ``storage.buckets.get``, which no object role holds.

    Raises ``NotFoundError`` if it does not exist, ``AccessDeniedError`` if listing is refused (then
    nothing tells whether it does)."""
    url = format_url(bucket)
    try:
        await list_page(context, bucket, {"maxResults": 1, "fields": "kind"}, url=url)
    except AccessDeniedError as exc:
        raise AccessDeniedError(
            f"cannot tell whether {url} exists: that needs storage.objects.list ({exc})", url=url, status=exc.status
        ) from None


async def bucket_resource(context: RequestContext, bucket: str, fields: str) -> dict[str, Any]:
    """The bucket's JSON resource trimmed to ``fields`` (needs ``storage.buckets.get``, which object roles lack:
    only for what may go without, such as ``doctor``'s report of settings)."""
    return await _get_json(context, format_url(bucket), context.session.bucket_path(bucket), {"fields": fields})


async def storage_layout(context: RequestContext, bucket: str) -> dict[str, Any]:
    """The bucket's location and whether it has a hierarchical namespace (``getStorageLayout``), for callers
    that may list objects but not get the bucket: it needs ``storage.objects.list`` only."""
    return await _get_json(context, format_url(bucket), f"{context.session.bucket_path(bucket)}/storageLayout", {})


async def list_buckets(context: RequestContext, project: str) -> list[dict[str, Any]]:
    """The bucket resources of ``project``, every page, in name order (``storage.buckets.list`` on the
    project, which object roles lack)."""
    params: dict[str, Any] = {"project": project, "maxResults": MAX_PAGE_SIZE}
    trail = PageTrail(f"the buckets of project {project}")
    buckets: list[dict[str, Any]] = []
    while True:
        page = await _get_json(context, "gs://", f"{context.session.endpoint}/storage/v1/b", params)
        buckets += page.get("items", [])
        token = trail.follow_json(page)
        if token is None:
            return buckets
        params["pageToken"] = token


async def create_bucket(context: RequestContext, project: str, bucket: str, location: str | None = None) -> None:
    """Create ``bucket`` in ``project`` (``storage.buckets.create``), in ``location`` if given (else GCS's
    default, the ``US`` multi-region), with GCS's defaults for the rest, as google-cloud-storage creates one.
    Sent once: a retry answered 409 could not tell a name taken by someone else from this very request. A
    name taken (bucket names are global) raises ``GCSError`` with status 409."""
    url = format_url(bucket)
    body = {"name": bucket, **({"location": location} if location else {})}

    async def send_once() -> None:
        path = f"{context.session.endpoint}/storage/v1/b"
        async with context.session.send("POST", url, path, {"project": project}, json=body) as response:
            await response.read()

    await _write(context, url, send_once, repeatable=False)


async def delete_bucket(context: RequestContext, bucket: str) -> None:
    """Delete an empty bucket (``storage.buckets.delete``, which GCS deems idempotent); ``NotFoundError`` if
    there is none, and ``GCSError`` with status 409 if it holds objects (GCS deletes only empty buckets). A
    retry answered 404 finds the bucket deleted by an earlier attempt whose answer was lost."""
    url = format_url(bucket)
    attempts = 0

    async def send_once() -> None:
        nonlocal attempts
        attempts += 1
        try:
            async with context.session.send("DELETE", url, context.session.bucket_path(bucket), {}) as response:
                await response.read()
        except NotFoundError:
            if attempts == 1:
                raise missing_bucket(bucket, url) from None

    await with_retry(context, url, send_once)


async def object_resource(
    context: RequestContext,
    bucket: str,
    name: str,
    fields: str | None,
    *,
    generation: int | None = None,
    required: Sequence[str] = (),
    missing_ok: bool = True,
) -> dict[str, Any] | None:
    """The object's JSON resource (of ``generation``, else the live one) trimmed to ``fields`` (``None``: all
    of it but its ACL), or ``None`` if it does not exist (``NotFoundError`` unless ``missing_ok``; always if
    its bucket does not); an answer that lacks a ``required`` field is retried."""
    params: dict[str, Any] = {"fields": fields} if fields is not None else {"projection": "noAcl"}
    if generation is not None:
        params["generation"] = generation
    try:
        return await _get_json(
            context, format_url(bucket, name), context.session.object_path(bucket, name), params, required
        )
    except NotFoundError as exc:
        if not missing_ok or is_missing_bucket(exc):
            raise
        return None


async def read_object(context: RequestContext, bucket: str, name: str) -> bytes | None:
    """A small object's stored bytes, checked against GCS's crc32c, or ``None`` if it does not exist
    (``NotFoundError`` if its bucket does not)."""
    url = format_url(bucket, name)
    path = context.session.media_path(bucket, name)

    async def attempt() -> bytes:
        async with context.session.read_media(url, path, {"alt": "media"}) as response:
            data = await response.read()  # stored bytes, as the checksum covers
            verify_bytes(url, [data], None, {"GCS": reported_crc32c(response.headers)})
            return data

    try:
        return await with_retry(context, url, attempt)
    except NotFoundError as exc:
        if is_missing_bucket(exc):
            raise
        return None


def multipart_body(
    name: str,
    data: bytes | bytearray | memoryview,
    content_type: str = "application/octet-stream",
    crc32c: int | None = None,
    storage_class: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> tuple[list[bytes | bytearray | memoryview], dict[str, str]]:
    """The body (as pieces, ``data`` itself among them, never copied) and headers of a JSON API multipart
    upload of ``data`` as ``name``, its crc32c in the metadata so that GCS refuses bytes damaged on the
    way (computed from bytes; a bytearray or memoryview must come with it), in ``storage_class`` if given
    (else the bucket's default), with the resource ``fields`` given (user metadata, cache control...)."""
    boundary = uuid.uuid4().hex
    checksum = crc32c_base64(data if crc32c is None else crc32c)
    resource = {**(fields or {}), "name": name, "crc32c": checksum, "contentType": content_type}
    if storage_class is not None:
        resource["storageClass"] = storage_class
    metadata = json.dumps(resource)
    body = [
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n"
        f"--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
        data,
        f"\r\n--{boundary}--\r\n".encode(),
    ]
    return body, {"Content-Type": f"multipart/related; boundary={boundary}"}


async def live_generation(context: RequestContext, bucket: str, name: str) -> int:
    """The generation of the live object ``name``, 0 if there is none: as ``ifGenerationMatch``, it makes
    replacing the object a write GCS applies at most once, so one that may be retried."""
    live = await object_resource(context, bucket, name, "generation", required=("generation",))
    return 0 if live is None else int(live["generation"])


class _EarlierAttemptMayHaveWon(Exception):
    """A retry of a write answered 412 or 404 (``error``): ends the retries, so that what the URL holds
    is asked without holding a concurrency slot (the question needs one of its own)."""

    def __init__(self, error: GCSError) -> None:
        super().__init__(str(error))
        self.error = error


async def _write(
    context: RequestContext,
    url: str,
    send_once: Callable[[], Awaitable[T]],
    *,
    repeatable: bool,
    earlier_won: Callable[[GCSError], Awaitable[T]] | None = None,
) -> T:
    """Send a write, retried if ``repeatable`` (see ``with_retry``). A retry answered 412 or 404 may
    mean that an earlier attempt was carried out and only its answer was lost: ``earlier_won`` then
    says what that attempt did (or raises the error it is given)."""
    attempts = 0

    async def attempt() -> T:
        nonlocal attempts
        attempts += 1
        try:
            return await send_once()
        except (PreconditionFailedError, NotFoundError) as exc:
            if attempts == 1 or earlier_won is None or is_missing_bucket(exc):
                raise
            raise _EarlierAttemptMayHaveWon(exc) from None

    try:
        return await with_retry(context, url, attempt, repeatable=repeatable)
    except _EarlierAttemptMayHaveWon as outcome:
        assert earlier_won is not None
        return await earlier_won(outcome.error)


async def create_object(
    context: RequestContext,
    bucket: str,
    name: str,
    data: bytes | bytearray | memoryview,
    *,
    if_generation_match: int | None = None,
    content_type: str = "application/octet-stream",
    crc32c: int | None = None,
    storage_class: str | None = None,
    fields: Mapping[str, Any] | None = None,
    kms_key_name: str | None = None,
) -> int:
    """Write ``data`` (bytes, or a bytearray or memoryview with its ``crc32c``) in one multipart upload and return
    the new generation; the body is sent in pieces, ``data`` never copied. The object takes ``storage_class``
    if given, else the bucket's default, and the resource ``fields`` given (see ``ObjectAttributes.fields``),
    encrypted by the Cloud KMS key ``kms_key_name`` if given (``kmsKeyName``), else as the bucket encrypts.

    The crc32c (computed unless given) travels in the metadata, so GCS refuses bytes damaged on the way, and
    the crc32c GCS reports for what it stored must be the same (see :func:`check_published`). With
    ``if_generation_match`` (0: only if the object does not exist; see :func:`live_generation`) the upload
    is retried and a mismatch raises ``PreconditionFailedError``, except when a retry meets the write of
    its own earlier attempt whose answer was lost: an object of exactly these bytes is then taken as ours.
    Without it, the upload is sent once. When no answer comes back whole (``TransientError``), the object
    is looked at before failing, and one of exactly these bytes, not the version replaced, is ours too.
    """
    url = format_url(bucket, name)
    body, headers = multipart_body(name, data, content_type, crc32c, storage_class, fields)
    expected = crc32c_base64(data if crc32c is None else crc32c)
    # The name in the query as well as in the metadata (GCS takes either): request lines then say what they write.
    params: dict[str, Any] = {"uploadType": "multipart", "name": name, "fields": "generation,crc32c"}
    if kms_key_name is not None:
        params["kmsKeyName"] = kms_key_name
    if if_generation_match is not None:
        params["ifGenerationMatch"] = if_generation_match
    path = context.session.upload_path(bucket)

    async def send_once() -> tuple[int, str]:
        async with context.session.send("POST", url, path, params, headers, data=body) as response:
            written = await context.session.json_answer(response, url, ("generation", "crc32c"))
            return int(written["generation"]), written["crc32c"]

    async def ours() -> tuple[int, str] | None:
        """The live object, if it holds exactly these bytes and is not the version this write replaces."""
        live = await object_resource(context, bucket, name, "generation,size,crc32c")
        if (
            live is None
            or int(live["size"]) != len(data)
            or live.get("crc32c") != expected
            or int(live["generation"]) == if_generation_match
        ):
            return None
        return int(live["generation"]), expected

    async def earlier_won(error: GCSError) -> tuple[int, str]:
        found = await ours() if isinstance(error, PreconditionFailedError) else None
        if found is None:
            raise error
        return found

    try:
        generation, reported = await _write(
            context, url, send_once, repeatable=if_generation_match is not None, earlier_won=earlier_won
        )
    except NotFoundError:  # an upload creates the object: only its bucket can be missing
        raise missing_bucket(bucket, url) from None
    except TransientError:  # every answer lost or cut: the upload may have been carried out all the same
        try:
            found = await ours()
        except GCSError:
            found = None
        if found is None:
            raise
        generation, reported = found
    await check_published(context, bucket, name, generation, reported, expected)
    return generation


async def check_published(
    context: RequestContext, bucket: str, name: str, generation: int, reported: str | None, expected: str
) -> None:
    """Make sure the version ``generation`` just published holds the bytes written: GCS checks the crc32c
    sent with them, but a server or proxy on the way that does not would otherwise store damaged bytes
    unnoticed. A crc32c ``reported`` for it other than ``expected`` deletes that
    version (``ifGenerationMatch``, never a newer one) and raises ``IntegrityError``: the object it replaced,
    if any, is gone all the same."""
    if reported == expected:
        return
    url = format_url(bucket, name)
    await delete_object(context, bucket, name, if_generation_match=generation)
    raise IntegrityError(
        f"{url}: the published object's crc32c is {reported}, the bytes written have {expected}; it was deleted",
        url=url,
    )


async def compose_object(
    context: RequestContext,
    bucket: str,
    name: str,
    sources: Sequence[tuple[str, int | None]],
    *,
    if_generation_match: int | None,
    unique_name: bool = False,
    delete_sources: bool = False,
    composite: tuple[int, str] | None = None,
    content_type: str = "application/octet-stream",
    fields: Mapping[str, Any] | None = None,
    kms_key_name: str | None = None,
) -> ObjectInfo:
    """Concatenate ``sources`` (names, each pinned to its generation if given) into ``name`` in one
    compose call, only if ``name`` is at ``if_generation_match`` (0: does not exist); retried only with
    it. A ``unique_name`` is written by this compose alone: a retry answered 412 finds the composite
    of an earlier attempt whose answer was lost, and returns it; so does one that finds at ``name`` the
    ``composite`` (size, crc32c) this compose makes, as a replacement's retry finds its bytes.

    ``delete_sources`` has GCS delete the sources for good as part of the compose (``deleteSourceObjects``:
    no soft-deleted or noncurrent copy, no early-deletion charge, no DELETE of ours); a retry after a lost
    answer then finds them gone (404), which, for a ``unique_name``, is answered by the composite as for 412.
    The composite takes ``content_type`` and the resource ``fields`` given (user metadata, cache control...),
    and is encrypted by the Cloud KMS key ``kms_key_name`` if given (``kmsKeyName``)."""
    url = format_url(bucket, name)
    body: dict[str, Any] = {
        "sourceObjects": [
            {"name": source}
            if generation is None
            else {
                "name": source,
                "generation": str(generation),
                "objectPreconditions": {"ifGenerationMatch": str(generation)},
            }
            for source, generation in sources
        ],
        "destination": {**(fields or {}), "contentType": content_type},
    }
    if delete_sources:
        body["deleteSourceObjects"] = True
    params: dict[str, Any] = {"fields": "size,generation,crc32c"}
    if kms_key_name is not None:
        params["kmsKeyName"] = kms_key_name
    if if_generation_match is not None:
        params["ifGenerationMatch"] = if_generation_match
    path = context.session.object_path(bucket, name) + "/compose"

    async def send_once() -> ObjectInfo:
        async with context.session.send("POST", url, path, params, json=body) as answer:
            return ObjectInfo.from_json(await context.session.json_answer(answer, url, REQUIRED_FIELDS))

    async def earlier_won(error: GCSError) -> ObjectInfo:
        live = await object_resource(context, bucket, name, "size,generation,crc32c", required=REQUIRED_FIELDS)
        sources_taken = delete_sources and isinstance(error, NotFoundError)
        if not (isinstance(error, PreconditionFailedError) or sources_taken) or live is None:
            raise error
        if composite is not None and (int(live["size"]), live.get("crc32c")) != composite:
            raise error
        return ObjectInfo.from_json(live)

    repeatable = if_generation_match is not None
    recognised = unique_name or composite is not None
    return await _write(context, url, send_once, repeatable=repeatable, earlier_won=earlier_won if recognised else None)


async def rewrite_object(
    context: RequestContext,
    source: tuple[str, str],
    destination: tuple[str, str],
    *,
    only_if_new: bool = False,
    source_generation: int | None = None,
    kms_key_name: str | None = None,
) -> ObjectInfo:
    """Copy the object ``source`` (bucket, name; its version ``source_generation`` if given, noncurrent ones
    too, else the live one) to ``destination`` inside GCS, by as many rewrite calls as GCS asks for (large
    objects across locations or storage classes take several; each returns a token to continue with);
    ``only_if_new`` never replaces an existing object. The copy is encrypted by the Cloud KMS key
    ``kms_key_name`` if given (``destinationKmsKeyName``), else as its bucket encrypts.

    Each call is conditional on the destination's generation as found first, so it is retried; a retry
    answered 412 by a destination that holds the source's bytes is the lost answer of an earlier
    attempt; a destination replaced meanwhile by another writer raises ``PreconditionFailedError``.
    """
    url = format_url(*destination)
    target = f"b/{quote(destination[0], safe='')}/o/{quote(destination[1], safe='')}"
    path = f"{context.session.object_path(*source)}/rewriteTo/{target}"
    copied = await object_resource(
        context, *source, "size,crc32c", generation=source_generation, required=("size",), missing_ok=False
    )
    assert copied is not None
    params: dict[str, Any] = {
        "fields": "done,rewriteToken,resource(size,generation,crc32c)",
        "ifGenerationMatch": 0 if only_if_new else await live_generation(context, *destination),
    }
    if source_generation is not None:
        params["sourceGeneration"] = source_generation
    if kms_key_name is not None:
        params["destinationKmsKeyName"] = kms_key_name

    async def send_once() -> dict[str, Any]:
        async with context.session.send("POST", url, path, params, json={}) as answer:
            return await context.session.json_answer(answer, url, ("done",))

    async def earlier_won(error: GCSError) -> dict[str, Any]:
        live = await object_resource(context, *destination, "size,generation,crc32c", required=REQUIRED_FIELDS)
        if (
            not isinstance(error, PreconditionFailedError)
            or live is None
            or (live["size"], live.get("crc32c")) != (copied["size"], copied.get("crc32c"))
        ):
            raise error
        return {"done": True, "resource": live}

    while True:
        answer = await _write(context, url, send_once, repeatable=True, earlier_won=earlier_won)
        if answer["done"]:
            return ObjectInfo.from_json(answer["resource"])
        params["rewriteToken"] = answer["rewriteToken"]


async def delete_request(
    context: RequestContext, url: str, path: str, params: dict[str, Any], *, repeatable: bool, xml_api: bool = False
) -> bool:
    """Send a DELETE to ``path`` (``url`` names it in errors), retried if ``repeatable``; ``False`` if it
    was already gone (``NotFoundError`` if its bucket is). A retry answered 404 or 412 finds the
    target gone or replaced after an earlier attempt whose answer was lost: deleted, as asked."""

    async def send_once() -> bool:
        async with context.session.send("DELETE", url, path, params, xml_api=xml_api) as response:
            content_type, body = response.headers.get("Content-Type"), await response.read()
            if not is_delete_answer(content_type, body):  # never counted as done: sent again, or failed
                raise TransientError(
                    f"{url}: the delete was answered {response.status} with {len(body)} bytes of "
                    f"{content_type or 'no content type'}, not GCS's answer (204, no body): not counted as deleted",
                    url=url,
                    status=response.status,
                )
            return True

    async def earlier_won(_: GCSError) -> bool:
        return True

    try:
        return await _write(context, url, send_once, repeatable=repeatable, earlier_won=earlier_won)
    except NotFoundError as exc:
        if is_missing_bucket(exc):
            raise
        return False


def is_delete_answer(content_type: str | None, body: bytes) -> bool:
    """Whether a 2xx answer to a DELETE is the API's: GCS answers 204 with no body (JSON and XML APIs alike;
    fake-gcs-server, 200 with a JSON ``null``). A body of another kind (a proxy's or a captive portal's HTML
    page) does not say the object is gone."""
    if not body.strip():
        return True
    if "json" not in (content_type or "").lower():
        return False
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


LIVE_TRIES = 3
"""Deletes or patches of the live version, each found anew, before an object changed again and again is given up."""


async def delete_object(
    context: RequestContext,
    bucket: str,
    name: str,
    *,
    if_generation_match: int | None = None,
    generation: int | None = None,
) -> bool:
    """Delete the live object (only if it is ``if_generation_match``), or the version ``generation`` for
    good, live or not; ``False`` if it was already gone.

    Given neither, the live version is found first and deleted by ``ifGenerationMatch``, so that a retry
    never deletes a newer object written meanwhile; one replaced between the two is found again.
    In a bucket with object versioning, deleting the live object keeps it as a noncurrent version,
    billed until a lifecycle rule removes it; deleting by ``generation`` leaves nothing behind.
    """
    if if_generation_match is None and generation is None:
        return await _delete_live(context, bucket, name)
    params: dict[str, Any] = {}
    if if_generation_match is not None:
        params["ifGenerationMatch"] = if_generation_match
    if generation is not None:
        params["generation"] = generation
    path = context.session.object_path(bucket, name)
    return await delete_request(context, format_url(bucket, name), path, params, repeatable=True)


async def _delete_live(context: RequestContext, bucket: str, name: str) -> bool:
    """Delete whatever version is live, by its generation; one replaced meanwhile is found again."""
    tries = 1
    while True:
        live = await live_generation(context, bucket, name)
        if not live:
            return False
        try:
            return await delete_object(context, bucket, name, if_generation_match=live)
        except PreconditionFailedError:
            if tries == LIVE_TRIES:
                raise
            tries += 1


async def delete_folder(context: RequestContext, bucket: str, folder: str) -> bool:
    """Delete an empty folder of a bucket with a hierarchical namespace; ``False`` if there was none."""
    path = f"{context.session.bucket_path(bucket)}/folders/{quote(folder, safe='')}"
    return await delete_request(context, format_url(bucket, folder), path, {}, repeatable=False)


async def patch_object(context: RequestContext, bucket: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
    """Update the live object's metadata by ``patch`` (resource fields; ``None`` clears one, and in
    ``metadata`` removes the key) and return its resource (without ACL).

    The patch is conditional on the generation and metageneration read just before (``ifGenerationMatch``,
    ``ifMetagenerationMatch``), which makes it a request GCS applies at most once, so one that may be retried.
    A retry answered 412 finds the object patched by an earlier attempt whose answer was lost if the same
    generation holds every value patched; any other 412 (changed meanwhile) reads the object again and sends
    the patch anew (up to ``LIVE_TRIES`` times)."""
    url = format_url(bucket, name)
    path = context.session.object_path(bucket, name)
    tries = 1
    while True:
        live = await object_resource(
            context,
            bucket,
            name,
            "generation,metageneration",
            required=("generation", "metageneration"),
            missing_ok=False,
        )
        assert live is not None
        params = {
            "ifGenerationMatch": live["generation"],
            "ifMetagenerationMatch": live["metageneration"],
            "projection": "noAcl",
        }

        async def send_once(params: dict[str, Any] = params) -> dict[str, Any]:
            async with context.session.send("PATCH", url, path, params, json=dict(patch)) as answer:
                return await context.session.json_answer(answer, url, ("generation",))

        async def earlier_won(error: GCSError, generation: str = params["ifGenerationMatch"]) -> dict[str, Any]:
            now = await object_resource(context, bucket, name, None)
            if not isinstance(error, PreconditionFailedError) or now is None or now["generation"] != generation:
                raise error
            if not _holds_patch(now, patch):
                raise error
            return now

        try:
            return await _write(context, url, send_once, repeatable=True, earlier_won=earlier_won)
        except PreconditionFailedError:
            if tries == LIVE_TRIES:
                raise
            tries += 1


def _holds_patch(resource: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether ``resource`` holds every value ``patch`` sets (a time compared as the time it names)."""
    for field, value in patch.items():
        if field == "metadata":
            held = resource.get("metadata") or {}
            if value is None and held:
                return False
            if any(held.get(key) != wanted for key, wanted in (value or {}).items()):
                return False
        elif field == "customTime" and value is not None and field in resource:
            if _instant(resource[field]) != _instant(value):
                return False
        elif resource.get(field) != value and not (value is None and not resource.get(field)):
            return False
    return True


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
