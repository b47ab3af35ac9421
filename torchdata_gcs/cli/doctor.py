"""``torchdata-gcs doctor``: check a bucket for everything torchdata-gcs relies on, with the user's own credentials.

It reads the bucket's settings, then makes, in a scratch folder under the prefix, the requests the library's
features make (list, conditional create, read, compose, XML multipart upload, delete), and says for each what a
failure means for which feature. Everything it wrote is deleted at the end, on Ctrl-C too.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import secrets
import statistics
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._engines.listing import list_objects
from .._engines.upload import MIN_PART_SIZE, MultipartWriter
from .._ops.checksums import crc32c_base64
from .._ops.client import Client
from .._ops.objects import TEMPORARY_CLASS, delete_folder, storage_layout
from .._ops.paging import MAX_PAGE_SIZE
from .._ops.uploads import abort_upload, unfinished_uploads
from .._ops.urls import format_url, parse_url
from .._transport.session import Session
from ..config import ClientConfig, RetryConfig
from ..errors import (
    AccessDeniedError,
    EndpointError,
    GCSError,
    NoMultipartListing,
    NotFoundError,
    PreconditionFailedError,
    TransientError,
    UploadError,
)
from .lifecycle_rules import describe_rule, lifecycle_file, missing_rules
from .sizes import human_size

__all__ = ["CHECKS", "RETRY", "SCRATCH_MARK", "Check", "Fact", "Report", "bucket_settings", "doctor"]

T = TypeVar("T")

SCRATCH_MARK = ".torchdata-gcs-doctor-"
"""The scratch folder is ``<prefix>.torchdata-gcs-doctor-<random>/``; nothing outside it is written."""

RETRY = RetryConfig(max_attempts=3, deadline=10.0, initial_delay=0.2, max_delay=2.0)
"""Short retries and timeouts: a dead endpoint fails in seconds, not minutes."""
CONNECT_TIMEOUT, READ_TIMEOUT = 5.0, 20.0

OK, REFUSED, MISSING, FAILED, SKIPPED = "OK", "REFUSED", "MISSING", "FAILED", "SKIPPED"
SAMPLE_SIZE = 4 * 1024 * 1024  # the throughput sample, each way
MULTIPART_SIZE = MIN_PART_SIZE + 256 * 1024  # two parts: the writer sends a part only once more bytes follow it
LATENCY_REQUESTS = 5
_UPLOADS_LOOKED_AT = 1000  # one page of the bucket's unfinished uploads
_BUCKET_FIELDS = (
    "location,locationType,billing/requesterPays,softDeletePolicy/retentionDurationSeconds,"
    "retentionPolicy,versioning/enabled,hierarchicalNamespace/enabled,storageClass,autoclass,defaultEventBasedHold,"
    "lifecycle"
)
_UNKNOWN = "unknown (no storage.buckets.get)"

CHECKS = (
    "list",
    "write",
    "precondition",
    "read",
    "compose",
    "XML multipart upload",
    "upload listing",
    "delete",
    "latency",
    "throughput",
)
"""The table's rows, in order."""

_CONSEQUENCE = {  # check -> (what a failure means, the permission a refusal points to)
    "list": ("list_files_by_gcs, `torchdata-gcs ls`, `bench` and `clean` cannot list here", "storage.objects.list"),
    "write": (
        (
            "checkpoints, save_by_gcs, the DCP writer, list_files_by_gcs(manifest=...) and compose_shards_by_gcs's "
            "composites cannot write here"
        ),
        "storage.objects.create",
    ),
    "precondition": (
        (
            "the shared listing lock (list_files_by_gcs(manifest=...)) and overwrite=False rely on a create of an "
            "existing name with ifGenerationMatch=0 being refused (412): here two jobs could both take the lock and an "
            "existing checkpoint could be replaced"
        ),
        "storage.objects.delete, which replacing an object needs",
    ),
    "read": (
        "load_files_by_gcs, compose_shards_by_gcs, checkpoint.load and the DCP reader cannot read here",
        "storage.objects.get",
    ),
    "compose": (
        (
            "compose_shards_by_gcs loads objects one by one instead (ComposeFallbackWarning), and checkpoints "
            'cannot use strategy="compose"'
        ),
        "storage.objects.create and storage.objects.get",
    ),
    "XML multipart upload": (
        (
            'checkpoint saves with the default strategy="multipart" (checkpoint.save, save_by_gcs, the DCP writer, '
            'Lightning) fail here: use strategy="compose"'
        ),
        "storage.multipartUploads.create",
    ),
    "upload listing": (
        (
            "`torchdata-gcs clean` cannot find and abort the multipart uploads killed jobs leave, billed until aborted "
            "(a lifecycle rule abortIncompleteMultipartUpload removes them too)"
        ),
        "storage.multipartUploads.list",
    ),
    "delete": (
        (
            'compose_shards_by_gcs loads directly instead of composing, strategy="compose" leaves its parts, '
            "overwriting a checkpoint fails and `torchdata-gcs clean` deletes nothing"
        ),
        "storage.objects.delete",
    ),
    "latency": ("small metadata requests fail here", "storage.objects.get"),
    "throughput": ("writing or reading a few MiB in one request fails here", "storage.objects.create and .get"),
}
_UNEXPECTED_412 = (
    "a create of a new name was refused with 412 although its precondition (ifGenerationMatch=0) holds: every "
    "conditional write fails here (listing lock, overwrite=False, temporary composites); look for a proxy on the way"
)

_RETAINED = (
    "the bucket's retention policy keeps every object until it ages out: compose_shards_by_gcs and "
    'strategy="compose" leave billed temporary objects, checkpoints cannot be overwritten; use load_files_by_gcs '
    "and multipart checkpoints here"
)
_HELD = (
    "the bucket's default event-based hold keeps every new object until its hold is released: compose_shards_by_gcs's "
    'composites and strategy="compose" parts pile up, billed, and checkpoints cannot be overwritten; turn the default '
    "hold off, or use load_files_by_gcs and multipart checkpoints here"
)
_MINIMUM_DAYS = {"NEARLINE": 30, "COLDLINE": 90, "ARCHIVE": 365}
"""Minimum storage duration of each cold class: an object deleted or replaced sooner is billed the rest."""


@dataclass(frozen=True)
class Check:
    """One row of the table: what was checked, how it went (OK, REFUSED, MISSING, FAILED, SKIPPED), and detail."""

    name: str
    result: str
    detail: str
    consequence: str = ""  # what a result other than OK means for the library's features


@dataclass(frozen=True)
class Fact:
    """One bucket setting: its value and what it means for composites, checkpoints and ``clean``."""

    name: str
    value: str
    meaning: str = ""


@dataclass
class Report:
    """What ``doctor`` found; ``exit_code`` is 0 when everything the library needs works."""

    url: str
    scratch: str
    endpoint: str = ""
    identity: str = ""
    facts: list[Fact] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    deleted: int = 0
    left_behind: list[str] = field(default_factory=list)
    interrupted: bool = False
    lifecycle: dict[str, Any] | None = None  # the lifecycle configuration to set, when rules for leftovers are missing

    @property
    def findings(self) -> list[str]:
        """One line per problem: each check that did not pass, then anything that could not be removed."""
        found = [
            f"{check.name} {check.result}: {check.consequence}"
            for check in self.checks
            if check.result in (REFUSED, MISSING, FAILED)
        ]
        if self.left_behind:
            found.append(f"cleanup: {len(self.left_behind)} scratch item(s) could not be removed (listed above)")
        return found

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else 1 if self.findings else 0

    def result(self, name: str) -> str | None:
        return next((check.result for check in self.checks if check.name == name), None)


def doctor(
    url: str,
    *,
    client: ClientConfig | None = None,
    say: Callable[[str], None] = lambda line: None,
    sample_size: int = SAMPLE_SIZE,
) -> Report:
    """Check ``url``'s bucket (``gs://bucket/prefix/``) through ``client`` (its timeouts replaced by short ones) and
    return the report; ``say`` is given each line of it as it is known. Ctrl-C (``KeyboardInterrupt``) stops the checks,
    cleans up and returns a report marked ``interrupted``. A bucket that does not exist or an endpoint that cannot be
    reached raises its ``GCSError``."""
    client = dataclasses.replace(client or ClientConfig(), connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT)
    run = _Run(url, client, say, sample_size)
    try:
        run.introduce()
        try:
            run.check_all()
        except KeyboardInterrupt:
            run.report.interrupted = True
            say(
                f"interrupted after {len(run.report.checks)} of {len(CHECKS)} checks: cleaning up (Ctrl-C again "
                "leaves the scratch objects behind)"
            )
    finally:
        run.clean_up()
    run.conclude()
    return run.report


class _Run:
    """One doctor run: its scratch names, what it wrote, and the report as it grows."""

    def __init__(self, url: str, client: ClientConfig, say: Callable[[str], None], sample_size: int) -> None:
        self.bucket, name = parse_url(url)
        # A name that does not end in "/" is a folder too, as list_files_by_gcs reads it.
        prefix = name if not name or name.endswith("/") else name + "/"
        self.prefix = prefix
        self.scratch = f"{prefix}{SCRATCH_MARK}{secrets.token_hex(4)}/"
        self.client = client
        self.objects = Client(client, RETRY)
        self.say = say
        self.sample_size = sample_size
        self.report = Report(url=format_url(self.bucket, prefix), scratch=format_url(self.bucket, self.scratch))
        self.written: dict[str, int | None] = {}  # every scratch name a write was sent for -> its generation, if known
        self.contents: dict[str, bytes] = {}  # what each name should hold now
        self.writer: MultipartWriter | None = None
        self.upload_may_be_open = False
        self.hierarchical: bool | None = None  # known from the bucket's settings
        self.retained = False  # the bucket has a retention policy
        self.held = False  # the bucket holds every new object (default event-based hold)
        self.resource: dict[str, Any] | None = None  # the bucket's settings, if they could be read
        self.unread = "reading them needs storage.buckets.get"  # why not, if they could not

    # -- header ----------------------------------------------------------------------------------

    def introduce(self) -> None:
        report, say = self.report, self.say
        report.endpoint = self.objects.session.endpoint
        report.identity = _identity(self.objects.session)
        say(f"endpoint  {report.endpoint}")
        say(f"identity  {report.identity}")
        if self.client.user_project:
            say(f"billed to {self.client.user_project} (requester pays)")
        say(f"scratch   {report.scratch} (deleted at the end)")
        report.facts = self.bucket_facts()
        say("")
        say(f"bucket gs://{self.bucket}")
        width = max(len(fact.name) for fact in report.facts) + 2
        values = max(len(fact.value) for fact in report.facts) + 2
        for fact in report.facts:
            say(f"  {fact.name:<{width}}{fact.value:<{values}}{fact.meaning}".rstrip())
        self.advise_lifecycle()
        say("")
        say(f"{'check':<{_CHECK_WIDTH}}{'result':<{_RESULT_WIDTH}}detail")

    def bucket_facts(self) -> list[Fact]:
        """The settings that change what temporary objects and overwrites cost; unknown without storage.buckets.get.
        A missing bucket or an unreachable endpoint raises: nothing else could work."""
        try:
            resource = self.objects.bucket(self.bucket, _BUCKET_FIELDS)
        except AccessDeniedError:
            return self.layout_facts()
        except (NotFoundError, TransientError, EndpointError):
            raise
        except GCSError as exc:  # such as a requester-pays bucket asked without a user project
            self.unread = f"the bucket's settings could not be read ({_one_line(exc)})"
            return [Fact(name, f"unknown ({_one_line(exc)})") for name in _FACT_NAMES]
        self.resource = resource
        self.hierarchical = bool((resource.get("hierarchicalNamespace") or {}).get("enabled"))
        self.retained = bool(resource.get("retentionPolicy"))
        self.held = bool(resource.get("defaultEventBasedHold"))
        return bucket_settings(resource, self.client.user_project)

    def advise_lifecycle(self) -> None:
        """Print the lifecycle configuration that adds the rules for torchdata-gcs's leftovers the bucket lacks."""
        if self.resource is None:
            self.say(f"lifecycle rules not checked: {self.unread}")
            return
        current = self.resource.get("lifecycle")
        missing = missing_rules(current)
        if not missing:
            return
        self.report.lifecycle = lifecycle_file(current, missing)
        self.say("")
        self.say(
            "lifecycle rules to add, so that GCS itself removes what killed jobs leave (billed until removed): "
            + "; ".join(describe_rule(rule) for rule in missing)
        )
        self.say(
            "save this as lifecycle.json (the bucket's own rules are in it: the file replaces them) and run "
            f"`gcloud storage buckets update gs://{self.bucket} --lifecycle-file=lifecycle.json`:"
        )
        self.say(json.dumps(self.report.lifecycle, indent=2))

    def layout_facts(self) -> list[Fact]:
        """Without storage.buckets.get, the location and namespace from the storage layout (storage.objects.list
        suffices: object roles hold it); the other settings unknown."""
        try:
            layout = self.objects.run(storage_layout, self.bucket)
        except GCSError:
            return [Fact(name, _UNKNOWN) for name in _FACT_NAMES]
        self.hierarchical = bool((layout.get("hierarchicalNamespace") or {}).get("enabled"))
        known = {fact.name: fact for fact in bucket_settings(layout, self.client.user_project)}
        return [known[name] if name in _LAYOUT_FACTS else Fact(name, _UNKNOWN) for name in _FACT_NAMES]

    # -- checks ----------------------------------------------------------------------------------

    def check_all(self) -> None:
        self.check_list()
        written = self.check_write()
        self.check_precondition(written)
        self.check_read(written)
        self.check_compose()
        self.check_multipart()
        self.check_delete()
        self.check_latency()
        self.check_throughput()

    def add(self, name: str, result: str, detail: str, consequence: str | None = None) -> None:
        if consequence is None:
            consequence, permission = _CONSEQUENCE[name]
            if result == REFUSED:
                consequence += f" (needs {permission})"
        self.report.checks.append(Check(name, result, detail, consequence))
        self.say(f"{name:<{_CHECK_WIDTH}}{result:<{_RESULT_WIDTH}}{detail}".rstrip())

    def failed(self, name: str, exc: BaseException) -> None:
        self.add(name, _result_of(exc), _one_line(exc))

    def create(self, name: str, data: bytes) -> int:
        """Create scratch object ``name`` only if it does not exist (``ifGenerationMatch=0``); its generation."""
        self.written.setdefault(name, None)  # before sending: a write whose answer is lost still gets deleted
        generation = self.objects.create(self.bucket, name, data, if_generation_match=0, storage_class=TEMPORARY_CLASS)
        self.written[name], self.contents[name] = generation, data
        return generation

    def check_list(self) -> None:
        try:
            with closing(list_objects(self.objects, self.bucket, self.prefix, page_size=10)) as pages:
                first = next(pages, [])
        except Exception as exc:  # noqa: BLE001 - each check reports its own failure
            self.failed("list", exc)
            return
        self.add(
            "list", OK, f"listed under {self.report.url}: {len(first)} object(s) on the first page (maxResults=10)"
        )

    def check_write(self) -> str | None:
        name = self.scratch + "write"
        try:
            generation = self.create(name, b"torchdata-gcs doctor\n" * 50)
        except PreconditionFailedError as exc:
            self.add("write", FAILED, _one_line(exc), _UNEXPECTED_412)
            return None
        except Exception as exc:  # noqa: BLE001
            self.failed("write", exc)
            return None
        self.add("write", OK, f"created {name.rpartition('/')[2]} (generation {generation}) with ifGenerationMatch=0")
        return name

    def check_precondition(self, written: str | None) -> None:
        if written is None:
            self.add("precondition", SKIPPED, "needs the object of the write check")
            return
        try:
            generation = self.objects.create(
                self.bucket, written, b"replaced\n", if_generation_match=0, storage_class=TEMPORARY_CLASS
            )
        except PreconditionFailedError:
            self.add("precondition", OK, "a second create of the same name with ifGenerationMatch=0 was refused (412)")
            return
        except Exception as exc:  # noqa: BLE001
            self.failed("precondition", exc)
            return
        self.written[written], self.contents[written] = generation, b"replaced\n"
        self.add(
            "precondition", FAILED, "a second create of the same name with ifGenerationMatch=0 replaced the object"
        )

    def check_read(self, written: str | None) -> None:
        if written is None:
            self.add("read", SKIPPED, "needs the object of the write check")
            return
        try:
            data = self.objects.read(self.bucket, written)
        except Exception as exc:  # noqa: BLE001
            self.failed("read", exc)
            return
        if data is None:
            self.add("read", FAILED, "the object just written was not found (404)")
        elif data != self.contents[written]:
            self.add(
                "read", FAILED, f"read {len(data):,} bytes that differ from the {len(self.contents[written]):,} written"
            )
        else:
            self.add("read", OK, f"read {len(data):,} bytes back, equal to those written, crc32c checked")

    def check_compose(self) -> None:
        sources = [(f"{self.scratch}compose-source-{n}", f"part {n} of a composite\n".encode() * 20) for n in (1, 2)]
        try:
            pinned = [(name, self.create(name, data)) for name, data in sources]
        except Exception as exc:  # noqa: BLE001
            self.add("compose", SKIPPED, f"could not write its sources: {_one_line(exc)}")
            return
        name = self.scratch + "composite"
        expected = b"".join(data for _, data in sources)
        self.written.setdefault(name, None)
        try:
            info = self.objects.compose(self.bucket, name, pinned, if_generation_match=0)
        except Exception as exc:  # noqa: BLE001
            self.failed("compose", exc)
            return
        self.written[name], self.contents[name] = info.generation, expected
        if info.size != len(expected) or info.crc32c not in (None, crc32c_base64(expected)):
            self.add("compose", FAILED, f"the composite has {info.size:,} bytes, crc32c {info.crc32c}: not its sources")
            return
        checked = "" if info.crc32c is None else ", crc32c as expected"
        self.add(
            "compose", OK, f"2 sources (pinned to their generations) -> 1 composite of {info.size:,} bytes{checked}"
        )

    def check_multipart(self) -> None:
        name = self.scratch + "multipart"
        url = format_url(self.bucket, name)
        writer = self.writer = MultipartWriter(url, client=self.objects, part_size=MIN_PART_SIZE, max_parts_in_flight=2)
        self.written.setdefault(name, None)
        payload = os.urandom(MULTIPART_SIZE)
        self.upload_may_be_open = True
        try:
            writer.write(payload)  # starts the upload and sends the first part; close() sends the last and completes
        except Exception as exc:  # noqa: BLE001 - the writer aborted what it started
            self.upload_may_be_open = False
            result = MISSING if self.xml_api_missing(exc) else _result_of(exc)
            detail = _one_line(exc)
            if result == MISSING:
                detail = f"the endpoint serves no XML API multipart uploads ({detail})"
            self.add("XML multipart upload", result, detail)
            self.add(*self.upload_listing())
            return
        listing = self.upload_listing()  # while this upload is open
        try:
            writer.close()
        except Exception as exc:  # noqa: BLE001 - close() aborted the upload (and says so in the log if it could not)
            self.failed("XML multipart upload", exc)
        else:
            self.upload_may_be_open = False
            self.written[name], self.contents[name] = writer.generation, payload
            self.add(
                "XML multipart upload",
                OK,
                f"initiated, 2 parts ({human_size(MIN_PART_SIZE)} + {human_size(MULTIPART_SIZE - MIN_PART_SIZE)}), "
                "completed; crc32c as written",
            )
        self.add(*listing)

    def xml_api_missing(self, exc: Exception) -> bool:
        """Whether starting a multipart upload failed because the endpoint lacks the XML API (an emulator), rather
        than for want of permission: the JSON API writes here, and the start was answered as an unknown request."""
        if self.report.result("write") != OK or isinstance(exc, AccessDeniedError):
            return False
        if isinstance(exc, UploadError) and exc.status is None:  # answered without an upload ID
            return True
        return isinstance(exc, GCSError) and exc.status in (400, 404, 405, 501)

    def upload_listing(self) -> tuple[str, str, str]:
        """The upload-listing row: can the bucket's unfinished multipart uploads be listed, as ``clean`` lists them?"""
        try:
            with closing(unfinished_uploads(self.objects, self.bucket)) as uploads:
                found = list(itertools.islice(uploads, _UPLOADS_LOOKED_AT))
        except NoMultipartListing as exc:
            return "upload listing", MISSING, f"the endpoint lists no multipart uploads ({_one_line(exc)})"
        except Exception as exc:  # noqa: BLE001
            return "upload listing", _result_of(exc), _one_line(exc)
        others = [upload for upload in found if not upload.name.startswith(self.scratch)]
        more = "+" if len(found) == _UPLOADS_LOOKED_AT else ""
        hint = " (`torchdata-gcs clean` aborts old ones)" if others else ""
        return (
            "upload listing",
            OK,
            f"listed; {len(others)}{more} unfinished upload(s) in the bucket besides this check's{hint}",
        )

    def check_latency(self) -> None:
        name = next((name for name in self.contents), self.scratch + "write")
        seconds = []
        try:
            for _ in range(LATENCY_REQUESTS):
                started = time.perf_counter()
                self.objects.head(self.bucket, name, "generation")
                seconds.append(time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001
            self.failed("latency", exc)
            return
        median, low, high = (1000 * value for value in (statistics.median(seconds), min(seconds), max(seconds)))
        self.add(
            "latency",
            OK,
            f"median {median:.0f} ms of {LATENCY_REQUESTS} metadata requests (min {low:.0f}, max {high:.0f})",
        )

    def check_throughput(self) -> None:
        name = self.scratch + "throughput"
        data = os.urandom(self.sample_size)
        try:
            started = time.perf_counter()
            self.create(name, data)
            uploaded = time.perf_counter() - started
            started = time.perf_counter()
            back = self.objects.read(self.bucket, name)
            downloaded = time.perf_counter() - started
        except Exception as exc:  # noqa: BLE001
            self.failed("throughput", exc)
            return
        if back != data:
            self.add("throughput", FAILED, "the bytes read back differ from those written")
            return
        self.add(
            "throughput",
            OK,
            f"upload {_rate(len(data), uploaded)}, download {_rate(len(data), downloaded)} "
            f"({human_size(len(data))} in one request each way; `torchdata-gcs bench` measures loading)",
        )

    def check_delete(self) -> None:
        name = next((name for name in self.contents), None)
        if name is None:
            self.add("delete", SKIPPED, "nothing was written to delete")
            return
        generation = self.written[name]
        try:
            gone = self.objects.delete(self.bucket, name, generation=generation)
        except Exception as exc:  # noqa: BLE001
            if (self.retained or self.held) and _result_of(exc) == REFUSED:
                self.add("delete", REFUSED, _one_line(exc), _HELD if self.held else _RETAINED)
            else:
                self.failed("delete", exc)
            return
        del self.written[name], self.contents[name]
        if not gone:
            self.add("delete", FAILED, f"{name.rpartition('/')[2]}, just written, was already gone (404)")
            return
        self.add("delete", OK, f"deleted {name.rpartition('/')[2]} by its generation ({generation})")

    # -- the end ---------------------------------------------------------------------------------

    def clean_up(self) -> None:
        """Remove everything this run wrote (scratch objects, an open multipart upload, an HNS folder); what cannot
        be removed is reported."""
        if not self.written and self.writer is None:
            return
        report = self.report
        if self.writer is not None and not self.writer.closed:
            self.writer.abort()
        names, listed = dict.fromkeys(self.written), self.listed_scratch()
        names.update(dict.fromkeys(listed or []))
        for name in names:
            try:
                if self.objects.delete(self.bucket, name, generation=self.written.get(name)):
                    report.deleted += 1
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the rest still gets deleted
                report.left_behind.append(f"{format_url(self.bucket, name)} ({_one_line(exc)})")
        if self.upload_may_be_open:
            self.abort_scratch_uploads()
        if self.hierarchical:
            self.delete_scratch_folder()
        if listed is not None:  # a write still landing after the deletes shows up here
            reported = {line.partition(" ")[0] for line in report.left_behind}
            for name in self.listed_scratch() or []:
                if format_url(self.bucket, name) not in reported:
                    report.left_behind.append(f"{format_url(self.bucket, name)} (still there after deleting)")

    def listed_scratch(self) -> list[str] | None:
        """Names under the scratch folder, or ``None`` if they cannot be listed (the known names are deleted then)."""
        try:
            return [
                item["name"]
                for batch in list_objects(self.objects, self.bucket, self.scratch, MAX_PAGE_SIZE)
                for _, item in batch
            ]
        except Exception:  # noqa: BLE001
            return None

    def abort_scratch_uploads(self) -> None:
        """Abort any multipart upload under the scratch folder still open (a start interrupted before its answer)."""
        try:
            with closing(unfinished_uploads(self.objects, self.bucket, prefix=self.scratch)) as uploads:
                ours = list(uploads)
        except NoMultipartListing:
            return
        except Exception as exc:  # noqa: BLE001
            self.report.left_behind.append(
                f"maybe an unfinished multipart upload of {format_url(self.bucket, self.scratch)}multipart "
                f"(could not list uploads: {_one_line(exc)})"
            )
            return
        for upload in ours:
            try:
                self.objects.run(abort_upload, self.bucket, upload)
            except Exception as exc:  # noqa: BLE001
                self.report.left_behind.append(
                    f"{format_url(self.bucket, upload.name)} multipart upload {upload.upload_id} ({_one_line(exc)})"
                )

    def delete_scratch_folder(self) -> None:
        """With a hierarchical namespace, objects' folders outlive them: delete the scratch folder too."""
        url = format_url(self.bucket, self.scratch)
        try:
            self.objects.run(delete_folder, self.bucket, self.scratch)
        except Exception as exc:  # noqa: BLE001
            self.report.left_behind.append(f"{url} (empty folder: {_one_line(exc)})")

    def conclude(self) -> None:
        report, say = self.report, self.say
        say("")
        for line in report.left_behind:
            say(f"could not remove {line}")
        removed = f"deleted {report.deleted} scratch object(s)"
        say(
            f"cleanup: {removed}; {len(report.left_behind)} item(s) left behind"
            if report.left_behind
            else f"cleanup: {removed}, nothing left behind"
        )
        if report.interrupted:
            say(f"verdict: interrupted after {len(report.checks)} of {len(CHECKS)} checks")
            return
        findings = report.findings
        for finding in findings:
            say(f"problem: {finding}")
        if findings:
            names = [
                f"{check.name} {check.result}" for check in report.checks if check.result in (REFUSED, MISSING, FAILED)
            ]
            names += ["cleanup incomplete"] if report.left_behind else []
            say(f"verdict: {len(findings)} problem(s) in {report.url}: {', '.join(names)}")
        else:
            say(f"verdict: OK, everything torchdata-gcs relies on works in {report.url}")


_CHECK_WIDTH = max(len(name) for name in CHECKS) + 2
_RESULT_WIDTH = max(len(result) for result in (OK, REFUSED, MISSING, FAILED, SKIPPED)) + 2
_FACT_NAMES = (
    "location",
    "requester pays",
    "soft delete",
    "retention policy",
    "object versioning",
    "hierarchical namespace",
    "default storage class",
    "autoclass",
    "event-based hold",
    "lifecycle",
)


_LAYOUT_FACTS = ("location", "hierarchical namespace")
"""What a bucket's storage layout tells."""


def bucket_settings(resource: dict[str, Any], user_project: str | None) -> list[Fact]:
    """The bucket settings ``resource`` reports, each with what it means for this library."""
    location = resource.get("location", "?")
    kind = resource.get("locationType")
    facts = [
        Fact(
            "location",
            f"{location} ({kind})" if kind else str(location),
            "run jobs in this location: reads from elsewhere add latency and network egress charges",
        )
    ]
    if (resource.get("billing") or {}).get("requesterPays"):
        billed = (
            f"billed to {user_project}"
            if user_project
            else "pass --user-project here, ClientConfig(user_project=...) in code"
        )
        facts.append(
            Fact(
                "requester pays",
                "on",
                f"every request, composes and clean's included, is billed to the requester: {billed}",
            )
        )
    else:
        facts.append(Fact("requester pays", "off", "requests are billed to the bucket's project"))
    soft = resource.get("softDeletePolicy")
    if soft is None:
        facts.append(Fact("soft delete", "not reported"))
    elif int(soft.get("retentionDurationSeconds", 0)):
        days = _duration(int(soft["retentionDurationSeconds"]))
        facts.append(
            Fact(
                "soft delete",
                days,
                f"every deleted temporary object (compose_shards_by_gcs's composites, listing locks, what clean "
                f"deletes) and every overwritten checkpoint stays billed {days} after deletion; "
                'strategy="compose" parts are not: each compose deletes its sources for good',
            )
        )
    else:
        facts.append(Fact("soft delete", "off", "deleted temporary objects stop costing at once"))
    retention = resource.get("retentionPolicy")
    if retention:
        value = _duration(int(retention.get("retentionPeriod", 0))) + (", locked" if retention.get("isLocked") else "")
        facts.append(
            Fact(
                "retention policy",
                value,
                "objects cannot be deleted or replaced until they age out: compose_shards_by_gcs and "
                'strategy="compose" leave billed temporary objects, checkpoints cannot be overwritten, '
                "clean deletes nothing younger; "
                "use load_files_by_gcs and multipart checkpoints",
            )
        )
    else:
        facts.append(Fact("retention policy", "none", "temporary objects can be deleted at once"))
    if (resource.get("versioning") or {}).get("enabled"):
        facts.append(
            Fact(
                "object versioning",
                "on",
                "every overwritten checkpoint stays as a noncurrent version, billed until a lifecycle rule "
                "removes it; temporary objects are deleted by generation and leave none",
            )
        )
    else:
        facts.append(Fact("object versioning", "off", "overwrites and deletes leave no noncurrent versions"))
    if (resource.get("hierarchicalNamespace") or {}).get("enabled"):
        facts.append(
            Fact(
                "hierarchical namespace",
                "on",
                "folders outlive their objects: each job's .torchdata-gcs-tmp/<job>/ folder stays behind empty (clean "
                "deletes objects, not folders) and empty folders slow listings",
            )
        )
    else:
        facts.append(Fact("hierarchical namespace", "off", "no folders to clean up"))
    return facts + _cost_facts(resource)


def _cost_facts(resource: dict[str, Any]) -> list[Fact]:
    """What the bucket's storage class, Autoclass, default hold and lifecycle rules cost the library's objects."""
    autoclass = resource.get("autoclass") or {}
    storage_class = resource.get("storageClass")
    days = _MINIMUM_DAYS.get(str(storage_class).upper())
    if storage_class is None:
        facts = [Fact("default storage class", "not reported")]
    elif autoclass.get("enabled"):
        facts = [Fact("default storage class", str(storage_class), "Autoclass picks each object's class (below)")]
    elif days:
        meaning = (
            f"objects written without a class (checkpoints, say) take it: each is billed {days} days at least, so "
            "one overwritten or deleted sooner pays the rest as an early-deletion charge, and reads pay retrieval "
            "fees; torchdata-gcs writes its own temporary objects as Standard"
        )
        facts = [Fact("default storage class", str(storage_class), meaning)]
    else:
        facts = [
            Fact(
                "default storage class",
                str(storage_class),
                "no minimum storage duration: overwrites and deletes cost nothing extra",
            )
        ]
    if autoclass.get("enabled"):
        terminal = autoclass.get("terminalStorageClass", "NEARLINE")
        meaning = (
            f"objects not read for 30 days move to colder classes, down to {terminal}, without early-deletion or "
            "retrieval charges; compose_shards_by_gcs composes objects of one class only (Standard by default) and "
            "loads colder ones directly"
        )
        facts.append(Fact("autoclass", f"on, down to {terminal}", meaning))
    else:
        facts.append(Fact("autoclass", "off", "objects keep the class they were written with"))
    if resource.get("defaultEventBasedHold"):
        meaning = (
            "every new object, torchdata-gcs's temporary objects included, is held, undeletable until its hold is "
            'released: compose_shards_by_gcs\'s composites and strategy="compose" parts pile up, billed; turn the '
            "default hold off, or use load_files_by_gcs and multipart checkpoints (each leaves one small marker)"
        )
        facts.append(Fact("event-based hold", "on", meaning))
    else:
        facts.append(Fact("event-based hold", "off", "new objects can be deleted at once"))
    lifecycle = resource.get("lifecycle")
    rules = (lifecycle or {}).get("rule") or []
    listed = "".join(f"{describe_rule(rule)}; " for rule in rules)
    if missing_rules(lifecycle):
        meaning = f"{listed}missing: the rules that remove torchdata-gcs's leftovers (below)"
    else:
        meaning = f"{listed}covers torchdata-gcs's temporary objects and unfinished multipart uploads"
    count = f"{len(rules)} rule{'s' if len(rules) != 1 else ''}" if rules else "none"
    facts.append(Fact("lifecycle", count, meaning))
    return facts


def _identity(session: Session) -> str:
    """Who the requests go out as: a service account's email, a user's account, else the credential type."""
    if session.anonymous:
        return "anonymous"
    try:
        session.authorization()  # refreshes the token; a metadata-server identity learns its email here
    except GCSError:
        raise
    except Exception as exc:  # noqa: BLE001 - the token endpoint could not be reached, say
        raise GCSError(f"could not get an access token: {type(exc).__name__}: {exc}") from None
    credentials = session.credentials
    if credentials is None:
        return "credentials of an unknown kind"
    email = getattr(credentials, "service_account_email", None)
    if isinstance(email, str) and "@" in email:
        return f"{email} (service account)"
    account = getattr(credentials, "account", None)
    if isinstance(account, str) and "@" in account:
        return f"{account} (user account)"
    kind = type(credentials)
    return f"{kind.__module__}.{kind.__qualname__}"


def _result_of(exc: BaseException) -> str:
    """REFUSED for a 401/403 (the error or what it wraps), else FAILED."""
    refused = isinstance(exc, AccessDeniedError) or isinstance(exc.__cause__, AccessDeniedError)
    return REFUSED if refused else FAILED


def _one_line(exc: BaseException) -> str:
    """The error's first line, without the URL it names (the row or line it goes in names the object)."""
    text = str(exc).strip()
    url = getattr(exc, "url", None)
    if url:
        text = text.replace(f" ({url})", "")
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _rate(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e6:,.1f} MB/s" if seconds > 0 else "-"


def _duration(seconds: int) -> str:
    """``seconds`` in days, hours or seconds, whichever is whole.

    >>> _duration(604800), _duration(7200), _duration(90)
    ('7 days', '2 hours', '90 seconds')
    """
    for unit, size in (("day", 86400), ("hour", 3600)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"
