"""The front's HTTP/1.1 server on loopback, and what every one of its request handlers does: take a request in
at the front's pace, send it upstream over kept-alive connections, and word errors as GCS does; with the pieces
an answer is written in (its head, its chunks, a byte damaged on the way)."""

from __future__ import annotations

import http.client
import json
import socketserver
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Protocol
from urllib.parse import unquote

from ._folders import Folders
from ._gcs_rules import GCSRules
from ._list_index import ListingSnapshots
from ._multipart import MultipartUploads
from ._patches import MetadataPatches
from ._rate_ramp import RateRamp
from ._request_kinds import JSON_PREFIXES
from ._request_log import RequestLog
from ._soft_delete import BucketOverlay
from ._upstream import UpstreamLink
from ._versions import Versions

__all__ = [
    "CHUNK",
    "HOP_BY_HOP",
    "CompletionAnswer",
    "Front",
    "FrontServer",
    "BaseFrontHandler",
    "answer_head",
    "encode_chunk",
    "flip_one_byte",
]

CompletionAnswer = Literal["late", "lost"]
CHUNK = 256 * 1024  # bytes read and forwarded at a time, both ways
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"}
)


class Front(Protocol):
    """What a front's request handlers read of it: its settings (some change while it runs) and the keepers of
    the GCS rules the emulator lacks (see ``GCSFront``)."""

    upstream: str
    latency: float
    bandwidth: float | None
    completion_delay: float
    completion_answer: CompletionAnswer
    page_size: int
    object_only: bool
    ignore_range: bool
    rate_ramp: RateRamp | None
    rules: GCSRules
    bucket_overlay: BucketOverlay
    folders: Folders
    patches: MetadataPatches


class FrontServer(ThreadingHTTPServer):
    """A front's HTTP server, a thread a connection; through it the handlers reach what the front shares with them."""

    daemon_threads = True
    request_queue_size = 256  # many clients connect at once; the default backlog of 5 drops SYNs

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseFrontHandler],
        *,
        front: Front,
        log: RequestLog,
        link: UpstreamLink,
        uploads: MultipartUploads,
        versions: Versions,
        listings: ListingSnapshots,
    ) -> None:
        super().__init__(address, handler)
        self.front = front
        self.log = log
        self.link = link
        self.uploads = uploads  # the XML API multipart uploads the front serves
        self.versions = versions
        self.listings = listings
        self.stopping = threading.Event()  # set when the front stops

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can be slow; it is not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that went away is not an error
            super().handle_error(request, client_address)

    def pause(self, seconds: float) -> bool:
        """Sleep, cut short when the front stops; returns False when it is stopping."""
        if seconds > 0:
            return not self.stopping.wait(seconds)
        return not self.stopping.is_set()


class BaseFrontHandler(BaseHTTPRequestHandler):
    """What every request handler of a front does: take the request's body in at the front's pace, send the
    request upstream over a kept-alive connection, answer errors as GCS words them."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: FrontServer

    def setup(self) -> None:
        super().setup()
        self.server.log.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.log.track(self.connection, False)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def request_body(self) -> tuple[Iterator[bytes] | None, bool]:
        """The request body as it arrives, and whether it is chunked."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(), True
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0:
            raise ValueError(length)
        return (self._read_exact(length) if length else None), False

    def _read_exact(self, length: int) -> Iterator[bytes]:
        """``length`` bytes of the request body, taken in at most ``bandwidth`` bytes/s."""
        front = self.server.front
        bandwidth = front.bandwidth
        size = CHUNK if bandwidth is None else int(min(CHUNK, max(1024, bandwidth / 20)))
        received, started = 0, time.monotonic()
        while length > 0:
            piece = self.rfile.read(min(size, length))
            if not piece:
                raise ConnectionError("the client closed the connection in the middle of its body")
            length -= len(piece)
            received += len(piece)
            yield piece
            if bandwidth is not None and not self.server.pause(started + received / bandwidth - time.monotonic()):
                raise ConnectionError("the front is stopping")

    def _read_chunked(self) -> Iterator[bytes]:
        while size := _chunk_size(self.rfile.readline(1024)):
            yield from self._read_exact(size)
            self.rfile.readline(1024)  # the CRLF after each chunk
        while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):  # trailers, dropped
            pass

    def close_now(self) -> None:
        self.close_connection = True
        self.rfile.close()
        self.connection.close()

    def answer_error(
        self,
        status: int,
        reason: str,
        message: str,
        extra: Sequence[tuple[str, str]] = (),
        *,
        error_reason: str | None = None,
    ) -> None:
        """Answer ``status`` with a JSON error body shaped like GCS's (``error_reason``: its ``errors[].reason``,
        if not ``reason``)."""
        error = {"domain": "global", "reason": error_reason or reason, "message": message}
        body = json.dumps({"error": {"code": status, "message": message, "errors": [error]}}).encode()
        headers = [("Content-Type", "application/json; charset=UTF-8"), ("Content-Length", str(len(body))), *extra]
        if self.close_connection:
            headers.append(("Connection", "close"))
        self.wfile.write(answer_head(status, reason, headers) + (b"" if self.command == "HEAD" else body))

    def answer_not_found(self, kind: str, bucket: str | None, name: str | None) -> bool:
        """Answer a 404 from upstream as GCS words it (see ``GCSRules.not_found``); False where the
        path names no bucket, or the bucket exists and no object: upstream's answer then stands."""
        path = self.path.partition("?")[0]
        api = "json"
        if bucket is None and not path.startswith(JSON_PREFIXES):  # the XML API: /bucket/object
            api, (bucket, _, named) = "xml", unquote(path[1:]).partition("/")
            name = named or None
        if not bucket:
            return False
        if kind in ("get", "range_get") and api == "json":
            api = "media"
        answer = self.server.front.rules.not_found(bucket, name, api)
        if answer is None:
            return False
        content_type, body = answer
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if self.close_connection:
            headers.append(("Connection", "close"))
        self.wfile.write(answer_head(404, "Not Found", headers) + (b"" if self.command == "HEAD" else body))
        return True

    def exchange(
        self, body: Iterator[bytes] | None, chunked: bool, content_length: int | None = None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send the request upstream, streaming its body (a bodiless one skips stale pooled connections);
        ``content_length``: that of a body the front rewrote."""
        dropped = HOP_BY_HOP | {token.strip().lower() for token in self.headers.get("Connection", "").split(",")}
        if self.server.front.ignore_range:
            dropped |= {"range"}
        if chunked or content_length is not None:
            dropped |= {"content-length"}
        headers = [(name, value) for name, value in self.headers.items() if name.lower() not in dropped]
        if chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        elif content_length is not None:
            headers.append(("Content-Length", str(content_length)))
        while True:
            connection, reused = self.server.link.pool.get()
            try:
                connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    connection.putheader(name, value)
                connection.endheaders()
                if body is not None:
                    for piece in body:
                        connection.send(encode_chunk(piece) if chunked else piece)
                    if chunked:
                        connection.send(b"0\r\n\r\n")
                return connection, connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                connection.close()
                if not reused or body is not None:
                    raise
            except BaseException:
                connection.close()
                raise


def answer_head(status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
    """An answer's status line and headers."""
    lines = [f"HTTP/1.1 {status} {reason}\r\n", *(f"{name}: {value}\r\n" for name, value in headers), "\r\n"]
    return "".join(lines).encode("latin-1")


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise ConnectionError(f"malformed chunk size line {line[:40]!r}") from None


def flip_one_byte(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``chunks`` with one bit of the middle byte of the first non-empty chunk flipped."""
    for chunk in chunks:
        if chunk:
            middle = len(chunk) // 2
            yield chunk[:middle] + bytes([chunk[middle] ^ 0x01]) + chunk[middle + 1 :]
            break
        yield chunk
    yield from chunks


def encode_chunk(piece: bytes) -> bytes:
    """``piece`` as one chunk of a chunked body; nothing for an empty piece, which as a chunk would end the body."""
    return b"%x\r\n%b\r\n" % (len(piece), piece) if piece else b""
