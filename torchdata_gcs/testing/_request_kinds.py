"""What a request to the front is: the kind it is counted and faulted as (JSON and XML API paths alike), whether
it changes what a bucket holds, and whether GCS makes it safe to send again."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["BATCH_PATH", "JSON_PREFIXES", "REQUEST_KINDS", "is_write", "repeatable", "request_kind"]

REQUEST_KINDS: tuple[str, ...] = (
    "list",
    "get",
    "range_get",
    "compose",
    "upload",
    "delete",
    "metadata",
    "batch",
    "other",
)

BATCH_PATH = "/batch/storage/v1"
_LIST = re.compile(r"/storage/v1/b/[^/]+/o/?")
_COMPOSE = re.compile(r"/storage/v1/b/[^/]+/o/.+/compose")
_BUCKET = re.compile(r"/storage/v1/b/[^/]+")
_XML_BUCKET = re.compile(r"/[^/]+/?")
_XML_OBJECT = re.compile(r"/[^/]+/.+")
JSON_PREFIXES = ("/storage/", "/download/", "/upload/")
"""Where the JSON API's paths start; any other path is the XML API's (``/bucket/object``)."""


def request_kind(method: str, target: str, has_range: bool = False) -> str:
    """Classify a request (``target`` is ``/path?query``) as one of :data:`REQUEST_KINDS`.

    JSON API paths are recognised, and XML API path-style ones (``/bucket/object``) for downloads,
    uploads and multipart uploads (``uploads``, ``uploadId``, ``partNumber``).

    Examples:
        >>> request_kind("GET", "/download/storage/v1/b/bkt/o/a%2Fb?alt=media", has_range=True)
        'range_get'
        >>> request_kind("POST", "/storage/v1/b/bkt/o/out/compose")
        'compose'
    """
    path, _, query = target.partition("?")
    params = {key: value for key, _, value in (part.partition("=") for part in query.split("&"))}
    xml = not path.startswith(JSON_PREFIXES)
    if method == "DELETE":
        return "delete"
    if method == "POST" and path == BATCH_PATH:  # its calls are counted one by one as they are carried out
        return "batch"
    if method in ("POST", "PUT") and (
        path.startswith("/upload/")
        or params.keys() & {"uploads", "uploadId", "partNumber"}
        or (method == "PUT" and xml and _XML_OBJECT.fullmatch(path))
    ):
        return "upload"
    if method == "POST" and _COMPOSE.fullmatch(path):
        return "compose"
    if method == "GET" and "uploadId" in params:  # listing a multipart upload's parts
        return "other"
    if method == "GET":
        if path.startswith("/download/") or params.get("alt") == "media" or (xml and _XML_OBJECT.fullmatch(path)):
            return "range_get" if has_range else "get"
        if _LIST.fullmatch(path) or (xml and _XML_BUCKET.fullmatch(path)):
            return "list"
    if method in ("GET", "HEAD") and (path.startswith(("/storage/v1/b/", "/download/")) or (xml and path != "/")):
        return "metadata"
    return "other"


def is_write(method: str, target: str) -> bool:
    """Whether a request changes what the bucket holds (an upload, compose, rewrite, delete or patch;
    XML multipart requests included)."""
    return method in ("POST", "PUT", "DELETE", "PATCH") and not target.startswith(("/storage/v1/b?", BATCH_PATH))


def repeatable(method: str, target: str, headers: Any = None) -> bool:
    """Whether GCS makes a write safe to send again (its retry strategy): a precondition on the generation
    (``ifGenerationMatch``, ``x-goog-if-generation-match``), a delete of one ``generation`` or of a bucket, or an XML
    multipart upload's request: a start writes no object (a repeat opens one more empty upload), and the others are
    bound to their upload ID (a part PUT overwrites the same part number, a repeated completion or abort finds the
    upload gone).

    Examples:
        >>> repeatable("POST", "/upload/storage/v1/b/b/o?uploadType=multipart&name=x&ifGenerationMatch=0")
        True
        >>> repeatable("DELETE", "/storage/v1/b/b/o/x"), repeatable("PUT", "/b/x?partNumber=2&uploadId=u")
        (False, True)
    """
    params = dict(parse_qsl(target.partition("?")[2], keep_blank_values=True))
    if "ifGenerationMatch" in params or (method == "DELETE" and "generation" in params):
        return True
    if method == "DELETE" and _BUCKET.fullmatch(target.partition("?")[0]):  # GCS: bucket deletes are idempotent
        return True
    if headers is not None and headers.get("x-goog-if-generation-match") is not None:
        return True
    return not target.startswith(JSON_PREFIXES) and bool(params.keys() & {"uploadId", "uploads"})
