"""A GCS-like front for the emulator: real HTTP with added latency, bandwidth caps, faults and counts.

The emulator answers at once and never fails; real GCS is tens of milliseconds away, throttles,
resets connections and sometimes stops answering. ``GCSFront`` is a small HTTP/1.1 server on
loopback that forwards every request to an upstream endpoint (the emulator) and adds exactly those
behaviours, so clients can be tested and measured against them over real sockets.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.request
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from .._ops.paging import MAX_PAGE_SIZE
from ._faults import Fault
from ._folders import Folders
from ._gcs_rules import GCSRules
from ._handler import FrontHandler
from ._list_index import ListingIndex, ListingSnapshots
from ._multipart import MIN_PART_SIZE, MultipartUploads
from ._patches import MetadataPatches
from ._process import LocalService
from ._rate_ramp import RateRamp
from ._request_log import RecordedRequest, RequestLog
from ._server import CompletionAnswer, FrontServer
from ._soft_delete import BucketOverlay
from ._upstream import UpstreamLink
from ._versions import Versions

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["GCSFront"]


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

    Examples:
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
        self._server: FrontServer | None = None
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
            server = FrontServer(
                ("127.0.0.1", 0),
                FrontHandler,
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
