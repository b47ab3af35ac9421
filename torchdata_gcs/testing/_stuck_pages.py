"""List answers of a server that never lets a listing end: each page names its own request's page token (JSON
API) or markers (XML API, multipart uploads) as where the next page starts, so a client that follows it
asks for the same page forever."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

__all__ = ["continues_listing", "stuck_page"]

_NEXT_MARKERS = re.compile(r"<(NextKeyMarker|NextUploadIdMarker)>[^<]*</\1>|<IsTruncated>[^<]*</IsTruncated>")


def _params(target: str) -> dict[str, str]:
    return dict(parse_qsl(target.partition("?")[2], keep_blank_values=True))


def continues_listing(target: str) -> bool:
    """Whether the request ``target`` (``/path?query``) asks for a page after the first of a listing.

    >>> continues_listing("/storage/v1/b/b/o?pageToken=abc"), continues_listing("/b?uploads&key-marker=x")
    (True, True)
    """
    return bool(_params(target).keys() & {"pageToken", "key-marker"})


def stuck_page(target: str, body: bytes) -> bytes:
    """``body``, the answer to the list request ``target``, made to name ``target``'s own page token or
    markers as the next page's (a JSON document, or the XML of a multipart uploads listing)."""
    params = _params(target)
    if "pageToken" in params:
        page = json.loads(body)
        page["nextPageToken"] = params["pageToken"]
        return json.dumps(page).encode()
    markers = (
        f"<NextKeyMarker>{escape(params.get('key-marker', ''))}</NextKeyMarker>"
        f"<NextUploadIdMarker>{escape(params.get('upload-id-marker', ''))}</NextUploadIdMarker>"
        "<IsTruncated>true</IsTruncated>"
    )
    text = _NEXT_MARKERS.sub("", body.decode())
    return text.replace("</ListMultipartUploadsResult>", f"{markers}</ListMultipartUploadsResult>").encode()
