"""The checks ``doctor`` makes in a scratch folder under the prefix: the requests the library's features make
(list, conditional create, read, compose, XML multipart upload, delete, and a latency and throughput sample),
each told with what a failure means for which feature, and the cleanup of everything they wrote."""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable
from contextlib import closing

from .._engines.listing import list_objects
from .._engines.upload import MIN_PART_SIZE, MultipartWriter
from .._ops.checksums import crc32c_base64
from .._ops.client import Client
from .._ops.objects import TEMPORARY_CLASS, delete_folder
from .._ops.paging import MAX_PAGE_SIZE
from .._ops.uploads import abort_upload, unfinished_uploads
from .._ops.urls import format_url
from ..errors import AccessDeniedError, GCSError, NoMultipartListing, PreconditionFailedError, UploadError
from .doctor_report import FAILED, MISSING, OK, REFUSED, SKIPPED, Check, Report, one_line, table_row
from .sizes import human_size

__all__ = ["SAMPLE_SIZE", "ScratchChecks"]

SAMPLE_SIZE = 4 * 1024 * 1024  # the throughput sample, each way
MULTIPART_SIZE = MIN_PART_SIZE + 256 * 1024  # two parts: the writer sends a part only once more bytes follow it
LATENCY_REQUESTS = 5
_UPLOADS_LOOKED_AT = 1000  # one page of the bucket's unfinished uploads

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
            'Lightning) cannot use it: refused, they fail (use strategy="compose"); missing (an emulator), they '
            'write as strategy="compose" does'
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


class ScratchChecks:
    """The checks, made in a scratch folder as the library's features make their requests, each told in a row of
    ``report`` (and to ``say``) with what a failure means; and the removal of everything they wrote."""

    def __init__(
        self,
        objects: Client,
        bucket: str,
        prefix: str,
        scratch: str,
        report: Report,
        say: Callable[[str], None],
        sample_size: int,
    ) -> None:
        self.objects = objects
        self.bucket = bucket
        self.prefix = prefix
        self.scratch = scratch
        self.report = report
        self.say = say
        self.sample_size = sample_size
        self.written: dict[str, int | None] = {}  # every scratch name a write was sent for -> its generation, if known
        self.contents: dict[str, bytes] = {}  # what each name should hold now
        self.writer: MultipartWriter | None = None
        self.upload_may_be_open = False
        # What the bucket's settings say, set once they are read (the defaults where they cannot be):
        self.hierarchical: bool | None = None
        self.retained = False  # the bucket has a retention policy
        self.held = False  # the bucket holds every new object (default event-based hold)

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
        self.say(table_row(name, result, detail))

    def failed(self, name: str, exc: BaseException) -> None:
        self.add(name, _result_of(exc), one_line(exc))

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
            self.add("write", FAILED, one_line(exc), _UNEXPECTED_412)
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
            self.add("compose", SKIPPED, f"could not write its sources: {one_line(exc)}")
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
            detail = one_line(exc)
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
            return "upload listing", MISSING, f"the endpoint lists no multipart uploads ({one_line(exc)})"
        except Exception as exc:  # noqa: BLE001
            return "upload listing", _result_of(exc), one_line(exc)
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
                self.add("delete", REFUSED, one_line(exc), _HELD if self.held else _RETAINED)
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
                report.left_behind.append(f"{format_url(self.bucket, name)} ({one_line(exc)})")
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
                for item in batch
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
                f"(could not list uploads: {one_line(exc)})"
            )
            return
        for upload in ours:
            try:
                self.objects.run(abort_upload, self.bucket, upload)
            except Exception as exc:  # noqa: BLE001
                self.report.left_behind.append(
                    f"{format_url(self.bucket, upload.name)} multipart upload {upload.upload_id} ({one_line(exc)})"
                )

    def delete_scratch_folder(self) -> None:
        """With a hierarchical namespace, objects' folders outlive them: delete the scratch folder too."""
        url = format_url(self.bucket, self.scratch)
        try:
            self.objects.run(delete_folder, self.bucket, self.scratch)
        except Exception as exc:  # noqa: BLE001
            self.report.left_behind.append(f"{url} (empty folder: {one_line(exc)})")


def _result_of(exc: BaseException) -> str:
    """REFUSED for a 401/403 (the error or what it wraps), else FAILED."""
    refused = isinstance(exc, AccessDeniedError) or isinstance(exc.__cause__, AccessDeniedError)
    return REFUSED if refused else FAILED


def _rate(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e6:,.1f} MB/s" if seconds > 0 else "-"
