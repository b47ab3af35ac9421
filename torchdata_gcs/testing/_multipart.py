"""GCS's XML API multipart upload, served by the test front on top of an emulator that lacks it.

Initiate, upload part, list parts, complete and abort, with GCS's XML error answers; a bucket's
unfinished uploads listed as GCS lists them. A completed upload is written to the emulator in one
streamed upload, so the object appears whole or not at all, and is then described as GCS describes
it. :class:`MultipartUploads` says what each request gets, and records how long each completion took
(GCS completes in about constant time; the emulator's copy is the rig's cost, reported apart).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit
from xml.etree import ElementTree
from xml.sax.saxutils import escape

import google_crc32c

from .._ops.checksums import crc32c_base64
from ._gcs_rules import PROMISED_ON_PARTS, GCSRules

__all__ = ["MultipartUploads", "is_multipart_request"]

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_NUMBER = 10_000
MAX_UPLOADS_PAGE = 1000
_JSON_PREFIXES = ("/storage/", "/upload/", "/download/", "/batch/")
_NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"

Answer = tuple[int, str, list[tuple[str, str]], bytes]
"""Status, reason, headers and body of an answer to the client."""
Connect = Callable[[], http.client.HTTPConnection]


def is_multipart_request(method: str, target: str) -> bool:
    """Whether ``target`` (``/path?query``) is an XML API multipart upload request.

    Examples:
        >>> is_multipart_request("GET", "/bkt?uploads"), is_multipart_request("GET", "/bkt/obj?uploads")
        (True, False)
    """
    path, _, query = target.partition("?")
    if path.startswith(_JSON_PREFIXES):
        return False
    params = dict(parse_qsl(query, keep_blank_values=True))
    bucket, _, name = path[1:].partition("/")
    if not name:  # ``/bucket`` or ``/bucket/``: only the listing of its uploads
        return bool(bucket) and method == "GET" and "uploads" in params
    return (method == "POST" and "uploads" in params) or "uploadId" in params


@dataclass
class _Upload:
    bucket: str
    name: str
    folder: str
    content_type: str = "application/octet-stream"
    metadata: dict[str, str] = field(default_factory=dict)  # x-goog-meta-* given at initiation
    fixed: dict[str, str] = field(default_factory=dict)  # resource field -> value, from the fixed-key headers
    kms_key_name: str | None = None  # x-goog-encryption-kms-key-name given at initiation
    parts: dict[int, tuple[str, int]] = field(default_factory=dict)  # number -> (etag, size)
    initiated: float = field(default_factory=time.time)


_FIXED_HEADERS = {
    "Cache-Control": "cacheControl",
    "Content-Disposition": "contentDisposition",
    "Content-Encoding": "contentEncoding",
    "Content-Language": "contentLanguage",
    "x-goog-custom-time": "customTime",
}
"""The XML API request headers that set an object's fixed-key metadata, and the resource fields they set."""


def _xml(root: str, fields: list[tuple[str, str]], inner: str = "") -> bytes:
    body = "".join(f"<{key}>{escape(value)}</{key}>" for key, value in fields)
    return f"<?xml version='1.0' encoding='UTF-8'?><{root} xmlns='{_NAMESPACE}'>{body}{inner}</{root}>".encode()


def _error(status: int, reason: str, code: str, message: str, details: str = "") -> Answer:
    body = (
        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"<Details>{escape(details)}</Details></Error>"
    )
    return status, reason, [("Content-Type", "application/xml; charset=UTF-8")], body.encode()


def _ok(body: bytes, headers: list[tuple[str, str]] | None = None) -> Answer:
    return 200, "OK", [("Content-Type", "application/xml; charset=UTF-8"), *(headers or [])], body


def _digest_mismatch(headers: Message, received: dict[str, str]) -> str | None:
    """What does not match when a part's ``x-goog-hash`` (any line, crc32c or md5) or ``Content-MD5``
    differs from the digests of the bytes ``received``; ``None`` when all given ones match."""
    claimed = [
        tuple(item.strip().split("=", 1))
        for line in headers.get_all("x-goog-hash") or []
        for item in line.split(",")
        if "=" in item
    ]
    if headers.get("Content-MD5"):
        claimed.append(("md5", headers["Content-MD5"].strip()))
    for kind, value in claimed:
        if kind.lower() in received and value != received[kind.lower()]:
            return f"{kind} {value} was sent; the bytes received have {received[kind.lower()]}"
    return None


def _timestamp(seconds: float) -> str:
    """GCS's XML API time format.

    >>> _timestamp(1700000000.25)
    '2023-11-14T22:13:20.250Z'
    """
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


# The requests and GCS's answers to them:
# - initiate (``POST /bucket/object?uploads``), upload part (``PUT ?partNumber=N&uploadId=ID``, answered
#   with its ``ETag``), list parts (``GET ?uploadId=ID``), complete (``POST ?uploadId=ID`` with the part
#   list) and abort (``DELETE ?uploadId=ID``);
# - errors: ``NoSuchUpload`` (404), and all 400: ``InvalidArgument`` for a part number outside 1-10,000,
#   ``MalformedXML``, ``InvalidPartOrder``, ``InvalidPart`` (unknown part or ETag), ``EntityTooSmall`` (a
#   part other than the last under the minimum) and ``BadDigest`` (a part whose ``x-goog-hash`` or
#   ``Content-MD5`` does not match its body);
# - parts are kept in files; a completed upload is written to the emulator in one resumable upload with
#   the ``Content-Type``, ``x-goog-meta-*`` and fixed-key metadata headers (``Cache-Control``,
#   ``Content-Disposition``, ``Content-Encoding``, ``Content-Language``, ``x-goog-custom-time``) given at
#   initiation, with the Cloud KMS key of ``x-goog-encryption-kms-key-name`` if given (its resources then
#   name it), and is then described as GCS describes it: no MD5, a component count;
# - ``GET /bucket?uploads`` lists a bucket's unfinished uploads by object name, then upload ID, at most
#   ``max-uploads`` (1,000) a page, each with its ``Initiated`` time, continued with ``key-marker`` and
#   ``upload-id-marker``; ``prefix`` is honoured, ``delimiter`` and ``encoding-type`` are refused (501),
#   and a bucket missing upstream is ``NoSuchBucket`` (404), to a listing as to an initiation.
class MultipartUploads:
    """The unfinished uploads of one front, and the protocol that drives them."""

    def __init__(
        self, connect: Connect, rules: GCSRules, min_part_size: int = MIN_PART_SIZE, page_size: int = MAX_UPLOADS_PAGE
    ) -> None:
        self._connect = connect
        self._rules = rules
        self.min_part_size = min_part_size
        self.page_size = page_size  # uploads listed a page at most
        self._folder: str | None = None  # made by the first upload: a front that never sees one leaves nothing
        self._uploads: dict[str, _Upload] = {}
        self._completions: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()

    @property
    def open_uploads(self) -> list[tuple[str, str]]:
        """``(bucket, object name)`` of every upload initiated and neither completed nor aborted."""
        with self._lock:
            return sorted((upload.bucket, upload.name) for upload in self._uploads.values())

    @property
    def completions(self) -> list[tuple[str, str, float]]:
        """``(bucket, object name, seconds)`` of every completion that made its object, in the order done:
        the seconds from the completion request's part list read to its answer ready."""
        with self._lock:
            return list(self._completions)

    def forget_completions(self) -> None:
        with self._lock:
            self._completions.clear()

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def answer(self, method: str, target: str, headers: Message, body: Iterator[bytes] | None) -> Answer:
        """Serve one multipart request (``is_multipart_request`` was true for it) with its ``headers``."""
        path, _, query = target.partition("?")
        bucket, _, name = path[1:].partition("/")
        bucket, name = unquote(bucket), unquote(name)
        params = dict(parse_qsl(query, keep_blank_values=True))
        chunks = body if body is not None else iter(())
        if not name:
            return self._list_uploads(bucket, params)
        if "uploadId" not in params:
            return self._initiate(bucket, name, headers)
        upload = self.unfinished(target)
        if upload is None:
            for _ in chunks:  # take the whole request before answering
                pass
            return _error(404, "Not Found", "NoSuchUpload", "The requested upload was not found.")
        if method == "PUT":
            return self._put_part(upload, params.get("partNumber", ""), headers, chunks)
        if method == "GET":
            return self._list_parts(params["uploadId"], upload)
        if method == "DELETE":
            self._forget(params["uploadId"])
            return 204, "No Content", [], b""
        return self._complete(params["uploadId"], upload, b"".join(chunks))

    def unfinished(self, target: str) -> _Upload | None:
        """The unfinished upload that ``target`` (``/bucket/object?uploadId=ID...``) names, if any."""
        path, _, query = target.partition("?")
        bucket, _, name = path[1:].partition("/")
        with self._lock:
            upload = self._uploads.get(dict(parse_qsl(query, keep_blank_values=True)).get("uploadId", ""))
        return (
            upload if upload is not None and (upload.bucket, upload.name) == (unquote(bucket), unquote(name)) else None
        )

    def _initiate(self, bucket: str, name: str, headers: Message) -> Answer:
        missing = self._missing_bucket(bucket)
        if missing is not None:
            return missing
        upload_id = secrets.token_urlsafe(24)
        content_type = headers.get("Content-Type") or "application/octet-stream"
        metadata = {
            key.lower().removeprefix("x-goog-meta-"): value
            for key, value in headers.items()
            if key.lower().startswith("x-goog-meta-")
        }
        fixed = {field: headers[header] for header, field in _FIXED_HEADERS.items() if header in headers}
        with self._lock:
            self._folder = self._folder or tempfile.mkdtemp(prefix="torchdata-gcs-multipart-")
            folder = os.path.join(self._folder, upload_id)
            os.mkdir(folder)
            self._uploads[upload_id] = _Upload(
                bucket, name, folder, content_type, metadata, fixed, headers.get("x-goog-encryption-kms-key-name")
            )
        return _ok(_xml("InitiateMultipartUploadResult", [("Bucket", bucket), ("Key", name), ("UploadId", upload_id)]))

    def _list_uploads(self, bucket: str, params: dict[str, str]) -> Answer:
        """One page of ``bucket``'s unfinished uploads, after the markers, in (name, upload ID) order."""
        for unsupported in ("delimiter", "encoding-type"):
            if unsupported in params:
                return _error(
                    501, "Not Implemented", "NotImplemented", f"{unsupported} is not served by the test front."
                )
        limit_text = params.get("max-uploads", str(MAX_UPLOADS_PAGE))
        if not limit_text.isdigit():
            return _error(400, "Bad Request", "InvalidArgument", "max-uploads must be a non-negative integer.")
        limit = min(int(limit_text), self.page_size)
        missing = self._missing_bucket(bucket)
        if missing is not None:
            return missing
        prefix, key_marker = params.get("prefix", ""), params.get("key-marker", "")
        id_marker = params.get("upload-id-marker", "") if key_marker else ""  # GCS ignores it alone
        with self._lock:
            uploads = sorted(
                (upload.name, upload_id, upload.initiated)
                for upload_id, upload in self._uploads.items()
                if upload.bucket == bucket
                and upload.name.startswith(prefix)
                and (upload.name > key_marker or (upload.name == key_marker and id_marker and upload_id > id_marker))
            )
        page, truncated = uploads[:limit], len(uploads) > limit
        fields = [("Bucket", bucket), ("KeyMarker", key_marker), ("UploadIdMarker", id_marker)]
        if truncated and page:
            fields += [("NextKeyMarker", page[-1][0]), ("NextUploadIdMarker", page[-1][1])]
        fields += [("Prefix", prefix), ("MaxUploads", str(limit)), ("IsTruncated", "true" if truncated else "false")]
        inner = "".join(
            f"<Upload><Key>{escape(name)}</Key><UploadId>{upload_id}</UploadId><StorageClass>STANDARD</StorageClass>"
            f"<Initiated>{_timestamp(initiated)}</Initiated></Upload>"
            for name, upload_id, initiated in page
        )
        return _ok(_xml("ListMultipartUploadsResult", fields, inner))

    def _missing_bucket(self, bucket: str) -> Answer | None:
        """GCS's ``NoSuchBucket`` answer if ``bucket`` does not exist upstream."""
        answer = self._rules.not_found(bucket, None, "xml")
        return None if answer is None else (404, "Not Found", [("Content-Type", answer[0])], answer[1])

    def _put_part(self, upload: _Upload, number_text: str, headers: Message, chunks: Iterator[bytes]) -> Answer:
        number = int(number_text) if number_text.isdigit() else 0
        if not 1 <= number <= MAX_PART_NUMBER:
            for _ in chunks:
                pass
            return _error(400, "Bad Request", "InvalidArgument", f"Part number must be 1 to {MAX_PART_NUMBER}.")
        md5, crc, size = hashlib.md5(usedforsecurity=False), 0, 0
        path = os.path.join(upload.folder, f"{number}.new")
        with open(path, "wb") as part:
            for chunk in chunks:
                part.write(chunk)
                md5.update(chunk)
                crc = google_crc32c.extend(crc, chunk)
                size += len(chunk)
        received = {"crc32c": crc32c_base64(crc), "md5": base64.b64encode(md5.digest()).decode()}
        mismatch = _digest_mismatch(headers, received)
        if mismatch is not None:  # GCS refuses a damaged part and keeps any earlier one of that number
            os.remove(path)
            return _error(
                400, "Bad Request", "BadDigest", "The digest you specified did not match what we received.", mismatch
            )
        os.replace(path, os.path.join(upload.folder, str(number)))
        etag = f'"{md5.hexdigest()}"'
        with self._lock:
            upload.parts[number] = (etag, size)
        hashes = [("x-goog-hash", f"crc32c={received['crc32c']}"), ("x-goog-hash", f"md5={received['md5']}")]
        return 200, "OK", self._rules.answer_headers([("ETag", etag), *hashes], keep=PROMISED_ON_PARTS), b""

    def _list_parts(self, upload_id: str, upload: _Upload) -> Answer:
        with self._lock:
            parts = sorted(upload.parts.items())
        inner = "".join(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{escape(etag)}</ETag><Size>{size}</Size></Part>"
            for number, (etag, size) in parts
        )
        fields = [("Bucket", upload.bucket), ("Key", upload.name), ("UploadId", upload_id)]
        return _ok(_xml("ListPartsResult", fields, inner))

    def _complete(self, upload_id: str, upload: _Upload, document: bytes) -> Answer:
        started = time.perf_counter()
        try:
            listed = [
                (int(part.findtext("{*}PartNumber") or ""), (part.findtext("{*}ETag") or "").strip())
                for part in ElementTree.fromstring(document).findall("{*}Part")
            ]
        except (ElementTree.ParseError, ValueError):
            return _error(400, "Bad Request", "MalformedXML", "The XML you provided was not well-formed.")
        if not listed:
            return _error(400, "Bad Request", "MalformedXML", "The part list is empty.")
        numbers = [number for number, _ in listed]
        if numbers != sorted(set(numbers)):
            return _error(400, "Bad Request", "InvalidPartOrder", "The parts must be listed in ascending order.")
        with self._lock:
            known = dict(upload.parts)
        for number, etag in listed:
            if number not in known or known[number][0].strip('"') != etag.strip('"'):
                return _error(400, "Bad Request", "InvalidPart", f"Part {number} was not uploaded with that ETag.")
        for number, _ in listed[:-1]:
            if known[number][1] < self.min_part_size:
                return _error(
                    400, "Bad Request", "EntityTooSmall", f"Part {number} is smaller than {self.min_part_size} bytes."
                )
        try:
            resource = self._publish(upload, numbers)
        except (OSError, http.client.HTTPException, ValueError) as exc:  # the upload stays, to be retried
            return _error(503, "Service Unavailable", "ServiceUnavailable", str(exc))
        self._forget(upload_id)
        self._rules.add_composite(upload.bucket, upload.name, int(resource["generation"]), len(numbers))
        if upload.kms_key_name is not None:
            self._rules.add_kms_key(upload.bucket, upload.name, int(resource["generation"]), upload.kms_key_name)
        headers = self._rules.answer_headers(
            [
                ("x-goog-generation", resource["generation"]),
                ("x-goog-hash", f"crc32c={resource['crc32c']}"),  # GCS keeps no MD5 of a multipart object
                ("x-goog-stored-content-length", resource["size"]),
            ]
        )
        fields = [
            ("Location", f"/{upload.bucket}/{upload.name}"),
            ("Bucket", upload.bucket),
            ("Key", upload.name),
            ("ETag", f'"{resource.get("etag", "")}"'),
        ]
        with self._lock:
            self._completions.append((upload.bucket, upload.name, time.perf_counter() - started))
        return _ok(_xml("CompleteMultipartUploadResult", fields), headers)

    def _publish(self, upload: _Upload, numbers: list[int]) -> dict[str, str]:
        """Write the listed parts, in order, to the emulator as one object with the metadata given at
        initiation; returns its resource. A resumable upload: its metadata goes first, in a small
        request, and the bytes follow in one streamed request, which the emulator's name guard passes
        through unread (a multipart body it must read whole and search for its parts)."""
        bucket = quote(upload.bucket, safe="")
        resource: dict[str, Any] = {**upload.fixed, "name": upload.name, "contentType": upload.content_type}
        resource["metadata"] = upload.metadata
        size = sum(os.path.getsize(os.path.join(upload.folder, str(number))) for number in numbers)
        document = json.dumps(resource).encode()
        session = self._ask(
            "POST",
            f"/upload/storage/v1/b/{bucket}/o?uploadType=resumable&name={quote(upload.name, safe='')}",
            [("Content-Type", "application/json; charset=UTF-8"), ("Content-Length", str(len(document)))],
            [document],
        )
        location = urlsplit(session[1].get("Location", ""))
        if session[0] != 200 or not location.query:
            raise ConnectionError(f"the emulator refused to start the completed upload: {session[0]} {session[2]!r}")

        def parts() -> Iterator[bytes]:
            for number in numbers:
                with open(os.path.join(upload.folder, str(number)), "rb") as part:
                    while piece := part.read(1024 * 1024):
                        yield piece

        status, _, answer = self._ask(
            "PUT",
            f"{location.path}?{location.query}",
            [("Content-Length", str(size)), ("Content-Type", upload.content_type)],
            parts(),
        )
        if status not in (200, 201):
            raise ConnectionError(f"the emulator refused the completed upload: {status} {answer[:200]!r}")
        resource_answer: dict[str, str] = json.loads(answer)
        return resource_answer

    def _ask(
        self, method: str, target: str, headers: list[tuple[str, str]], body: Iterable[bytes]
    ) -> tuple[int, Message, bytes]:
        """One request to the emulator, ``body`` streamed as given: the status, headers and body of its answer."""
        connection = self._connect()
        try:
            connection.putrequest(method, target)
            for key, value in headers:
                connection.putheader(key, value)
            connection.endheaders()
            for piece in body:
                connection.send(piece)
            response = connection.getresponse()
            return response.status, response.msg, response.read()
        finally:
            connection.close()

    def _forget(self, upload_id: str) -> None:
        with self._lock:
            upload = self._uploads.pop(upload_id, None)
        if upload is not None:
            shutil.rmtree(upload.folder, ignore_errors=True)
