"""Single-object operations of the control plane: read metadata, read small objects, create, delete."""

from __future__ import annotations

import json
import uuid
from typing import Any

from .._transport.http import Transport, json_answer
from .._transport.retry import call_with_retry
from ..config import RetryConfig
from ..errors import NotFoundError, PreconditionFailedError
from .checksums import crc32c_base64, reported_crc32c, verify_bytes
from .urls import format_url

__all__ = ["create_object", "delete_object", "multipart_body", "object_resource", "read_object"]


def object_resource(
    transport: Transport, bucket: str, name: str, retry: RetryConfig, fields: str, *, generation: int | None = None
) -> dict[str, Any] | None:
    """The object's JSON resource (of ``generation``, else the live one) trimmed to ``fields``, or
    ``None`` if it does not exist."""
    url = format_url(bucket, name)
    path = transport.object_path(bucket, name)
    params: dict[str, Any] = {"fields": fields}
    if generation is not None:
        params["generation"] = generation
    try:
        return call_with_retry(lambda: transport.get_json(path, url=url, params=params), retry, url=url)
    except NotFoundError:
        return None


def read_object(transport: Transport, bucket: str, name: str, retry: RetryConfig) -> bytes | None:
    """A small object's stored bytes, checked against GCS's crc32c, or ``None`` if it does not exist."""
    url = format_url(bucket, name)
    path = transport.object_path(bucket, name, media=True)

    def attempt() -> bytes:
        with transport.request("GET", path, url=url, params={"alt": "media"}, stream=True) as response:
            data = response.raw.read(decode_content=False)  # stored bytes, as the checksum covers
            verify_bytes(url, [data], None, {"GCS": reported_crc32c(response.headers)})
            return data

    try:
        return call_with_retry(attempt, retry, url=url)
    except NotFoundError:
        return None


def multipart_body(
    name: str, data: bytes, content_type: str = "application/octet-stream", crc32c: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a JSON API multipart upload of ``data`` as ``name``, its crc32c (computed
    unless given) in the metadata so that GCS refuses bytes damaged on the way."""
    boundary = uuid.uuid4().hex
    checksum = crc32c_base64(data if crc32c is None else crc32c)
    metadata = json.dumps({"name": name, "crc32c": checksum, "contentType": content_type})
    body = b"".join(
        (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n".encode(),
            f"--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        )
    )
    return body, {"Content-Type": f"multipart/related; boundary={boundary}"}


def create_object(
    transport: Transport,
    bucket: str,
    name: str,
    data: bytes,
    retry: RetryConfig,
    *,
    if_generation_match: int | None = None,
    content_type: str = "application/octet-stream",
) -> int:
    """Write ``data`` in one multipart upload and return the new generation.

    The crc32c travels in the metadata, so GCS refuses bytes damaged on the way. With
    ``if_generation_match`` (0: only if the object does not exist) a mismatch raises
    ``PreconditionFailedError``, except when a retry meets the write of its own earlier attempt
    whose answer was lost: an object of exactly these bytes is then taken as ours.
    """
    url = format_url(bucket, name)
    body, headers = multipart_body(name, data, content_type)
    params: dict[str, Any] = {"uploadType": "multipart", "fields": "generation"}
    if if_generation_match is not None:
        params["ifGenerationMatch"] = if_generation_match
    path = f"/upload{transport.bucket_objects_path(bucket)}"
    attempts = 0

    def attempt() -> int:
        nonlocal attempts
        attempts += 1
        try:
            with transport.request("POST", path, url=url, params=params, data=body, headers=headers) as response:
                answer = json_answer(response.content, url, response.status_code, response.headers.get("Content-Type"), ("generation",))
                return int(answer["generation"])
        except PreconditionFailedError:
            if attempts == 1:
                raise
            live = object_resource(transport, bucket, name, retry, "generation,size,crc32c")
            if live is None or int(live["size"]) != len(data) or live.get("crc32c") != crc32c_base64(data):
                raise
            return int(live["generation"])

    return call_with_retry(attempt, retry, url=url)


def delete_object(
    transport: Transport,
    bucket: str,
    name: str,
    retry: RetryConfig,
    *,
    if_generation_match: int | None = None,
    generation: int | None = None,
) -> bool:
    """Delete the live object (only if it is ``if_generation_match``), or the version ``generation`` for
    good, live or not; ``False`` if it was already gone.

    In a bucket with object versioning, deleting the live object keeps it as a noncurrent version,
    billed until a lifecycle rule removes it; deleting by ``generation`` leaves nothing behind.
    """
    url = format_url(bucket, name)
    params: dict[str, Any] = {}
    if if_generation_match is not None:
        params["ifGenerationMatch"] = if_generation_match
    if generation is not None:
        params["generation"] = generation
    try:
        call_with_retry(
            lambda: transport.request("DELETE", transport.object_path(bucket, name), url=url, params=params).close(),
            retry,
            url=url,
        )
    except NotFoundError:
        return False
    return True
