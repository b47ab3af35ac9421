"""The front's request handler: it counts each request, picks its fault, and either answers it itself or
forwards it and relays upstream's answer as GCS would send it."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import io
import json
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote

from ._batch import answer_batch, batch_calls
from ._faults import HTML_PAGE, HTTP_FAULTS, Fault
from ._gcs_rules import bucket_call_refusal, bucket_permission, denied
from ._json_api import (
    DESCRIBED,
    STORAGE_LAYOUT,
    JsonApiHandler,
    cap_list_page,
    compose_request,
    destination_custom_time,
    object_of,
)
from ._multipart import is_multipart_request
from ._rate_ramp import READS, WRITES, RateRamp, bucket_of, rate_limited
from ._request_kinds import JSON_PREFIXES, is_write, request_kind
from ._request_log import RecordedRequest
from ._server import CHUNK, HOP_BY_HOP, answer_head, encode_chunk, flip_one_byte
from ._stuck_pages import stuck_page

__all__ = ["FrontHandler"]


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header allows gzip (``gzip``, with a non-zero ``q`` if one is given)."""
    for coding in accept_encoding.split(","):
        name, _, weight = coding.strip().partition(";")
        if name.strip().lower() == "gzip":
            return weight.strip().replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


class FrontHandler(JsonApiHandler):
    """What each request gets: counted, then a fault, an answer of the front's own (the JSON API's where the
    emulator falls short, the XML API's multipart upload, a batch, a refusal GCS would give), or upstream's
    answer as GCS would send it."""

    def _handle(self) -> None:
        front = self.server.front
        kind = request_kind(self.command, self.path, "Range" in self.headers)
        fault = self.server.log.record(kind, f"{self.command} {self.path}")
        self.stuck = fault is not None and fault.kind == "repeat_token"  # the answer is rewritten, not replaced
        fault = None if self.stuck else fault
        if fault is None and front.rate_ramp is not None and self._over_rate(front.rate_ramp, kind):
            return
        if kind in ("upload", "delete", "compose"):
            self.server.listings.forget()  # the bucket changes: its snapshot would go stale
        if kind == "list" and self.path.startswith("/storage/"):
            self.path = cap_list_page(self.path, front.page_size)
            if fault is None and self.answer_from_index():
                return
        try:
            body, chunked = self.request_body()
        except ValueError:
            self.close_connection = True  # the body's end is unknown
            self.answer_error(400, "Bad Request", "malformed Content-Length")
            return
        if self.server.log.keeps_requests:
            data = b"".join(body or ())
            body = iter([data]) if body is not None else None
            self.server.log.keep(RecordedRequest(self.command, self.path, list(self.headers.items()), data))
        if fault is None and kind == "list" and (listing := front.bucket_overlay.listing(self.path)) is not None:
            if self.server.pause(front.latency):
                self.answer_error(*listing) if isinstance(listing, tuple) else self.answer_json(listing)
            return
        if fault is None and self.server.log.loses_answer(self.command, self.path, self.headers):
            self._carry_out_unanswered(body, chunked, kind)
            return
        self._carry_out(body, chunked, kind, fault)

    def _over_rate(self, ramp: RateRamp, kind: str) -> bool:
        """Answer 429 as GCS does if this object request is over its bucket's rate (see ``_rate_ramp``)."""
        write = is_write(self.command, self.path)
        bucket = bucket_of(self.path)
        if bucket is None or kind not in (WRITES if write else READS) or ramp.admit(bucket, write):
            return False
        try:
            for _ in self.request_body()[0] or ():  # take the whole request, so the connection stays usable
                pass
        except ValueError:
            self.close_connection = True
        if not self.server.pause(self.server.front.latency):
            self.close_now()
            return True
        content_type, body = rate_limited(bucket, xml=not self.path.startswith(JSON_PREFIXES))
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if self.close_connection:
            headers.append(("Connection", "close"))
        self.wfile.write(answer_head(429, "Too Many Requests", headers) + (b"" if self.command == "HEAD" else body))
        return True

    def _carry_out_unanswered(self, body: Iterator[bytes] | None, chunked: bool, kind: str) -> None:
        """Carry the request out, drop upstream's answer and answer 503 instead: a lost answer."""
        answer, self.wfile = self.wfile, io.BytesIO()
        try:
            self._carry_out(body, chunked, kind, None)
        finally:
            self.wfile = answer
        if self.connection.fileno() != -1:  # not closed while carrying out
            self.answer_error(503, "Service Unavailable", "injected by the test front: the answer was lost")

    def _carry_out(self, body: Iterator[bytes] | None, chunked: bool, kind: str, fault: Fault | None) -> None:
        front = self.server.front
        if fault is not None and fault.kind not in ("truncate", "corrupt"):
            for _ in body or ():  # take the whole request, so the client waits for an answer
                pass
            if self.server.pause(front.latency):
                self._inject(fault)
            else:
                self.close_now()
            return
        needed = bucket_permission(self.command, self.path.partition("?")[0]) if front.object_only else None
        if needed is not None:
            for _ in body or ():
                pass
            if self.server.pause(front.latency):
                self.answer_error(*denied(*needed), error_reason="forbidden")
            else:
                self.close_now()
            return
        if kind == "batch":
            try:
                calls = batch_calls(self.headers.get("Content-Type", ""), b"".join(body or ()))
            except ValueError as exc:
                self.answer_error(400, "Bad Request", str(exc))
                return
            answer = answer_batch((self.server.server_name, self.server.server_port), self.headers.items(), calls)
            if fault is not None and fault.kind == "truncate":  # carried out, its answer cut on the way
                self.wfile.write(answer[: len(answer) // 2])
                self.close_now()
                return
            self.wfile.write(answer)
            return
        truncate = fault is not None and fault.kind == "truncate"
        corrupt_answer = fault is not None and fault.kind == "corrupt" and body is None
        if fault is not None and fault.kind == "corrupt" and body is not None:
            body = flip_one_byte(body)
        if is_multipart_request(self.command, self.path):
            self._answer_multipart(body, truncate=truncate)
            return
        sources: list[dict[str, Any]] = []
        deletes_sources = False
        if kind == "compose" and self.command == "POST":
            data = b"".join(body or ())
            body = iter([data])
            sources, deletes_sources = compose_request(data)
            self.compose_custom_time = destination_custom_time(data)
        content_length = None
        if kind == "upload" and body is not None:
            body, longer = front.bucket_overlay.upload_body(self.path, self.headers.get("Content-Type", ""), body)
            content_length = int(self.headers.get("Content-Length") or 0) + longer if longer else None
        if not self.server.pause(front.latency):
            self.close_now()
            return
        path, _, query = self.path.partition("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        checked = (kind in ("upload", "delete", "compose") or "/rewriteTo/" in path) and params.keys() & {
            "ifGenerationMatch",
            "ifGenerationNotMatch",
        }
        if kind == "compose" and self.answer_not_found(kind, object_of(path)[0], None):  # its bucket, first
            for _ in body or ():
                pass
            return
        if self.command == "GET" and STORAGE_LAYOUT.fullmatch(path):
            self.answer_storage_layout(unquote(path.split("/")[4]))
            return
        folders_answer = front.folders.answer(self.command, path, params, lambda: b"".join(body or ()))
        if folders_answer is not None:
            self.answer_folders(*folders_answer)
            return
        if kind == "list" and "matchGlob" in params and self.answer_match_glob(path, params):
            return
        if self.answer_version(kind, path, params):
            return
        patched = front.patches.target(self.command, path)
        if patched is not None:  # preconditions, removed keys and metagenerations, which the emulator lacks
            data = b"".join(body or ())
            with front.rules.writes:
                patch_answer = front.patches.patch(*patched, params, data)
            if isinstance(patch_answer, tuple):
                self.answer_error(*patch_answer)
                return
            if patch_answer is not None:
                self.answer_json(json.loads(patch_answer))
                return
            body = iter([data])
        if checked and body is not None:  # taken in at the client's pace first, so only the write holds the lock
            body = iter([b"".join(body)])
        with front.rules.writes if checked else contextlib.nullcontext():  # check and write at once
            refusal = self.compose_refusal(sources, deletes_sources) if kind == "compose" else None
            refusal = refusal or front.rules.precondition_refusal(self.command, path, params)
            refusal = refusal or bucket_call_refusal(self.command, path, params, self.server.link.holds_objects)
            deleting = kind == "delete" and refusal is None
            deletion = front.bucket_overlay.deletion(*object_of(path), params) if deleting else None
            refusal = refusal or (deletion.refusal if deletion is not None else None)
            if refusal is not None:
                for _ in body or ():
                    pass
                self.answer_error(*refusal)
                return
            self._forward(
                body,
                chunked,
                truncate=truncate,
                corrupt=corrupt_answer,
                kind=kind,
                sources=sources,
                content_length=content_length,
            )
            if deletion is not None:
                deletion.settle()

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _handle

    def _answer_multipart(self, body: Iterator[bytes] | None, *, truncate: bool) -> None:
        """Serve an XML API multipart upload request, which the emulator lacks; ``truncate`` carries the
        request out but cuts the answer's body in half (an answer lost on the way)."""
        front = self.server.front
        completing = self.command == "POST" and self.server.uploads.unfinished(self.path) is not None
        delay, answer = (front.completion_delay, front.completion_answer) if completing else (0.0, "late")
        if answer == "late" and not self.server.pause(delay):  # the completion takes its time, then happens
            self.close_now()
            return
        status, reason, headers, payload = self.server.uploads.answer(self.command, self.path, self.headers, body)
        payload = stuck_page(self.path, payload) if self.stuck and status == 200 else payload
        if answer == "lost":  # done at once, and the answer never comes
            self.server.pause(delay)
            self.close_now()
            return
        if self.server.pause(front.latency):
            headers = [*headers, ("Content-Length", str(len(payload)))]
            self.wfile.write(
                answer_head(status, reason, headers) + (payload[: len(payload) // 2] if truncate else payload)
            )
            if truncate:
                self.close_now()
        else:
            self.close_now()

    def _inject(self, fault: Fault) -> None:
        if fault.kind in HTTP_FAULTS:
            status, reason, message = HTTP_FAULTS[fault.kind]
            extra = [] if fault.retry_after is None else [("Retry-After", f"{fault.retry_after:g}")]
            self.answer_error(status, reason, message, extra)
        elif fault.kind == "html_200":
            headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(HTML_PAGE)))]
            self.wfile.write(answer_head(200, "OK", headers) + (b"" if self.command == "HEAD" else HTML_PAGE))
        elif fault.kind == "reset":  # SO_LINGER 0: close() sends RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_now()
        else:  # stall
            self.server.pause(fault.stall_seconds)
            self.close_now()

    def _forward(
        self,
        body: Iterator[bytes] | None,
        chunked: bool,
        *,
        truncate: bool,
        corrupt: bool = False,
        kind: str = "other",
        sources: Sequence[dict[str, Any]] = (),
        content_length: int | None = None,
    ) -> None:
        try:
            connection, response = self.exchange(body, chunked, content_length)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close_connection = True
            self.answer_error(
                502, "Bad Gateway", f"the test front could not reach {self.server.front.upstream}: {exc!r}"
            )
            return
        complete = False
        try:
            complete = self._relay(response, truncate, corrupt, kind, sources)
        except (BrokenPipeError, ConnectionResetError):  # the client closed the connection mid-answer
            self.server.log.note_abandoned()
            raise
        finally:
            if complete:
                self.server.link.pool.put(connection)
            else:
                self.close_connection = True
                response.close()
                connection.close()

    def _relay(
        self,
        response: http.client.HTTPResponse,
        truncate: bool,
        corrupt: bool = False,
        kind: str = "other",
        sources: Sequence[dict[str, Any]] = (),
    ) -> bool:
        """Stream ``response`` to the client (with one byte flipped if ``corrupt``) as GCS would send
        it (see ``GCSRules``); returns whether it was read to its end."""
        front = self.server.front
        rules = front.rules
        has_body = self.command != "HEAD" and response.status >= 200 and response.status not in (204, 304)
        bucket, name = object_of(self.path)
        if response.status == 404 and self.answer_not_found(kind, bucket, name):
            response.read()
            return True
        if response.status == 416 and bucket is not None and name is not None:  # GCS names the object's size
            response.read()
            size = self.server.link.stored_size(bucket, name)
            self.answer_error(
                416,
                "Requested range not satisfiable",
                "Request range not satisfiable",
                [("Content-Range", f"bytes */{size}")],
            )
            return True
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
        status, reason = response.status, response.reason
        if kind == "delete" and status == 200 and self.path.startswith("/storage/"):  # GCS: 204, no body
            status, reason, has_body = 204, "No Content", False
            headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "content-type")]
        source: io.BufferedIOBase | http.client.HTTPResponse = response
        length = response.length  # None: chunked or until close
        json_answer = response.getheader("Content-Type", "").startswith("application/json")
        rewrite = "/rewriteTo/" in self.path
        if has_body and response.status == 200 and json_answer and (kind in DESCRIBED or rewrite):
            data = response.read()  # object resources are small: rewritten whole
            data = self.describe(kind, bucket, name, sources, data)
            if _accepts_gzip(self.headers.get("Accept-Encoding", "")):  # GCS compresses JSON answers when asked
                data = gzip.compress(data)
                headers.append(("Content-Encoding", "gzip"))
            source, length = io.BytesIO(data), len(data)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"] + [("Content-Length", str(length))]
        headers = rules.answer_headers(headers, bucket=bucket, name=name)
        rechunk = (
            has_body and (length is None or not rules.sends("content-length")) and self.request_version == "HTTP/1.1"
        )
        if has_body and length is None and not rechunk:
            self.close_connection = True
        if rechunk:
            headers.append(("Transfer-Encoding", "chunked"))
        if self.close_connection:
            headers.append(("Connection", "close"))
        pending = answer_head(status, reason, headers)
        if not has_body:
            self.wfile.write(pending)
            response.read()
            return True
        bandwidth = front.bandwidth
        piece_size = CHUNK if bandwidth is None else int(min(CHUNK, max(1024, bandwidth / 20)))
        cut_at = (length // 2 if length is not None else -1) if truncate else None  # -1: half the first piece
        sent, started = 0, time.monotonic()
        while True:
            piece = source.read1(piece_size)
            if cut_at == -1:
                cut_at = len(piece) // 2
            if cut_at is not None and sent + len(piece) >= cut_at:
                piece = piece[: cut_at - sent]
                self.wfile.write(pending + (encode_chunk(piece) if rechunk else piece))
                self.close_connection = True
                return False
            if not piece:
                break
            if corrupt:
                piece, corrupt = next(flip_one_byte(iter([piece]))), False
            self.wfile.write(pending + (encode_chunk(piece) if rechunk else piece))
            pending = b""
            sent += len(piece)
            if bandwidth is not None and not self.server.pause(started + sent / bandwidth - time.monotonic()):
                return False
        if pending or rechunk:
            self.wfile.write(pending + (b"0\r\n\r\n" if rechunk else b""))
        response.read()  # marks the response finished, so its connection can be reused
        if length is not None and sent < length:  # upstream stopped early: the client must see a cut too
            self.close_connection = True
            return False
        return True
