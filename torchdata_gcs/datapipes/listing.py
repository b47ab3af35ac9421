"""``list_files_by_gcs``: expand ``gs://`` prefixes and object URLs into object URLs."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Sequence

from torch.utils.data import IterDataPipe, functional_datapipe
from torch.utils.data.datapipes.utils.common import match_masks

from .._client import transport_for
from .._listing import MAX_PAGE_SIZE, list_objects
from .._metadata import ObjectInfo
from .._parallel_listing import ListingStats
from .._uri import parse_url
from ..config import ClientConfig, RetryConfig
from ._source import as_source

__all__ = ["GCSFileListerIterDataPipe"]


@functional_datapipe("list_files_by_gcs")
class GCSFileListerIterDataPipe(IterDataPipe):
    """Lists the objects under ``gs://`` prefixes or URLs (functional name: ``list_files_by_gcs``).

    Each input is expanded in GCS's name order (lexicographic by UTF-8 bytes), inputs one after
    another in the order given, so every worker and rank that lists the same unchanged bucket sees
    the same sequence. An input ending in ``/`` (or a bare bucket) is a prefix; any other input
    names an object and, if it also acts as a folder, everything under ``input/``. Zero-byte
    folder placeholders (names ending in ``/``) are skipped. Metadata comes from the listing
    itself; no request per object is made.

    Args:
        source_datapipe: a DataPipe, an iterable of ``gs://`` (or ``gcs://``) URLs, or one URL.
        masks: fnmatch pattern(s) matched against each object's base name; empty keeps all.
        with_metadata: yield ``(url, ObjectInfo)`` instead of ``url``; ``load_files_by_gcs``
            then pins each read to the listed generation and checks the listed crc32c.
        client: endpoint and credentials; defaults to ``ClientConfig()``.
        retry: retry policy for list requests; defaults to ``RetryConfig()``.
        page_size: objects per list request, 1 to 1000.
        concurrency: list requests in flight at once for one prefix; the key space is split into
            ranges as full pages come back, keeping the total number of list requests within
            1.5x of a sequential listing's. 1 lists sequentially.

    Returns:
        ``gs://bucket/name`` strings, or ``(url, ObjectInfo)`` with ``with_metadata``.

    Raises:
        InvalidURIError: an input is not a valid ``gs://`` URL (raised here for literal inputs).
        NotFoundError: a bucket does not exist.
        AccessDeniedError: the credentials may not list the bucket.

    Example:
        >>> from torchdata_gcs import testing
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> with testing.Emulator() as emulator:
        ...     emulator.seed("demo", {"train/a.txt": b"1", "train/b.txt": b"2", "test/c.txt": b"3"})
        ...     urls = IterableWrapper(["gs://demo/train/"]).list_files_by_gcs(client=emulator.client_config)
        ...     list(urls)
        ['gs://demo/train/a.txt', 'gs://demo/train/b.txt']
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str] | Iterable[str] | str,
        masks: str | Sequence[str] = "",
        *,
        with_metadata: bool = False,
        client: ClientConfig | None = None,
        retry: RetryConfig | None = None,
        page_size: int = MAX_PAGE_SIZE,
        concurrency: int = 8,
    ) -> None:
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be 1..{MAX_PAGE_SIZE}, got {page_size}")
        if not 1 <= concurrency <= 256:
            raise ValueError(f"concurrency must be 1..256, got {concurrency}")
        self.source_datapipe = as_source(source_datapipe)
        if isinstance(self.source_datapipe, tuple):
            for url in self.source_datapipe:
                parse_url(url)
        self.masks = masks if isinstance(masks, str) else list(masks)
        self.with_metadata = with_metadata
        self.client = client or ClientConfig()
        self.retry = retry or RetryConfig()
        self.page_size = page_size
        self.concurrency = concurrency
        self.stats = ListingStats()

    def __iter__(self) -> Iterator[str | tuple[str, ObjectInfo]]:
        """List every input; :attr:`stats` counts this iteration's list requests and objects."""
        transport = transport_for(self.client)
        self.stats = stats = ListingStats()
        for source_url in self.source_datapipe:
            bucket, name = parse_url(source_url)
            listed = list_objects(transport, bucket, name, self.retry, self.page_size, self.concurrency, stats)
            for url, info in listed:
                if match_masks(posixpath.basename(url), self.masks):
                    yield (url, info) if self.with_metadata else url
