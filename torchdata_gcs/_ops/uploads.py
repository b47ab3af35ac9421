"""Unfinished XML API multipart uploads of a bucket: list them and abort them (what ``torchdata-gcs clean``
does for uploads that killed processes left open; GCS bills their parts until then).

GCS's listing of uploads says nothing of who started them, so ``MultipartWriter`` leaves a marker
object per upload (:func:`upload_marker`) while it runs: ``clean`` aborts only uploads with one,
unless told to abort every upload.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from dataclasses import dataclass
from urllib.parse import quote
from xml.etree import ElementTree

from .._transport.context import RequestContext, with_retry
from ..errors import GCSError, NoMultipartListing
from .client import Client, ReaperTask
from .objects import delete_object, delete_request
from .paging import PageTrail
from .urls import TEMPORARY_PREFIX, format_url, printable

__all__ = ["UPLOAD_MARKERS", "AbortUpload", "Upload", "abort_upload", "unfinished_uploads", "upload_marker"]

UPLOAD_MARKERS = f"{TEMPORARY_PREFIX}uploads/"
"""Where the markers of this library's unfinished multipart uploads live."""


def upload_marker(upload_id: str) -> str:
    """The name of the object that marks the multipart upload ``upload_id`` as this library's.

    >>> upload_marker("ABPnzm5")
    '.torchdata-gcs-tmp/uploads/20f716f8d9a888e3b64128c04448422b66ae3933'
    """
    return UPLOAD_MARKERS + hashlib.sha256(upload_id.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Upload:
    """An unfinished XML API multipart upload, as GCS lists it."""

    name: str
    upload_id: str
    initiated: str  # RFC 3339


async def _uploads_page(context: RequestContext, bucket: str, params: dict[str, str | None], url: str) -> bytes:
    async with context.session.send("GET", url, context.session.xml_path(bucket), params, xml_api=True) as response:
        return await response.read()


def unfinished_uploads(client: Client, bucket: str, *, prefix: str = "") -> Generator[Upload, None, None]:
    """The bucket's unfinished multipart uploads of objects named ``prefix...``, page by page (``GET
    /BUCKET?uploads`` on the XML API)."""
    url = format_url(bucket, prefix)
    first = {"uploads": None, "prefix": prefix} if prefix else {"uploads": None}
    params = first
    trail = PageTrail(url)

    async def page(context: RequestContext) -> bytes:
        return await with_retry(context, url, lambda: _uploads_page(context, bucket, params, url))

    while True:
        try:
            root = ElementTree.fromstring(client.run(page))
        except ElementTree.ParseError as exc:
            raise GCSError(f"the multipart uploads of {url} came back as no XML document ({exc})", url=url) from None
        answer = root.tag.rpartition("}")[2]
        if answer != "ListMultipartUploadsResult":
            where = f"{client.session.endpoint} answered GET /{quote(bucket, safe='')}?uploads"
            raise NoMultipartListing(f"{where} with <{answer}>", url=url)
        uploads = [
            Upload(
                upload.findtext("{*}Key", ""), upload.findtext("{*}UploadId", ""), upload.findtext("{*}Initiated", "")
            )
            for upload in root.iterfind("{*}Upload")
        ]
        yield from uploads
        markers = (root.findtext("{*}NextKeyMarker", ""), root.findtext("{*}NextUploadIdMarker", ""))
        listed = [(upload.name, upload.upload_id) for upload in uploads]
        if trail.follow(listed, markers if root.findtext("{*}IsTruncated") == "true" else None) is None:
            return
        params = {**first, "key-marker": markers[0], "upload-id-marker": markers[1]}


async def abort_upload(context: RequestContext, bucket: str, upload: Upload) -> bool:
    """Abort one multipart upload (its parts are dropped); ``False`` if it was already gone. Retried: the
    upload ID is used once, so a repeated abort finds it gone."""
    path = context.session.xml_path(bucket, upload.name)
    return await delete_request(
        context, format_url(bucket, upload.name), path, {"uploadId": upload.upload_id}, repeatable=True, xml_api=True
    )


class AbortUpload(ReaperTask):
    """A reaper's task: abort the multipart upload ``upload`` of ``bucket`` (GCS bills its parts until then)
    and delete its marker."""

    def __init__(self, bucket: str, upload: Upload, client: Client) -> None:
        super().__init__(client)
        self.bucket = bucket
        self.upload = upload

    def __str__(self) -> str:
        return f"aborting the multipart upload of {printable(format_url(self.bucket, self.upload.name))}"

    def run(self) -> None:
        client = self.client()
        client.run(abort_upload, self.bucket, self.upload)
        client.run(delete_object, self.bucket, upload_marker(self.upload.upload_id))
