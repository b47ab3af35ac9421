"""GCS's JSON batch endpoint for :class:`GCSFront`: a ``multipart/mixed`` request of at most 100 calls, each
carried out as a request of its own to the front (so its rules, faults and counts apply to inner calls
as to single ones), answered ``multipart/mixed`` as GCS documents: in order, one part per call with the
call's ``Content-ID`` prefixed by ``response-``, a whole HTTP answer inside."""

from __future__ import annotations

import base64
import http.client
import os
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._ops.batch import MAX_BATCH_CALLS, http_message, mixed_parts

__all__ = ["InnerCall", "answer_batch", "batch_calls"]

_DROPPED = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect"})


@dataclass(frozen=True)
class InnerCall:
    """One call of a batch: its part's ``Content-ID`` (or ``None``), request line parts, headers and body."""

    content_id: str | None
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes


def batch_calls(content_type: str, data: bytes) -> list[InnerCall]:
    """The calls of a batch request; ``ValueError`` (GCS answers 400) for a body that is not
    ``multipart/mixed`` with a boundary, a part that is not ``application/http``, or more than 100 calls."""
    try:
        parts = mixed_parts(content_type, data)
    except ValueError as exc:
        raise ValueError(f"Invalid multipart request: {exc}") from None
    if len(parts) > MAX_BATCH_CALLS:
        raise ValueError(f"Too many requests in a batch: {len(parts)} (at most {MAX_BATCH_CALLS} are allowed)")
    calls = []
    for part_headers, request in parts:
        if part_headers.get("content-type", "").split(";")[0].strip().lower() != "application/http":
            raise ValueError("Invalid multipart request: each part must have Content-Type: application/http")
        request_line, headers, body = http_message(request)
        words = request_line.split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            raise ValueError(f"Invalid multipart request: bad request line {request_line[:80]!r}")
        target = urlsplit(words[1])  # GCS asks for the path only; a whole URL is taken for its path
        path = target.path + (f"?{target.query}" if target.query else "")
        calls.append(InnerCall(part_headers.get("content-id"), words[0], path, headers, body))
    if not calls:
        raise ValueError("Invalid multipart request: no calls")
    return calls


def _response_id(content_id: str) -> str:
    """The answer's ``Content-ID``: the call's, with ``response-`` before it (inside its angle brackets, if any)."""
    if content_id.startswith("<") and content_id.endswith(">"):
        return f"<response-{content_id[1:-1]}>"
    return f"response-{content_id}"


def _carry_out(
    connection: http.client.HTTPConnection, call: InnerCall, outer: Iterable[tuple[str, str]]
) -> tuple[int, str, list[tuple[str, str]], bytes]:
    """Send one call to the front; the outer request's headers apply, but its ``Content-`` ones, and the
    call's own headers replace them (as GCS documents)."""
    own = {name.lower() for name, _ in call.headers}
    headers = [
        (name, value)
        for name, value in outer
        if name.lower() not in own and name.lower() not in _DROPPED and not name.lower().startswith("content-")
    ]
    headers += [(name, value) for name, value in call.headers if name.lower() not in _DROPPED]
    if call.body and "content-length" not in own:
        headers.append(("Content-Length", str(len(call.body))))
    connection.putrequest(call.method, call.target, skip_accept_encoding=True)
    for name, value in headers:
        connection.putheader(name, value)
    connection.endheaders(call.body or None)
    response = connection.getresponse()
    body = response.read()
    kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _DROPPED | {"content-length"}]
    return response.status, response.reason, kept, body


def answer_batch(address: tuple[str, int], outer: Iterable[tuple[str, str]], calls: list[InnerCall]) -> bytes:
    """The whole HTTP answer (status line, headers, ``multipart/mixed`` body) to a batch of ``calls``,
    each carried out through the front at ``address`` in order; a call whose connection fails (a
    fault injected into it) is answered 503, as GCS answers a call its backend could not serve."""
    outer = list(outer)
    boundary = "batch_" + base64.urlsafe_b64encode(os.urandom(10)).decode()  # GCS's have "=" and "_" in them
    parts = []
    connection = http.client.HTTPConnection(*address, timeout=300)
    try:
        for call in calls:
            try:
                status, reason, headers, body = _carry_out(connection, call, outer)
            except (OSError, http.client.HTTPException):
                connection.close()
                status, reason, body = (
                    503,
                    "Service Unavailable",
                    b'{"error": {"code": 503, "message": "Backend Error"}}',
                )
                headers = [("Content-Type", "application/json; charset=UTF-8")]
            if body:
                headers.append(("Content-Length", str(len(body))))
            part_id = f"Content-ID: {_response_id(call.content_id)}\r\n" if call.content_id else ""
            lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
            parts.append(
                f"--{boundary}\r\nContent-Type: application/http\r\n{part_id}\r\n"
                f"HTTP/1.1 {status} {reason}\r\n{lines}\r\n".encode()
                + body
                + b"\r\n"
            )
    finally:
        connection.close()
    payload = b"".join(parts) + f"--{boundary}--\r\n".encode()
    head = (
        "HTTP/1.1 200 OK\r\n"
        f"Content-Type: multipart/mixed; boundary={boundary}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload
