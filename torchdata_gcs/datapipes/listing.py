"""``list_files_by_gcs``: expand ``gs://`` prefixes and object URLs into object URLs."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterDataPipe, functional_datapipe

from .._engines.inputs import list_inputs
from .._engines.parallel_listing import ListingStats
from .._engines.resume import listing_position
from .._ops.checksums import ObjectInfo
from .._ops.client import Client, GCSClient, client_of
from .._ops.paging import MAX_PAGE_SIZE
from .._ops.urls import parse_url
from ..config import ClientConfig, RetryConfig, require_integer
from ._source import as_source

__all__ = ["GCSFileListerIterDataPipe"]


@functional_datapipe("list_files_by_gcs")
class GCSFileListerIterDataPipe(IterDataPipe):
    """Lists the objects under ``gs://`` prefixes, object URLs or globs (functional name: ``list_files_by_gcs``).

    Each input is expanded in GCS's name order (lexicographic by UTF-8 bytes), inputs one after
    another in the order given, so every worker and rank that lists the same unchanged bucket sees
    the same sequence. An input ending in ``/`` (or a bare bucket) is a prefix; an input with ``*``,
    ``?`` or ``[`` is a glob as fsspec and gcsfs read it (``*`` within one level, ``**`` across
    levels; ``[*]`` is a literal ``*``); any other input names an object and, if it also acts as a
    folder, everything under ``input/``. Zero-byte folder placeholders (names ending in ``/``) are
    skipped. Metadata comes from the listing itself; no request per object is made.

    An input that matches no object raises ``NotFoundError`` naming it and the masks when the
    listing reaches it: a misspelt prefix or mask is an error, not an empty epoch.

    Args:
        source_datapipe: a DataPipe, an iterable of ``gs://`` (or ``gcs://``) URLs, or one URL.
        masks: pattern(s) an object must match: without ``/``, fnmatch on its base name (``*.jpg``);
            with ``/``, a glob on its name below the input's prefix (``**/*.jpg``, ``*/labels.json``).
            An empty pattern (or none) keeps all.
        with_metadata: yield ``(url, ObjectInfo)`` instead of ``url``; ``load_files_by_gcs``
            then pins each read to the listed generation and checks the listed crc32c.
        client: a ``GCSClient`` (or the ``ClientConfig`` of one): endpoint, credentials, transport; the default
            takes ``STORAGE_EMULATOR_HOST``, then Application Default Credentials.
        retry: retry policy for list requests, in place of the client's own.
        page_size: objects per list request, 1 to 1000.
        concurrency: list requests in flight at once for one prefix; the key space is split into
            ranges as full pages come back, keeping the total number of list requests within
            1.5x of a sequential listing's. 1 lists sequentially.
        manifest: a ``gs://bucket/folder/`` where replicas of this DataPipe (worker processes,
            ranks) share one listing: the first to get there lists and publishes a manifest there,
            the others read it, so a job lists once and every replica sees the same sequence. The
            manifest is named by the inputs and masks and kept, so a restarted job reads it instead
            of listing; objects added later are seen only under another folder (say, one per job).
            Needs permission to create and delete objects in the folder.
        allow_empty: an input that matches no object is not an error.
        skip_missing: an input naming an object (no ``/`` at its end, no glob) that does not exist is
            skipped with a ``MissingObjectWarning`` and counted in ``stats.missing``.
        list_once: where this DataPipe is iterated in the process that made it (no worker processes:
            ``DistributedReadingService`` alone, a ``DataLoader`` with ``num_workers=0``) and a
            ``torch.distributed`` process group of several ranks is initialized there, each iteration
            is one listing for the job: rank 0 lists and the other ranks receive its listing (every
            rank must then iterate at the same point). Worker processes have no process group and
            list alone: give them ``manifest``, or list in the rank and hand them the listed
            ``(url, ObjectInfo)`` pairs, to list once. ``False`` lists on each rank.

    State:
        :meth:`state_dict` records the last object yielded; a DataPipe given it with
        :meth:`load_state_dict` resumes after that object on its next iteration, listing only the
        rest (or reading it from the manifest): no duplicates, no holes.

    Returns:
        ``gs://bucket/name`` strings, or ``(url, ObjectInfo)`` with ``with_metadata``.

    Raises:
        InvalidURIError: an input is not a valid ``gs://`` URL (raised here for literal inputs).
        NotFoundError: a bucket does not exist, or an input matches no object.
        AccessDeniedError: the credentials may not list the bucket.

    Examples:
        >>> from torchdata_gcs import testing
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> with testing.Emulator() as emulator:
        ...     emulator.seed("demo", {"train/a.txt": b"1", "train/b.txt": b"2", "test/c.txt": b"3"})
        ...     urls = IterableWrapper(["gs://demo/train/"]).list_files_by_gcs(client=emulator.client_config)
        ...     list(urls)
        ['gs://demo/train/a.txt', 'gs://demo/train/b.txt']
    """

    _is_child_datapipe = False  # torch checks it per item; found here, it skips a slow miss

    def __init__(
        self,
        source_datapipe: IterDataPipe[str] | Iterable[str] | str,
        masks: str | Sequence[str] = "",
        *,
        with_metadata: bool = False,
        client: GCSClient | ClientConfig | None = None,
        retry: RetryConfig | None = None,
        page_size: int = MAX_PAGE_SIZE,
        concurrency: int = 8,
        manifest: str | None = None,
        allow_empty: bool = False,
        skip_missing: bool = False,
        list_once: bool = True,
    ) -> None:
        require_integer("page_size", page_size, 1, MAX_PAGE_SIZE)
        require_integer("concurrency", concurrency, 1, 256)
        self.source_datapipe = as_source(source_datapipe)
        if isinstance(self.source_datapipe, tuple):
            for url in self.source_datapipe:
                parse_url(url)
        # An empty pattern keeps all, in a list as on its own.
        self.masks = masks if isinstance(masks, str) else ([] if "" in masks else list(masks))
        self.with_metadata = with_metadata
        self.client = client_of(client, retry)
        self.page_size = page_size
        self.concurrency = concurrency
        if manifest is not None:
            parse_url(manifest)
        self.manifest = manifest
        self.allow_empty, self.skip_missing = allow_empty, skip_missing
        self.list_once, self._made_in = list_once, os.getpid()  # a copy in a worker process lists alone
        self.stats = ListingStats()
        self._position: tuple[int, str] | None = None  # (input index, URL) of the last object yielded
        self._resume_after: tuple[int, str] | None = None

    def state_dict(self) -> dict[str, Any]:
        """Where the current iteration stands: the input index and URL of the last object yielded."""
        position = self._position or self._resume_after
        return {"after": None if position is None else list(position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume after the position in ``state`` (from :meth:`state_dict`)."""
        self._resume_after = listing_position(state)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_position"] = None  # a copy starts a fresh iteration, unless a state was loaded
        return state

    def __iter__(self) -> Iterator[str | tuple[str, ObjectInfo]]:
        """List every input; :attr:`stats` counts this iteration's list requests and objects."""
        client = Client(self.client)
        self.stats = ListingStats()
        after, self._resume_after, self._position = self._resume_after, None, None
        batches = list_inputs(
            client,
            list(self.source_datapipe),
            [self.masks] if isinstance(self.masks, str) else self.masks,
            with_info=self.with_metadata,
            page_size=self.page_size,
            concurrency=self.concurrency,
            stats=self.stats,
            manifest=self.manifest,
            after=after,
            allow_empty=self.allow_empty,
            skip_missing=self.skip_missing,
            once=self.list_once and os.getpid() == self._made_in,
        )
        with_metadata = self.with_metadata
        for batch in batches:
            for index, url, info in batch:
                self._position = (index, url)
                yield url if info is None or not with_metadata else (url, info)
        self._position = None
