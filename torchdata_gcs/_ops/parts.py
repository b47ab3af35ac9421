"""Single requests that upload one part of a streamed object: a part of an XML API multipart upload (sent
with its crc32c), a part written as a temporary object for a composite, and the XML API request that
starts or completes an upload. Plain coroutines, not a writer's methods: a part in flight must not keep
a dropped writer (which aborts when collected) alive until it finishes."""

from __future__ import annotations

from typing import Any

from .._transport.context import RequestContext, with_retry
from .._transport.transport import Headers
from ..errors import IntegrityError, UploadError
from .checksums import crc32c_base64, hash_header, reported_crc32c
from .objects import TEMPORARY_CLASS, create_object

__all__ = ["create_part", "put_part", "send_xml"]


async def send_xml(
    context: RequestContext,
    url: str,
    path: str,
    method: str,
    params: dict[str, Any],
    data: bytes | None = None,
    *,
    headers: dict[str, str] | None = None,
    answer_timeout: float | None = None,
    repeatable: bool = True,
) -> tuple[Headers, bytes]:
    """One XML API request, retried if ``repeatable``; its headers (case-insensitive, repeated lines kept)
    and body. ``answer_timeout``: see ``Session.send``."""

    async def attempt() -> tuple[Headers, bytes]:
        async with context.session.send(
            method, url, path, params, headers, data=data, xml_api=True, answer_timeout=answer_timeout
        ) as response:
            return response.headers, await response.read()

    return await with_retry(context, url, attempt, repeatable=repeatable)


async def put_part(
    context: RequestContext, url: str, path: str, number: int, upload_id: str | None, data: memoryview, crc32c: int
) -> tuple[int, str]:
    """Upload part ``number`` with its crc32c, so GCS refuses it if damaged on the way (a refusal, or an
    answer reporting another crc32c, is retried); ``(number, ETag)``."""
    params = {"partNumber": number, "uploadId": upload_id}
    expected = crc32c_base64(crc32c)

    async def attempt() -> tuple[int, str]:
        async with context.session.send(
            "PUT", url, path, params, hash_header(crc32c), data=data, xml_api=True
        ) as response:
            await response.read()
            reported, etag = reported_crc32c(response.headers), response.headers.get("ETag")
        if reported is not None and reported != expected:
            raise IntegrityError(f"{url}: GCS stored part {number} with crc32c {reported}, sent {expected}", url=url)
        if not etag:
            raise UploadError(f"{url}: GCS answered part {number} without an ETag", url=url)
        return number, etag

    return await with_retry(context, url, attempt)


async def create_part(
    context: RequestContext,
    bucket: str,
    name: str,
    number: int,
    data: memoryview,
    crc32c: int,
    kms_key_name: str | None = None,
) -> tuple[int, tuple[str, int]]:
    """Upload one part as the object ``name``, a name of its own, so only if it does not exist (GCS checks its
    crc32c; a retry finds the part of an earlier attempt whose answer was lost), encrypted by ``kms_key_name``
    if given; ``(number, (name, generation))``."""
    generation = await create_object(
        context,
        bucket,
        name,
        data,
        if_generation_match=0,
        crc32c=crc32c,
        storage_class=TEMPORARY_CLASS,
        kms_key_name=kms_key_name,
    )
    return number, (name, generation)
