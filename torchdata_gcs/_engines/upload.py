"""Streaming writes: binary file objects whose bytes go out in parts, concurrently, as they are produced.

Two ways to assemble the parts into one object: :class:`MultipartWriter` uses GCS's XML API
multipart upload; :class:`CompositeWriter` uploads each part as a temporary object and composes
them (this works wherever the JSON API does, the emulator included, and in buckets where XML
multipart uploads are not wanted); :func:`new_writer` picks one for a write. Both publish the object
only on a clean close, as their base, ``publishing.StreamingWriter``, says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, ClassVar, Literal
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from .._ops.attributes import ObjectAttributes
from .._ops.checksums import reported_crc32c
from .._ops.client import Client
from .._ops.objects import MAX_SOURCES, TEMPORARY_CLASS, compose_object, list_page
from .._ops.paging import PageTrail
from .._ops.parts import create_part, put_part, send_xml
from .._ops.temporaries import DeletePrefix, delete_temporary, new_job_id
from .._ops.uploads import UPLOAD_MARKERS, AbortUpload, Upload, abort_upload, unfinished_uploads, upload_marker
from .._ops.urls import TEMPORARY_PREFIX, format_url, parse_url
from .._transport import reaper
from .._transport.deadline import own_deadlines, tidying
from .._transport.retry import Attempts, is_retryable
from ..config import MIN_PART_SIZE, WriteConfig
from ..errors import GCSError, NoMultipartListing, NotFoundError, PreconditionFailedError, TransientError, UploadError
from .publishing import StreamingWriter

logger = logging.getLogger(__name__)

__all__ = ["MIN_PART_SIZE", "CompositeWriter", "MultipartWriter", "multipart_served", "new_writer"]


class MultipartWriter(StreamingWriter):
    """A :class:`StreamingWriter` over GCS's XML API multipart upload: parts of at least 5 MiB (but
    the last), assembled by one complete request, discarded by one abort request. While it runs, a
    small marker object (:func:`upload_marker`) tells ``torchdata-gcs clean`` the upload is ours.

    Examples:
        >>> from torchdata_gcs.testing import Emulator, GCSFront
        >>> with Emulator() as emulator, GCSFront(emulator.endpoint) as front:
        ...     emulator.create_bucket("demo")
        ...     client = Client(front.client_config)
        ...     with MultipartWriter("gs://demo/big.bin", client=client, part_size=MIN_PART_SIZE) as writer:
        ...         _ = writer.write(b"x" * (6 * 1024 * 1024))
        ...         _ = writer.write(b"tail")
        ...     # uploads: start, marker, 2 parts, end
        ...     len(emulator.read("demo", "big.bin")), front.counts["upload"], front.open_uploads
        (6291460, 5, [])
    """

    def __init__(self, url: str, **settings: Any) -> None:
        if settings.get("only_if_new"):
            raise ValueError(
                "GCS's XML API multipart uploads take no preconditions: write with CompositeWriter for only_if_new"
            )
        super().__init__(url, **settings)
        headers = self.attributes.xml_headers()
        if headers is None:
            raise ValueError(
                f"{url}: metadata that XML API headers cannot carry (a value not printable ASCII, or a key not a "
                "lower-case header token): write with CompositeWriter"
            )
        self._headers = headers
        self._xml_path = self._client.session.xml_path(self._bucket, self._name)
        self._upload_id: str | None = None
        self._marker: tuple[str, int] | None = None  # (name, generation) of the upload's marker object

    @property
    def _upload(self) -> Upload:
        return Upload(self._name, self._upload_id or "", "")

    def _start(self) -> None:
        reaper.start_soon()  # while the upload starts
        _, body = self._run(
            send_xml(self._context, self.url, self._xml_path, "POST", {"uploads": None}, headers=dict(self._headers))
        )
        try:
            self._upload_id = ElementTree.fromstring(body).findtext("{*}UploadId")
        except ElementTree.ParseError:
            self._upload_id = None
        if not self._upload_id:
            raise UploadError(
                f"{self.url}: GCS answered the start of a multipart upload without an upload ID", url=self.url
            )
        # A process ended by a signal runs no code of its own: its reaper aborts the upload instead.
        self._watched = reaper.watch(AbortUpload(self._bucket, self._upload, self._client))
        name = upload_marker(self._upload_id)
        try:  # by the marker, `clean` knows the upload as this library's; without it, `clean` leaves it alone
            generation = self._client.create(
                self._bucket,
                name,
                self.url.encode(),
                if_generation_match=0,
                content_type="text/plain",
                storage_class=TEMPORARY_CLASS,
                kms_key_name=self.attributes.kms_key_name,  # where a policy asks every object for a key
            )
            self._marker = (name, generation)
        except GCSError as exc:
            logger.debug("could not mark the multipart upload of %s: %r", self.url, exc)

    async def _unmark(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            await delete_temporary(self._context, self._bucket, *marker)

    def _upload_part(self, number: int, data: memoryview, crc32c: int) -> Coroutine[Any, Any, tuple[int, Any]]:
        return put_part(self._context, self.url, self._xml_path, number, self._upload_id, data, crc32c)

    def _assemble(self) -> tuple[int | None, str | None]:
        parts = "".join(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{escape(etag)}</ETag></Part>"
            for number, etag in sorted(self._parts.items())
        )
        document = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        try:
            return self._run(own_deadlines(self._complete(document)))
        except (NotFoundError, TransientError):
            # NoSuchUpload to the first completion (the upload was aborted meanwhile), or every answer lost
            # until the deadline: what the URL holds now decides (see _published_version).
            return None, None
        finally:
            self._run(tidying(self._unmark()))

    async def _complete(self, document: bytes) -> tuple[int | None, str | None]:
        """Send the completion, which GCS may take minutes to carry out, under its own deadline
        (``ClientConfig.completion_timeout``, past the deadline of the call that saves, if that ends sooner):
        each request waits for its answer until then. Once an
        answer is lost (a timeout, a reset, a cut body, a 5xx), the object is looked for before the
        completion goes again, so a completion carried out is never sent twice; NoSuchUpload after a
        lost answer means an earlier attempt completed the upload, and from then on only the object is
        looked for. Generation and crc32c as the answer, or the object found, reports them."""
        timeout = self._client.config.completion_timeout
        # The retries are decided here: with_retry sends it once, as a write without a precondition.
        patient = replace(self._client.retry, deadline=timeout)
        once = replace(self._context, retry=replace(patient, max_attempts=1, retry_unconditional_writes=False))
        attempts = Attempts(patient, self.url, on_retry=self._context.stats.count_retry)
        deadline = attempts.deadline.ends
        lost = completed = False
        while True:
            try:
                if lost:
                    resource, ours = await self._stored_version()
                    if resource is not None and ours:
                        if not completed:  # it may have held these bytes before: leave no upload billed
                            await self._abort_quietly()
                        return int(resource["generation"]), resource.get("crc32c")
                if completed:
                    raise TransientError(
                        f"{self.url}: an earlier request completed the upload, and its object is not seen yet",
                        url=self.url,
                    )
                try:
                    headers, _ = await send_xml(
                        once,
                        self.url,
                        self._xml_path,
                        "POST",
                        {"uploadId": self._upload_id},
                        document,
                        headers={"Content-Type": "application/xml"},
                        answer_timeout=max(deadline - time.monotonic(), 0.1),
                        repeatable=False,
                    )
                except NotFoundError:
                    if not lost:
                        raise
                    completed = True  # NoSuchUpload: an earlier request, whose answer was lost, completed it
                    continue
                generation = headers.get("x-goog-generation")
                return (int(generation) if generation else None), reported_crc32c(headers)
            except Exception as exc:  # noqa: BLE001 - Attempts re-raises what is not retryable
                lost = lost or is_retryable(exc)
                await asyncio.sleep(attempts.delay_after(exc))

    def _publish(self) -> int:
        generation = super()._publish()
        reaper.release(self._watched)  # completed: nothing to abort
        return generation

    async def _abort_upload(self) -> None:
        """Abort the upload (a no-op for one already completed or aborted)."""
        await abort_upload(self._context, self._bucket, self._upload)

    async def _abort_quietly(self) -> None:
        """Abort the upload if it is still open, once its object is published: a refusal (no
        ``storage.multipartUploads.abort``) or a failure is logged, never raised."""
        try:
            await self._abort_upload()
        except GCSError as exc:
            logger.warning("could not abort the multipart upload of %s after it was published: %r", self.url, exc)

    async def _discard(self, pending: Sequence[Future[tuple[int, Any]]]) -> None:
        for future in pending:  # the abort drops whatever parts still arrive
            future.cancel()
        await self._abort_upload()
        await self._unmark()
        reaper.release(self._watched)  # a failed abort stays in the reaper's hands, tried again at exit


class CompositeWriter(StreamingWriter):
    """A :class:`StreamingWriter` that uploads each part as a temporary object and composes them.

    Parts are named ``.torchdata-gcs-tmp/<time>-<host>-<pid>-<random>/part-<n>`` in the destination
    bucket (GCS composes only within a bucket), so ``torchdata-gcs clean`` finds any that a killed
    process leaves. At close, parts are composed 32 at a time (GCS's limit per call) into
    intermediates until one compose writes the object, each source pinned to its generation. Temporary
    objects are written as Standard whatever the bucket's default class (so the object, a composite,
    is Standard too: GCS gives a composite its sources' class), and each compose deletes its sources
    (``deleteSourceObjects``), so none is kept by soft delete or versioning or billed a minimum storage
    duration; one listing then finds any left (where GCS refused that, all are deleted one by one).
    Parts may be as small as 256 KiB. It needs only the JSON API, so it runs on the emulator; on GCS,
    composes are billed as Class A operations (one per part uploaded and one per 31 or so parts composed).

    Examples:
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.create_bucket("demo")
        ...     client = Client(emulator.client_config)
        ...     with CompositeWriter("gs://demo/big.bin", client=client, part_size=256 * 1024) as w:
        ...         _ = w.write(b"x" * (1024 * 1024))
        ...     len(emulator.read("demo", "big.bin")), emulator.names("demo")
        (1048576, ['big.bin'])
    """

    strategy: ClassVar[Literal["multipart", "compose"]] = "compose"

    def __init__(self, url: str, **settings: Any) -> None:
        super().__init__(url, **settings)
        self._prefix = f"{TEMPORARY_PREFIX}{new_job_id()}/"
        self._temporaries: set[str] = set()  # every temporary name written or being written
        self._intermediates: dict[str, int | None] = {}  # composed intermediate name -> its generation
        self._delete_sources = True  # composes delete their sources, until GCS refuses that once
        self._sources_maybe_gone = False  # a compose that deletes its sources was sent

    def _start(self) -> None:
        # A process ended by a signal runs no code of its own: its reaper deletes the parts instead.
        self._watched = reaper.watch(DeletePrefix(self._bucket, self._prefix, self._client))

    def _upload_part(self, number: int, data: memoryview, crc32c: int) -> Coroutine[Any, Any, tuple[int, Any]]:
        name = f"{self._prefix}part-{number:05d}"
        self._temporaries.add(name)
        return create_part(self._context, self._bucket, name, number, data, crc32c, self.attributes.kms_key_name)

    def _assemble(self) -> tuple[int | None, str | None]:
        sources: list[tuple[str, int | None]] = [self._parts[number] for number in sorted(self._parts)]
        replaced = self._replaced()
        try:
            info = self._run(self._compose_all(sources, replaced))
        except TransientError:  # every answer of the last compose may have been lost: the URL decides
            return None, None
        except (PreconditionFailedError, NotFoundError) as exc:
            # the object exists, or the sources are gone: this upload's own doing, if an earlier answer was lost
            live, ours = self._run(self._stored_version())
            if live is None or not ours:
                if self._only_if_new or isinstance(exc, NotFoundError):
                    raise
                raise PreconditionFailedError(
                    f"{self.url} was replaced by another writer while this one published; nothing was published",
                    url=self.url,
                    status=412,
                ) from None
            return int(live["generation"]), live["crc32c"]
        finally:
            self._run(tidying(self._delete_temporaries()))
        return info.generation, info.crc32c

    async def _compose_all(self, sources: list[tuple[str, int | None]], replaced: int) -> Any:
        """Compose ``sources`` into the destination (at generation ``replaced``, 0: none), through as many
        levels of intermediates as needed."""
        level = 0
        while len(sources) > MAX_SOURCES:
            level += 1
            groups = [sources[i : i + MAX_SOURCES] for i in range(0, len(sources), MAX_SOURCES)]
            names = [f"{self._prefix}level-{level}-{n:05d}" for n in range(len(groups))]
            self._temporaries.update(names)
            composed = await asyncio.gather(
                *(
                    self._compose(n, g, if_generation_match=0, unique_name=True)
                    for n, g in zip(names, groups, strict=True)
                )
            )
            sources = [(name, info.generation) for name, info in zip(names, composed, strict=True)]
            self._intermediates.update(sources)
        return await self._compose(self._name, sources, if_generation_match=replaced, final=True)

    async def _compose(
        self,
        name: str,
        sources: list[tuple[str, int | None]],
        *,
        if_generation_match: int,
        unique_name: bool = False,
        final: bool = False,
    ) -> Any:
        """Compose ``sources`` (temporaries of this writer) into ``name``, having GCS delete them as it composes:
        they then leave no soft-deleted or noncurrent copy and no early-deletion charge. Where GCS refuses that
        (sources under a hold or retention policy, an identity without ``storage.objects.delete``), this and
        every later compose of the writer go without, and the temporaries are deleted afterwards. The ``final``
        compose, the object's, gives it the writer's attributes."""
        compose = functools.partial(
            compose_object,
            self._context,
            self._bucket,
            name,
            sources,
            if_generation_match=if_generation_match,
            unique_name=unique_name,
            content_type=self.attributes.content_type if final else "application/octet-stream",
            fields=self.attributes.fields() if final else None,
            kms_key_name=self.attributes.kms_key_name,  # the parts hold the same bytes: encrypted alike
        )
        if self._delete_sources:
            self._sources_maybe_gone = True
            try:
                return await compose(delete_sources=True)
            except GCSError as exc:
                if exc.status not in (400, 403):
                    raise
                if self._delete_sources:
                    self._delete_sources = False
                    logger.info("%s: composing without deleting the parts, which GCS refused: %s", self.url, exc)
        return await compose()

    async def _leftovers(self) -> dict[str, int] | None:
        """The temporaries still there (name -> generation), from a listing of the writer's prefix; ``None``
        if it could not be listed."""
        url = format_url(self._bucket, self._prefix)
        params: dict[str, Any] = {"prefix": self._prefix, "fields": "items(name,generation),nextPageToken"}
        found: dict[str, int] = {}
        trail = PageTrail(url)
        try:
            while True:
                page = await list_page(self._context, self._bucket, params, url=url)
                found.update((item["name"], int(item["generation"])) for item in page.get("items", []))
                token = trail.follow_json(page)
                if token is None:
                    return found
                params["pageToken"] = token
        except GCSError as exc:
            logger.debug("listing %s failed: %r", url, exc)
            return None

    async def _delete_temporaries(self) -> None:
        """Delete every temporary object left, each by its generation where known (so object versioning
        keeps no noncurrent copy of it). After a compose that deletes its sources, one listing of the
        writer's prefix says which are left (none, where GCS carried the deletion out), not a DELETE each."""
        generations = {**dict(self._parts.values()), **self._intermediates}
        left = await self._leftovers() if self._sources_maybe_gone else None
        if left is not None:
            self._temporaries.intersection_update(left)
            generations.update(left)
        names = sorted(self._temporaries)
        deleted = await asyncio.gather(
            *(delete_temporary(self._context, self._bucket, n, generations.get(n)) for n in names)
        )
        self._temporaries.difference_update(n for n, gone in zip(names, deleted, strict=True) if gone)
        remaining = [format_url(self._bucket, n) for n in sorted(self._temporaries)]
        if not remaining:
            reaper.release(self._watched)  # what is left stays in the reaper's hands, tried again at exit
        else:
            logger.warning(
                "%d temporary parts of %s were not deleted (torchdata-gcs clean removes them): %s",
                len(remaining),
                self.url,
                remaining[:3],
            )

    async def _discard(self, pending: Sequence[Future[tuple[int, Any]]]) -> None:
        # Parts in flight run to their end first, so none lands after the deletes.
        await asyncio.gather(*(asyncio.wrap_future(future) for future in pending), return_exceptions=True)
        await self._delete_temporaries()


_multipart_served: dict[str, bool] = {}  # endpoint -> whether it serves XML API multipart uploads


def multipart_served(client: Client, bucket: str) -> bool:
    """Whether the endpoint serves XML API multipart uploads, asked once per endpoint and process by
    listing one page of the bucket's unfinished uploads of this library. An endpoint without them
    (fake-gcs-server) is named in one log line; any other failure to list (a refusal, a missing
    bucket) leaves the answer to the upload itself."""
    endpoint = client.session.endpoint
    served = _multipart_served.get(endpoint)
    if served is None:
        try:
            next(iter(unfinished_uploads(client, bucket, prefix=UPLOAD_MARKERS)), None)
            served = True
        except NoMultipartListing:
            served = False
            logger.warning("%s serves no XML API multipart upload: writing with strategy='compose'", endpoint)
        except GCSError:
            served = True
        _multipart_served[endpoint] = served
    return served


def new_writer(
    url: str,
    client: Client,
    write: WriteConfig,
    *,
    only_if_new: bool = False,
    attributes: ObjectAttributes | None = None,
    folder_name: bool = False,
) -> StreamingWriter:
    """A writer of ``url`` with ``write``'s part size, parts in flight and strategy (compression is the
    caller's; ``folder_name``: see ``StreamingWriter``), publishing an object with ``attributes``.
    ``"multipart"`` writes as ``"compose"`` where the endpoint serves no XML API multipart upload, where
    ``only_if_new`` asks for a precondition, which only a compose can carry, and where the attributes are
    more than XML API headers can carry."""
    strategy = write.strategy
    if strategy == "multipart" and (
        only_if_new
        or (attributes is not None and attributes.xml_headers() is None)
        or not multipart_served(client, parse_url(url, allow_prefix=False)[0])
    ):
        strategy = "compose"
    writer = MultipartWriter if strategy == "multipart" else CompositeWriter
    return writer(
        url,
        client=client,
        part_size=write.part_size,
        max_parts_in_flight=write.max_parts_in_flight,
        only_if_new=only_if_new,
        attributes=attributes,
        folder_name=folder_name,
    )
