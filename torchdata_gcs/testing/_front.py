"""A GCS-like front for the emulator: real HTTP with added latency, bandwidth caps, faults and counts.

The emulator answers at once and never fails; real GCS is tens of milliseconds away, throttles,
resets connections and sometimes stops answering. ``GCSFront`` is a small HTTP/1.1 server on
loopback that forwards every request to an upstream endpoint (the emulator) and adds exactly those
behaviours, so clients can be tested and measured against them over real sockets.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import io
import json
import re
import socket
import socketserver
import struct
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from .._ops.paging import MAX_PAGE_SIZE
from ._batch import answer_batch, batch_calls
from ._faults import HTML_PAGE, HTTP_FAULTS, Fault
from ._folders import Content, Folders
from ._gcs_rules import GCSRules, bucket_call_refusal, bucket_permission, denied
from ._list_index import ListingIndex, ListingSnapshots
from ._match_glob import glob_page
from ._multipart import MIN_PART_SIZE, MultipartUploads, is_multipart_request
from ._patches import MetadataPatches
from ._process import LocalService
from ._rate_ramp import READS, WRITES, RateRamp, bucket_of, rate_limited
from ._request_kinds import JSON_PREFIXES, is_write, request_kind
from ._request_log import RecordedRequest, RequestLog
from ._soft_delete import BucketOverlay
from ._stuck_pages import stuck_page
from ._upstream import UpstreamLink
from ._versions import Versions

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["GCSFront"]

CompletionAnswer = Literal["late", "lost"]
MAX_COMPOSE_SOURCES = 32
CHUNK = 256 * 1024  # bytes read and forwarded at a time, both ways
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"}
)
_STORAGE_LAYOUT = re.compile(r"/storage/v1/b/[^/]+/storageLayout")
_DESCRIBED = ("metadata", "list", "compose", "upload")  # kinds whose JSON answers describe objects
_MAX_RESULTS = re.compile(r"(?:^|&)maxResults=(\d+)")


def cap_list_page(target: str, limit: int = MAX_PAGE_SIZE) -> str:
    """Make a JSON API list request ask for at most ``limit`` entries (GCS serves at most 1,000 a page).

    The emulator returns every object in one page when ``maxResults`` is missing; GCS caps pages.

    Example:
        >>> cap_list_page("/storage/v1/b/bkt/o?prefix=a%2F")
        '/storage/v1/b/bkt/o?prefix=a%2F&maxResults=1000'
        >>> cap_list_page("/storage/v1/b/bkt/o?maxResults=5000&prefix=x")
        '/storage/v1/b/bkt/o?maxResults=1000&prefix=x'
    """
    path, _, query = target.partition("?")
    if re.search(r"(?:^|&)maxResults=(?!\d+(?:&|$))", query):
        return target  # not a number: upstream refuses it, as GCS does
    match = _MAX_RESULTS.search(query)
    if match is None:
        return f"{path}?{query}{'&' if query else ''}maxResults={limit}"
    if int(match.group(1)) <= limit:
        return target
    return f"{path}?{query[: match.start(1)]}{limit}{query[match.end(1) :]}"


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header allows gzip (``gzip``, with a non-zero ``q`` if one is given)."""
    for coding in accept_encoding.split(","):
        name, _, weight = coding.strip().partition(";")
        if name.strip().lower() == "gzip":
            return weight.strip().replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


class GCSFront(LocalService):
    """An HTTP/1.1 server on a free loopback port that forwards to ``upstream`` and misbehaves on purpose.

    Every request is counted by kind (:data:`REQUEST_KINDS`) and forwarded with its path byte-exact
    (except that JSON list requests are capped at ``page_size``, 1,000 objects a page as GCS caps them),
    its end-to-end headers (``Host`` included) and its body streamed in chunks; the answer comes
    back the same way, so no body is ever held whole. Client and upstream connections are kept
    alive. GCS's rules that the emulator does not keep are kept here (see ``_gcs_rules``): a
    compose source that is missing or not at its given ``generation`` is answered 404, a failed
    ``ifGenerationMatch``/``ifGenerationNotMatch`` on a compose (source or destination), a rewrite's
    destination, a delete or a media upload 412, a compose of sources in more than one storage class
    400, and nothing is written; composite and multipart-uploaded objects have no MD5
    and a ``componentCount``; ``x-goog-hash`` values come on separate lines, ``md5`` first. With
    ``only_promised_headers`` the answers carry only the headers GCS promises (no ``x-goog-*``
    metadata headers, no ``Content-Length``: bodies go chunked) but those named in ``also_send``.
    With ``object_only`` the front acts as an identity holding object roles only (Storage Object
    Viewer, User or Admin, as training jobs usually run): every JSON API call on a bucket's own
    resource (get, update, delete, IAM policy; listing and creating buckets) is refused with GCS's 403
    naming the ``storage.buckets.*`` permission it lacks, while calls on objects, folders and the
    storage layout pass. The storage layout (``getStorageLayout``), which the emulator lacks, is
    answered by the front: upstream's location, and a hierarchical namespace for the buckets named in
    ``hierarchical``, whose folders the front keeps as GCS does (see ``_folders``). Bucket settings the emulator
    lacks (default storage class, Autoclass, default event-based hold, lifecycle, soft delete policy) are
    set per bucket on :attr:`bucket_overlay` (see ``_soft_delete``): ``buckets.get`` reports them, deletes
    in a bucket with soft delete keep the object for ``softDeleted=true`` listings, objects created
    under a default event-based hold are held (their delete refused with 403), and a JSON multipart upload
    whose metadata names no storage class takes the bucket's. A compose with ``deleteSourceObjects``
    (which the emulator ignores) deletes its sources for good once done, or is refused with 403 if one
    of them is held. A JSON API delete of a version by its ``generation`` removes that version for good, live or
    noncurrent, and one of a version that does not exist is answered 404 (the emulator deletes the live
    object whatever the generation; see ``_versions``). An object metadata patch (``PATCH``) is carried out as
    GCS does (see ``_patches``): its ``ifGenerationMatch``/``ifMetagenerationMatch`` (and ``NotMatch``) checked
    (412), a metadata key set to ``null`` removed, the ``metageneration`` moved on, all of which the emulator
    lacks. An object written with a Cloud KMS key (``kmsKeyName`` on an upload or compose,
    ``x-goog-encryption-kms-key-name`` on an XML multipart upload) is described with its ``kmsKeyName``, which
    the emulator drops.
    XML API multipart uploads, which the emulator lacks, are served by the front itself (see
    ``_multipart``; parts other than the last must reach ``min_part_size``, GCS's 5 MiB by default;
    a part whose ``x-goog-hash`` or ``Content-MD5`` does not match is refused) and written to the
    emulator whole on completion; :attr:`open_uploads` lists the unfinished ones. A completion of an
    unfinished upload takes ``completion_delay`` seconds, as GCS's may take minutes: with
    ``completion_answer="late"`` the object appears and the answer is sent only then; with ``"lost"``
    the object is created at once, and the connection is closed that long after without an answer.
    JSON batch requests (``POST /batch/storage/v1``), which the emulator serves wrongly, are served by
    the front too (see ``_batch``): each call is sent to the front itself, so it is counted, checked and
    faulted as a single request, and more than 100 calls are refused with 400.
    A ranged media GET of an empty object (no byte to start at) is answered as GCS does: 416 with
    ``Content-Range: bytes */SIZE``; with ``ignore_range`` every ``Range`` header is dropped on the way, as by
    a server or proxy that answers 200 with the whole object. :attr:`abandoned_answers` counts answers
    whose client closed the connection before their body's end (each one a connection lost to its pool).
    With ``page_size`` list pages (objects, and multipart uploads) hold at most that many entries, as GCS's
    pages may hold fewer than asked: a short listing then spans several pages.
    A list request with ``matchGlob`` gets only the objects the glob selects, as GCS reads it (see
    ``_match_glob``), up to ``maxResults`` of them a page; an invalid glob, 400.
    With ``record``, :attr:`recorded` keeps every request as the client sent it. With ``lose_write_answers``,
    the first attempt of every write (upload, compose, rewrite, delete, patch) is carried out and then
    answered 503, as an answer lost on the way would be, and :attr:`unconditional_resends` lists each
    write sent again without what makes it safe to repeat (see :func:`repeatable`). On top, per request:

    - ``latency`` seconds pass before the request is answered (or forwarded);
    - request and response bodies travel at most ``bandwidth`` bytes/s each way per connection
      (``None``: no cap), as one connection to GCS has a throughput of its own;
    - the first of ``faults`` that applies (matches, has ``times`` left, and wins its ``rate``
      draw from a ``random.Random(seed)``) is injected instead; see :class:`Fault`;
    - with ``rate_ramp`` (a :class:`RateRamp`), an object read or write over its bucket's request rate,
      which starts low and doubles under sustained load as GCS's does, is answered 429 as GCS answers.

    ``latency`` and ``bandwidth`` may be changed while running; :meth:`set_faults` replaces the
    faults. Use it as a context manager, which stops it (closing every connection) whatever happens.

    Example:
        >>> from torchdata_gcs import GCSFileLoaderIterDataPipe, RetryConfig
        >>> from torchdata_gcs.testing import Emulator, Fault, GCSFront
        >>> with Emulator() as emulator, GCSFront(emulator.endpoint, faults=[Fault("http_503", times=1)]) as front:
        ...     emulator.seed("bucket", {"a.txt": b"hello"})
        ...     pipe = GCSFileLoaderIterDataPipe(
        ...         ["gs://bucket/a.txt"], client=front.client_config, retry=RetryConfig(initial_delay=0.01)
        ...     )
        ...     [stream.read() for _, stream in pipe], front.counts["range_get"], front.faults_injected["http_503"]
        ([b'hello'], 2, 1)
    """

    kind = "front"

    def __init__(
        self,
        upstream: str,
        *,
        latency: float = 0.0,
        bandwidth: float | None = None,
        faults: Sequence[Fault] = (),
        seed: int | None = 0,
        min_part_size: int = MIN_PART_SIZE,
        only_promised_headers: bool = False,
        also_send: Sequence[str] = (),
        record: bool = False,
        completion_delay: float = 0.0,
        completion_answer: CompletionAnswer = "late",
        object_only: bool = False,
        lose_write_answers: bool = False,
        hierarchical: Sequence[str] = (),
        ignore_range: bool = False,
        page_size: int = MAX_PAGE_SIZE,
        rate_ramp: RateRamp | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or parts.path.strip("/") or parts.query:
            raise ValueError(f"upstream must be a plain http://host:port endpoint, got {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self._upstream_address = (parts.hostname, parts.port or 80)
        self.latency = latency
        self.bandwidth = bandwidth
        self.completion_delay = completion_delay
        self.completion_answer = completion_answer
        self.endpoint = ""
        self._lock = threading.Lock()
        self._log = RequestLog(seed, keep_requests=record, lose_write_answers=lose_write_answers)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._link = UpstreamLink(self._upstream_address)
        self._listings = ListingSnapshots()
        address = self._upstream_address
        self.rules = GCSRules(
            self._link.live_generation,
            self._link.bucket_exists,
            only_promised_headers=only_promised_headers,
            also_send=also_send,
        )
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be within [1, {MAX_PAGE_SIZE}], got {page_size}")
        self.page_size = page_size
        self._multipart = MultipartUploads(
            lambda: http.client.HTTPConnection(*address, timeout=300), self.rules, min_part_size, page_size
        )
        self.object_only = object_only
        self.bucket_overlay = BucketOverlay(self._link.ask)
        self.folders = Folders(hierarchical, self._link.ask)
        self.patches = MetadataPatches(lambda method, path, body: self._link.ask(path, method, body))
        self._versions = Versions(self._link.ask)
        self.ignore_range = ignore_range
        self.rate_ramp = rate_ramp
        self.set_faults(faults)

    def __repr__(self) -> str:
        return f"GCSFront(upstream={self.upstream!r}, endpoint={self.endpoint!r}, latency={self.latency})"

    @property
    def latency(self) -> float:
        """Seconds added before each request is answered."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"latency must be >= 0 seconds, got {seconds}")
        self._latency = float(seconds)

    @property
    def bandwidth(self) -> float | None:
        """Bytes per second each connection may receive in response bodies; ``None``: unlimited."""
        return self._bandwidth

    @bandwidth.setter
    def bandwidth(self, bytes_per_second: float | None) -> None:
        if bytes_per_second is not None and not bytes_per_second > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s or None, got {bytes_per_second}")
        self._bandwidth = bytes_per_second

    @property
    def completion_delay(self) -> float:
        """Seconds a multipart upload's completion takes before it is answered (or its answer lost)."""
        return self._completion_delay

    @completion_delay.setter
    def completion_delay(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"completion_delay must be >= 0 seconds, got {seconds}")
        self._completion_delay = float(seconds)

    @property
    def completion_answer(self) -> CompletionAnswer:
        """``"late"``: a completion's object appears when its answer is sent, ``completion_delay`` on;
        ``"lost"``: the object is created at once and the answer never sent."""
        return self._completion_answer

    @completion_answer.setter
    def completion_answer(self, mode: CompletionAnswer) -> None:
        if mode not in ("late", "lost"):
            raise ValueError(f"completion_answer must be 'late' or 'lost', got {mode!r}")
        self._completion_answer = mode

    @property
    def faults(self) -> tuple[Fault, ...]:
        """The faults in force, in the order they are tried."""
        return self._log.faults

    def set_faults(self, faults: Sequence[Fault]) -> None:
        """Replace the faults (thread-safe); their ``times`` allowances start afresh."""
        faults = tuple(faults)
        if not all(isinstance(fault, Fault) for fault in faults):
            raise ValueError("faults must be Fault instances")
        self._log.set_faults(faults)

    @property
    def counts(self) -> Counter[str]:
        """Requests received so far by kind (a copy)."""
        return self._log.counts

    @property
    def open_uploads(self) -> list[tuple[str, str]]:
        """``(bucket, object name)`` of every XML multipart upload neither completed nor aborted."""
        return self._multipart.open_uploads

    @property
    def multipart_completions(self) -> list[tuple[str, str, float]]:
        """``(bucket, object name, seconds)`` of every XML multipart upload completed since the last
        :meth:`reset_counts`: the seconds the front took to write the object into the emulator."""
        return self._multipart.completions

    @property
    def recorded(self) -> list[RecordedRequest]:
        """Every request received, as the client sent it, when the front was made with ``record=True``."""
        return self._log.recorded

    @property
    def unconditional_resends(self) -> list[str]:
        """``"METHOD /path?query"`` of every write sent again that GCS does not make safe to repeat (a
        late repeat could overwrite or delete a newer object); kept with ``lose_write_answers``."""
        return self._log.unconditional_resends

    @property
    def peak_connections(self) -> int:
        """The most client connections open at once since the last :meth:`reset_counts`."""
        return self._log.peak_connections

    @property
    def abandoned_answers(self) -> int:
        """Answers whose client closed the connection before the front had sent all of their body."""
        return self._log.abandoned_answers

    @property
    def faults_injected(self) -> Counter[str]:
        """Faults injected so far by fault kind (a copy)."""
        return self._log.faults_injected

    def reset_counts(self) -> None:
        """Zero :attr:`counts`, :attr:`faults_injected` and :attr:`multipart_completions`, and start
        :attr:`peak_connections` over from the connections open now (``times`` allowances are kept)."""
        self._multipart.forget_completions()
        self._log.reset()

    def start(self) -> Self:
        """Start serving (if not already); returns ``self``."""
        with self._lock:
            if self._server is not None:
                return self
            self._link.reopen()
            server = _Server(
                ("127.0.0.1", 0),
                _Handler,
                front=self,
                log=self._log,
                link=self._link,
                uploads=self._multipart,
                versions=self._versions,
                listings=self._listings,
            )
            self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
            self._thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="gcs-front", daemon=True
            )
            self._thread.start()
            self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and close every connection, stalled ones included; safe to call again."""
        with self._lock:
            server, self._server = self._server, None
            connections = self._log.connections
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.stopping.set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._link.close()
        if self._thread is not None:
            self._thread.join()
        self._multipart.close()

    def index_listings(self, bucket: str) -> int:
        """Answer list requests for ``bucket`` from a snapshot of its objects taken now.

        A benchmark mode: fake-gcs-server re-reads the whole bucket for every list page, so on a
        large bucket a listing measures the emulator, not the client. The snapshot answers pages
        (``prefix``, ``startOffset``, ``endOffset``, ``maxResults``, ``pageToken``, ``fields``) from
        memory; other list requests still reach the emulator. Any upload, delete or compose through
        the front drops every snapshot. Returns the number of objects indexed.
        """
        resources: list[dict[str, Any]] = []
        url = f"{self.upstream}/storage/v1/b/{quote(bucket, safe='')}/o"
        params: dict[str, str] = {}
        while True:
            with urllib.request.urlopen(f"{url}?{urlencode(params)}", timeout=600) as response:
                page = json.load(response)
            resources += page.get("items", [])
            if not page.get("nextPageToken"):
                break
            params["pageToken"] = page["nextPageToken"]
        self._listings.keep(bucket, ListingIndex(resources))
        return len(resources)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once; the default backlog of 5 drops SYNs

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[_Handler],
        *,
        front: GCSFront,
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


def _head(status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}\r\n", *(f"{name}: {value}\r\n" for name, value in headers), "\r\n"]
    return "".join(lines).encode("latin-1")


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise ConnectionError(f"malformed chunk size line {line[:40]!r}") from None


def _object_of(target: str) -> tuple[str | None, str | None]:
    """``(bucket, name)`` of a JSON API object path (``name`` is ``None`` for a bucket's paths)."""
    parts = target.partition("?")[0].split("/")
    if parts[1:4] == ["storage", "v1", "b"] and len(parts) > 4:
        offset = 4
    elif parts[1:5] in (["download", "storage", "v1", "b"], ["upload", "storage", "v1", "b"]) and len(parts) > 5:
        offset = 5
    else:
        return None, None
    bucket = unquote(parts[offset])
    rest = parts[offset + 1 :]
    if len(rest) < 2 or rest[0] != "o" or not rest[1]:
        return bucket, None
    name = "/".join(rest[1:])
    return bucket, unquote(name.removesuffix("/compose") if target.split("?")[0].endswith("/compose") else name)


def _compose_request(data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """The ``sourceObjects`` of a compose request body (none if it is malformed: the emulator answers it),
    and whether it asks for them to be deleted (``deleteSourceObjects``)."""
    try:
        request = json.loads(data)
        sources = request.get("sourceObjects", [])
    except (ValueError, AttributeError):
        return [], False
    deleting = request.get("deleteSourceObjects") is True
    return ([source for source in sources if isinstance(source, dict)] if isinstance(sources, list) else []), deleting


def _destination_custom_time(data: bytes) -> str | None:
    """The ``destination.customTime`` of a compose request body, if it gives one."""
    try:
        time = json.loads(data).get("destination", {}).get("customTime")
    except (ValueError, AttributeError):
        return None
    return time if isinstance(time, str) else None


def _flip_one_byte(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``chunks`` with one bit of the middle byte of the first non-empty chunk flipped."""
    for chunk in chunks:
        if chunk:
            middle = len(chunk) // 2
            yield chunk[:middle] + bytes([chunk[middle] ^ 0x01]) + chunk[middle + 1 :]
            break
        yield chunk
    yield from chunks


def _chunk(piece: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(piece), piece) if piece else b""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    compose_class: str | None = None  # the storage class of the sources of the compose being forwarded
    compose_custom_time: str | None = None  # the custom time the compose being forwarded gives its object
    sources_to_delete: Sequence[tuple[str, int]] = ()  # its sources, with their generations, if it deletes them
    stuck = False  # the request's answer names its own page token as the next one ("repeat_token")

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
            if fault is None and self._answer_from_index():
                return
        try:
            body, chunked = self._request_body()
        except ValueError:
            self.close_connection = True  # the body's end is unknown
            self._answer_error(400, "Bad Request", "malformed Content-Length")
            return
        if self.server.log.keeps_requests:
            data = b"".join(body or ())
            body = iter([data]) if body is not None else None
            self.server.log.keep(RecordedRequest(self.command, self.path, list(self.headers.items()), data))
        if fault is None and kind == "list" and (listing := front.bucket_overlay.listing(self.path)) is not None:
            if self.server.pause(front.latency):
                self._answer_error(*listing) if isinstance(listing, tuple) else self._answer_json(listing)
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
            for _ in self._request_body()[0] or ():  # take the whole request, so the connection stays usable
                pass
        except ValueError:
            self.close_connection = True
        if not self.server.pause(self.server.front.latency):
            self._close_now()
            return True
        content_type, body = rate_limited(bucket, xml=not self.path.startswith(JSON_PREFIXES))
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if self.close_connection:
            headers.append(("Connection", "close"))
        self.wfile.write(_head(429, "Too Many Requests", headers) + (b"" if self.command == "HEAD" else body))
        return True

    def _carry_out_unanswered(self, body: Iterator[bytes] | None, chunked: bool, kind: str) -> None:
        """Carry the request out, drop upstream's answer and answer 503 instead: a lost answer."""
        answer, self.wfile = self.wfile, io.BytesIO()
        try:
            self._carry_out(body, chunked, kind, None)
        finally:
            self.wfile = answer
        if self.connection.fileno() != -1:  # not closed while carrying out
            self._answer_error(503, "Service Unavailable", "injected by the test front: the answer was lost")

    def _carry_out(self, body: Iterator[bytes] | None, chunked: bool, kind: str, fault: Fault | None) -> None:
        front = self.server.front
        if fault is not None and fault.kind not in ("truncate", "corrupt"):
            for _ in body or ():  # take the whole request, so the client waits for an answer
                pass
            if self.server.pause(front.latency):
                self._inject(fault)
            else:
                self._close_now()
            return
        needed = bucket_permission(self.command, self.path.partition("?")[0]) if front.object_only else None
        if needed is not None:
            for _ in body or ():
                pass
            if self.server.pause(front.latency):
                self._answer_error(*denied(*needed), error_reason="forbidden")
            else:
                self._close_now()
            return
        if kind == "batch":
            try:
                calls = batch_calls(self.headers.get("Content-Type", ""), b"".join(body or ()))
            except ValueError as exc:
                self._answer_error(400, "Bad Request", str(exc))
                return
            answer = answer_batch((self.server.server_name, self.server.server_port), self.headers.items(), calls)
            if fault is not None and fault.kind == "truncate":  # carried out, its answer cut on the way
                self.wfile.write(answer[: len(answer) // 2])
                self._close_now()
                return
            self.wfile.write(answer)
            return
        truncate = fault is not None and fault.kind == "truncate"
        corrupt_answer = fault is not None and fault.kind == "corrupt" and body is None
        if fault is not None and fault.kind == "corrupt" and body is not None:
            body = _flip_one_byte(body)
        if is_multipart_request(self.command, self.path):
            self._answer_multipart(body, truncate=truncate)
            return
        sources: list[dict[str, Any]] = []
        deletes_sources = False
        if kind == "compose" and self.command == "POST":
            data = b"".join(body or ())
            body = iter([data])
            sources, deletes_sources = _compose_request(data)
            self.compose_custom_time = _destination_custom_time(data)
        content_length = None
        if kind == "upload" and body is not None:
            body, longer = front.bucket_overlay.upload_body(self.path, self.headers.get("Content-Type", ""), body)
            content_length = int(self.headers.get("Content-Length") or 0) + longer if longer else None
        if not self.server.pause(front.latency):
            self._close_now()
            return
        path, _, query = self.path.partition("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        checked = (kind in ("upload", "delete", "compose") or "/rewriteTo/" in path) and params.keys() & {
            "ifGenerationMatch",
            "ifGenerationNotMatch",
        }
        if kind == "compose" and self._answer_not_found(kind, _object_of(path)[0], None):  # its bucket, first
            for _ in body or ():
                pass
            return
        if self.command == "GET" and _STORAGE_LAYOUT.fullmatch(path):
            self._answer_storage_layout(unquote(path.split("/")[4]))
            return
        folders_answer = front.folders.answer(self.command, path, params, lambda: b"".join(body or ()))
        if folders_answer is not None:
            self._answer_folders(*folders_answer)
            return
        if kind == "list" and "matchGlob" in params and self._answer_match_glob(path, params):
            return
        if self._answer_version(kind, path, params):
            return
        patched = front.patches.target(self.command, path)
        if patched is not None:  # preconditions, removed keys and metagenerations, which the emulator lacks
            data = b"".join(body or ())
            with front.rules.writes:
                answer = front.patches.patch(*patched, params, data)
            if isinstance(answer, tuple):
                self._answer_error(*answer)
                return
            if answer is not None:
                self._answer_json(json.loads(answer))
                return
            body = iter([data])
        if checked and body is not None:  # taken in at the client's pace first, so only the write holds the lock
            body = iter([b"".join(body)])
        with front.rules.writes if checked else contextlib.nullcontext():  # check and write at once
            refusal = self._compose_refusal(sources, deletes_sources) if kind == "compose" else None
            refusal = refusal or front.rules.precondition_refusal(self.command, path, params)
            refusal = refusal or bucket_call_refusal(self.command, path, params, self.server.link.holds_objects)
            deleting = kind == "delete" and refusal is None
            deletion = front.bucket_overlay.deletion(*_object_of(path), params) if deleting else None
            refusal = refusal or (deletion.refusal if deletion is not None else None)
            if refusal is not None:
                for _ in body or ():
                    pass
                self._answer_error(*refusal)
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

    def _note_kms_key(self, kind: str, answer: bytes) -> None:
        """Record the Cloud KMS key an upload or compose (``kmsKeyName``) or a finished rewrite
        (``destinationKmsKeyName``) wrote its object with, which the emulator ignores, so the object's
        resources name it as GCS's do."""
        params = dict(parse_qsl(self.path.partition("?")[2]))
        written = json.loads(answer)
        if "/rewriteTo/" in self.path:
            key, written = params.get("destinationKmsKeyName"), written.get("resource") if written.get("done") else None
        else:
            key = params.get("kmsKeyName") if kind in ("upload", "compose") else None
        if key is not None and written is not None:
            self.server.front.rules.add_kms_key(written["bucket"], written["name"], int(written["generation"]), key)

    def _answer_multipart(self, body: Iterator[bytes] | None, *, truncate: bool) -> None:
        """Serve an XML API multipart upload request, which the emulator lacks; ``truncate`` carries the
        request out but cuts the answer's body in half (an answer lost on the way)."""
        front = self.server.front
        completing = self.command == "POST" and self.server.uploads.unfinished(self.path) is not None
        delay, answer = (front.completion_delay, front.completion_answer) if completing else (0.0, "late")
        if answer == "late" and not self.server.pause(delay):  # the completion takes its time, then happens
            self._close_now()
            return
        status, reason, headers, payload = self.server.uploads.answer(self.command, self.path, self.headers, body)
        payload = stuck_page(self.path, payload) if self.stuck and status == 200 else payload
        if answer == "lost":  # done at once, and the answer never comes
            self.server.pause(delay)
            self._close_now()
            return
        if self.server.pause(front.latency):
            headers = [*headers, ("Content-Length", str(len(payload)))]
            self.wfile.write(_head(status, reason, headers) + (payload[: len(payload) // 2] if truncate else payload))
            if truncate:
                self._close_now()
        else:
            self._close_now()

    def _answer_from_index(self) -> bool:
        """Answer a list request from the front's snapshot of its bucket, if it has one that fits."""
        front = self.server.front
        path, _, query = self.path.partition("?")
        index = self.server.listings.of(unquote(path.split("/")[4]))
        if index is None:
            return False
        try:
            page = index.page(dict(parse_qsl(query, keep_blank_values=True)))
        except ValueError as exc:
            if self.server.pause(front.latency):
                self._answer_error(400, "Bad Request", str(exc))
            return True
        if page is None:
            return False
        if self.server.pause(front.latency):
            self._answer_json(page)
        return True

    def _answer_version(self, kind: str, path: str, params: dict[str, str]) -> bool:
        """Answer as GCS does a JSON API read or delete of a version by its ``generation`` where the emulator
        would not (see ``_versions``); False when the request is to go upstream."""
        bucket, name = _object_of(path)
        if "generation" not in params or bucket is None or name is None or not params["generation"].isdigit():
            return False
        versions, generation = self.server.versions, int(params["generation"])
        if kind == "delete":
            with self.server.front.rules.writes:
                outcome = versions.delete(bucket, name, generation)
            if outcome is True:
                return False
            if outcome is False:
                self.wfile.write(_head(204, "No Content", []))
            else:
                self._answer_error(*outcome)
            return True
        if self.command == "GET" and versions.gone(bucket, name, generation):
            self._answer_error(404, "Not Found", f"No such object: {bucket}/{name}#{generation}")
            return True
        return False

    def _answer_match_glob(self, path: str, params: dict[str, str]) -> bool:
        """Answer a JSON API list request with ``matchGlob`` as GCS does (the emulator ignores it); 400 if
        the glob is invalid. False when the front leaves it upstream (see ``glob_page``)."""
        rules = self.server.front.rules
        try:
            page = glob_page(params, path, self.server.link.ask)
        except ValueError as exc:
            message = f"Invalid matchGlob {params['matchGlob']!r}: {exc}"
            self._answer_error(400, "Bad Request", message, error_reason="invalid")
            return True
        if page is not None:
            self._answer_json(json.loads(rules.rewrite_resources(json.dumps(page).encode())))
        return page is not None

    def _answer_json(self, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        body = stuck_page(self.path, body) if self.stuck else body
        headers = [("Content-Type", "application/json; charset=UTF-8"), ("Content-Length", str(len(body)))]
        self.wfile.write(_head(200, "OK", headers) + body)

    def _answer_storage_layout(self, bucket: str) -> None:
        """GCS's ``getStorageLayout``, which the emulator lacks: the bucket's location as upstream reports it,
        and whether the front gives it a hierarchical namespace."""
        if self._answer_not_found("metadata", bucket, None):
            return
        resource = json.loads(self.server.link.ask(f"/storage/v1/b/{quote(bucket, safe='')}")[1])
        enabled = bucket in self.server.front.folders.hierarchical
        layout = {"kind": "storage#storageLayout", "bucket": bucket, "hierarchicalNamespace": {"enabled": enabled}}
        layout.update({key: resource[key] for key in ("location", "locationType") if key in resource})
        self._answer_json(layout)

    def _answer_folders(self, status: int, reason: str, content: Content) -> None:
        """Send the front's own answer about folders: an error message, no body (204), or a JSON document."""
        if isinstance(content, str):
            self._answer_error(status, reason, content)
        elif content is None:
            self.wfile.write(_head(status, reason, []))
        else:
            body = self.server.front.rules.rewrite_resources(json.dumps(content).encode())
            headers = [("Content-Type", "application/json; charset=UTF-8"), ("Content-Length", str(len(body)))]
            self.wfile.write(_head(status, reason, headers) + body)

    def _compose_refusal(self, sources: list[dict[str, Any]], deleting: bool = False) -> tuple[int, str, str] | None:
        """GCS's answer to a compose whose sources are missing or changed; the emulator checks neither.

        More than 32 sources (GCS's limit per call) get 400; a source that does not exist, or whose
        ``generation`` is not the live one (buckets without versioning keep no other), 404; a failed
        ``objectPreconditions.ifGenerationMatch``, 412; sources of more than one storage class, 400
        (the emulator composes them, and makes the composite Standard). A compose that would delete
        its sources (``deleteSourceObjects``, which the emulator ignores) is refused with the 403 of a
        held object's delete if one of them is held; otherwise the front deletes them once it is done.
        """
        bucket = unquote(self.path.split("/")[4])
        if len(sources) > MAX_COMPOSE_SOURCES:
            return (
                400,
                "Bad Request",
                f"The number of source components provided ({len(sources)}) exceeds the maximum (32)",
            )
        front = self.server.front
        classes = set()
        versions: list[tuple[str, int]] = []
        self.compose_class, self.sources_to_delete = None, ()
        for source in sources:
            name = str(source.get("name", ""))
            version = self.server.link.live_version(bucket, name)
            live, storage_class = version if version is not None else (None, None)
            pinned = source.get("generation")
            if live is None or (pinned is not None and int(pinned) != live):
                return 404, "Not Found", f"No such object: {bucket}/{name}" + (f"#{pinned}" if pinned else "")
            wanted = (source.get("objectPreconditions") or {}).get("ifGenerationMatch")
            if wanted is not None and int(wanted) != live:
                return 412, "Precondition Failed", "At least one of the pre-conditions you specified did not hold."
            classes.add(storage_class)
            versions.append((name, live))
            if deleting and front.bucket_overlay.held(bucket, live):
                return front.bucket_overlay.hold_refusal(bucket, name)
        if len(classes) > 1:
            return 400, "Bad Request", "All of the source objects must have the same storage class."
        self.compose_class = classes.pop() if classes else None
        self.sources_to_delete = versions if deleting else ()
        return None

    def _request_body(self) -> tuple[Iterator[bytes] | None, bool]:
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

    def _close_now(self) -> None:
        self.close_connection = True
        self.rfile.close()
        self.connection.close()

    def _answer_error(
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
        self.wfile.write(_head(status, reason, headers) + (b"" if self.command == "HEAD" else body))

    def _answer_not_found(self, kind: str, bucket: str | None, name: str | None) -> bool:
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
        self.wfile.write(_head(404, "Not Found", headers) + (b"" if self.command == "HEAD" else body))
        return True

    def _inject(self, fault: Fault) -> None:
        if fault.kind in HTTP_FAULTS:
            status, reason, message = HTTP_FAULTS[fault.kind]
            extra = [] if fault.retry_after is None else [("Retry-After", f"{fault.retry_after:g}")]
            self._answer_error(status, reason, message, extra)
        elif fault.kind == "html_200":
            headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(HTML_PAGE)))]
            self.wfile.write(_head(200, "OK", headers) + (b"" if self.command == "HEAD" else HTML_PAGE))
        elif fault.kind == "reset":  # SO_LINGER 0: close() sends RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._close_now()
        else:  # stall
            self.server.pause(fault.stall_seconds)
            self._close_now()

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
            connection, response = self._exchange(body, chunked, content_length)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close_connection = True
            self._answer_error(
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

    def _exchange(
        self, body: Iterator[bytes] | None, chunked: bool, content_length: int | None = None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send the request upstream, streaming its body (a bodiless one skips stale pooled connections);
        ``content_length``: that of a body the front rewrote."""
        dropped = _HOP_BY_HOP | {token.strip().lower() for token in self.headers.get("Connection", "").split(",")}
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
                        connection.send(_chunk(piece) if chunked else piece)
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
        bucket, name = _object_of(self.path)
        if response.status == 404 and self._answer_not_found(kind, bucket, name):
            response.read()
            return True
        if response.status == 416 and bucket is not None and name is not None:  # GCS names the object's size
            response.read()
            size = self.server.link.stored_size(bucket, name)
            self._answer_error(
                416,
                "Requested range not satisfiable",
                "Request range not satisfiable",
                [("Content-Range", f"bytes */{size}")],
            )
            return True
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        status, reason = response.status, response.reason
        if kind == "delete" and status == 200 and self.path.startswith("/storage/"):  # GCS: 204, no body
            status, reason, has_body = 204, "No Content", False
            headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "content-type")]
        source: io.BufferedIOBase | http.client.HTTPResponse = response
        length = response.length  # None: chunked or until close
        json_answer = response.getheader("Content-Type", "").startswith("application/json")
        rewrite = "/rewriteTo/" in self.path
        if has_body and response.status == 200 and json_answer and (kind in _DESCRIBED or rewrite):
            data = response.read()  # object resources are small: rewritten whole
            if kind == "compose" and bucket is not None and name is not None:
                generation = json.loads(data).get("generation")
                if generation is not None:
                    components = rules.components_of(bucket, sources)
                    rules.add_composite(bucket, name, int(generation), components, self.compose_class)
                    for source, source_generation in self.sources_to_delete:  # for good: no soft-deleted copy
                        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(source, safe='')}"
                        self.server.link.ask(f"{path}?generation={source_generation}", "DELETE")
                    if self.compose_custom_time is not None:  # the emulator's compose drops it; GCS keeps it
                        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
                        self.server.link.ask(
                            path, "PATCH", json.dumps({"customTime": self.compose_custom_time}).encode()
                        )
                        data = self.server.link.ask(f"{path}?generation={generation}&projection=noAcl")[1]
            self._note_kms_key(kind, data)
            data = front.bucket_overlay.answer(self.path, front.patches.rewrite(rules.rewrite_resources(data)))
            data = self.server.versions.listing(bucket, data) if kind == "list" and bucket is not None else data
            data = front.folders.describe_bucket(self.path, data)
            data = stuck_page(self.path, data) if self.stuck else data
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
        pending = _head(status, reason, headers)
        if not has_body:
            self.wfile.write(pending)
            response.read()
            return True
        bandwidth = front.bandwidth
        size = CHUNK if bandwidth is None else int(min(CHUNK, max(1024, bandwidth / 20)))
        cut_at = (length // 2 if length is not None else -1) if truncate else None  # -1: half the first piece
        sent, started = 0, time.monotonic()
        while True:
            piece = source.read1(size)
            if cut_at == -1:
                cut_at = len(piece) // 2
            if cut_at is not None and sent + len(piece) >= cut_at:
                piece = piece[: cut_at - sent]
                self.wfile.write(pending + (_chunk(piece) if rechunk else piece))
                self.close_connection = True
                return False
            if not piece:
                break
            if corrupt:
                piece, corrupt = next(_flip_one_byte(iter([piece]))), False
            self.wfile.write(pending + (_chunk(piece) if rechunk else piece))
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
