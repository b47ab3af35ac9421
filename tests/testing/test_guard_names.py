"""The emulator guard's rule, whatever the encoding: a name is refused exactly when a path would read
it as leaving the folder (a '.' or '..' part, or a leading '/'), wherever the request carries it."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from torchdata_gcs.testing._guard import problem_in_request

PARTS = st.sampled_from(["a", ".", "..", "...", ".a", "a.", "..x", "%", "%2e", " ", "ü", "+", "?#", ""])
NAMES = st.tuples(st.booleans(), st.lists(PARTS, min_size=1, max_size=5)).map(
    lambda drawn: ("/" if drawn[0] else "") + "/".join(drawn[1])
)


def leaves(name: str) -> bool:
    return name.startswith("/") or any(part in (".", "..") for part in name.split("/"))


@st.composite
def encoded(draw: st.DrawFn, name: str) -> str:
    """``name`` percent-encoded as a client may: every character, or only those it must, in either case."""
    out = []
    for char in name:
        if char.isalnum() and char.isascii() and not draw(st.booleans()):
            out.append(char)
            continue
        for byte in char.encode():
            out.append(f"%{byte:02X}" if draw(st.booleans()) else f"%{byte:02x}")
    return "".join(out)


@given(st.data(), NAMES)
def test_a_name_is_refused_exactly_when_it_would_leave_the_folder(data: st.DataObject, name: str) -> None:
    path = data.draw(encoded(name))
    refused = leaves(name)
    metadata = json.dumps({"name": name}).encode()
    multipart = b"--p\r\nContent-Type: application/json\r\n\r\n" + metadata + b"\r\n--p\r\n\r\nbytes\r\n--p--\r\n"
    compose = json.dumps({"sourceObjects": [{"name": "a"}, {"NAME": name}]}).encode()  # Go matches any case
    decoy = json.dumps({"name": "a"}).encode()
    false_delimiter = b"--pX\r\n\r\n" + decoy + b"\r\n" + multipart  # Go skips it as preamble
    no_headers = b"--p\r\n\r\n" + metadata + b"\r\n\r\n" + decoy + b"\r\n--p\r\n\r\nx\r\n--p--\r\n"
    batch = f"--b\r\nContent-Type: application/http\r\n\r\nDELETE /storage/v1/b/bkt/o/{path} HTTP/1.1\r\n\r\n--b--"
    requests = [
        (f"/storage/v1/b/bkt/o/{path}", {}, None),
        (f"/download/storage/v1/b/bkt/o/{path}?alt=media", {}, None),
        (f"/upload/storage/v1/b/bkt/o?uploadType=media&name={path}", {}, None),
        (
            "/upload/storage/v1/b/bkt/o?uploadType=multipart",
            {"content-type": "multipart/related; boundary=p"},
            multipart,
        ),
        (
            "/upload/storage/v1/b/bkt/o?uploadType=multipart",
            {"content-type": "multipart/related; boundary=p"},
            false_delimiter,
        ),
        (
            "/upload/storage/v1/b/bkt/o?uploadType=multipart",
            {"content-type": "multipart/related; boundary=p"},
            no_headers,
        ),
        ("/upload/storage/v1/b/bkt/o?uploadType=resumable", {"content-type": "application/json"}, metadata),
        ("/storage/v1/b/bkt/o/c/compose", {"content-type": "text/plain"}, compose),
        (f"/storage/v1/b/bkt/o/a/rewriteTo/b/bkt/o/{path}", {}, None),
        ("/batch/storage/v1", {"content-type": "multipart/mixed; boundary=b"}, batch.encode()),
    ]
    for target, headers, body in requests:
        assert (problem_in_request(target, headers, body) is not None) == refused, (target, body)


def test_a_listing_by_folders_is_not_refused() -> None:
    """The ``delimiter`` of a listing (``/``, as fsspec's ``ls`` sends it) is a separator, not a name."""
    assert problem_in_request("/storage/v1/b/bkt/o?delimiter=%2F&prefix=big%2F", {}, b"") is None
    assert problem_in_request("/storage/v1/b/bkt/o?delimiter=%2F&prefix=%2Fbig%2F", {}, b"") is not None
