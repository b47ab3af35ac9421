"""``load_files_by_gcs``: turn object URLs into ``(url, stream)`` pairs, many reads in flight."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import IterDataPipe, functional_datapipe
from torch.utils.data.datapipes.utils.common import StreamWrapper

from .._engines.local_cache import LocalCache, check_cache
from .._engines.reading import Grouping, Item, read_in_order, split_item
from .._engines.stalls import stall_report
from .._engines.workers import WorkerStats
from .._ops.client import Client, GCSClient, client_of
from .._ops.urls import parse_url
from .._transport.context import LoadStats
from ..config import ClientConfig, RetryConfig, TransferConfig
from ._source import as_source

__all__ = ["GCSFileLoaderIterDataPipe"]


class _ObjectStream(StreamWrapper):
    """torch's ``StreamWrapper`` without its closing of the wrapped stream when the wrapper is collected.

    ``pair[1].read()`` takes the wrapped stream's ``read`` and drops the pair, and with it the wrapper,
    before calling it: the stream must still be open then. What it wraps closes itself when it is
    collected (a stream read ahead then gives its buffer budget back); ``close()`` closes it at once.
    """

    def __del__(self) -> None:
        pass


@functional_datapipe("load_files_by_gcs")
class GCSFileLoaderIterDataPipe(IterDataPipe[tuple[str, StreamWrapper]]):
    """Downloads objects and yields ``(url, StreamWrapper)`` pairs (functional name: ``load_files_by_gcs``).

    Like torchdata's own file loaders, so existing decoders chain after it; the pairs come in input order. Reads run as
    coroutines on one I/O thread per process: up to ``transfer.max_in_flight`` requests at once, at most
    ``transfer.max_buffered_bytes`` held ahead of the consumer, objects above ``transfer.part_size`` read as concurrent
    ranges. Every object's length and crc32c are checked against GCS's (and, for ``(url, ObjectInfo)`` input, the
    listing's): before it is yielded, or for an object larger than the budget, streamed, when its reader reaches the end
    (unless ``transfer.hold_until_verified``); each read is pinned to one generation (the listed one, if known).
    Transient failures are retried per ``retry``, a range from the byte it reached; on HTTP 429 every loader of the
    process sends fewer requests at once, growing back as requests succeed. :attr:`stats` (a ``LoadStats``) counts
    requests, bytes, retries, 429s and the time the consumer waited. The bytes are the object's stored bytes: objects
    uploaded with ``Content-Encoding: gzip`` come back compressed.

    Args:
        source_datapipe: a DataPipe, an iterable or one item; items are ``gs://`` URLs or the
            ``(url, ObjectInfo)`` pairs that ``list_files_by_gcs(with_metadata=True)`` yields.
        skip_missing: skip an object that does not exist (or no longer has the listed generation)
            with a ``MissingObjectWarning`` instead of raising ``NotFoundError``.
        client: a ``GCSClient`` (or the ``ClientConfig`` of one): endpoint, credentials, transport; the default
            takes ``STORAGE_EMULATOR_HOST``, then Application Default Credentials.
        transfer: concurrency and buffering, in place of the client's own.
        retry: retry policy, in place of the client's own.
        cache: a ``LocalCache``: objects whose version is in it are read from this machine's disk, the others
            from GCS and then kept there, for every process of the machine.

    Returns:
        ``(url, StreamWrapper)`` pairs whose streams are binary and seekable (a streamed one reads
        forward only).

    Raises:
        InvalidURIError: an item is not a valid object URL.
        NotFoundError: an object does not exist (unless ``skip_missing``).
        IntegrityError: the bytes did not match GCS's checksum or the listed size, after retries.
        TransientError: GCS kept failing until the retry policy gave up.

    Examples:
        >>> from torchdata_gcs import testing
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> with testing.Emulator() as emulator:
        ...     emulator.seed("demo", {"a.txt": b"alpha", "b.txt": b"beta"})
        ...     pipe = IterableWrapper(["gs://demo/"]).list_files_by_gcs(client=emulator.client_config)
        ...     pipe = pipe.load_files_by_gcs(client=emulator.client_config)
        ...     [(url, stream.read()) for url, stream in pipe]
        [('gs://demo/a.txt', b'alpha'), ('gs://demo/b.txt', b'beta')]
    """

    _is_child_datapipe = False  # torch checks it per item; found here, it skips a slow miss

    def __init__(
        self,
        source_datapipe: IterDataPipe[Item] | Iterable[Item] | str,
        *,
        skip_missing: bool = False,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        cache: LocalCache | None = None,
    ) -> None:
        self.source_datapipe = as_source(source_datapipe)
        if isinstance(self.source_datapipe, tuple):
            for item in self.source_datapipe:
                parse_url(split_item(item)[0], allow_prefix=False)
        self.skip_missing = skip_missing
        self.cache = check_cache(cache)
        self.client = client_of(client, retry, transfer)
        self.stats = LoadStats()
        self._shared = WorkerStats(spawned=False)  # every iteration's counts and waits, in forked workers too

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        """Load every item; :attr:`stats` counts this iteration's requests, bytes and retries."""
        self.stats = self._shared.restart()
        gcs = Client(self.client, stats=self.stats)
        items = (split_item(item) for item in self.source_datapipe)
        reading = read_in_order(
            items, gcs, self._shared.waits(), skip_missing=self.skip_missing, grouping=self._grouping, cache=self.cache
        )
        for url, stream in reading:
            self._shared.publish()
            yield url, _ObjectStream(stream, name=url)

    def stall_stats(self) -> dict[str, Any]:
        """Where loading time went in this process and the DataLoader workers it forked (as of the last
        item each read; spawned workers, ``DataLoader2``'s included, count in their own process only),
        every iteration so far: each one's wait for its next object (count, total, p50, p95, p99, max in seconds),
        objects, requests, bytes, retries and 429 answers, and their sums, as a dict to log (see
        ``torchdata_gcs.stalls``, whose ``StallWatch`` adds the training loop's batch waits).

        Examples:
            >>> from torchdata_gcs import GCSFileLoaderIterDataPipe
            >>> from torchdata_gcs.testing import Emulator
            >>> with Emulator() as emulator:
            ...     emulator.seed("demo", {"a.txt": b"alpha", "b.txt": b"beta"})
            ...     urls = ["gs://demo/a.txt", "gs://demo/b.txt"]
            ...     pipe = GCSFileLoaderIterDataPipe(urls, client=emulator.client_config)
            ...     data = [stream.read() for _, stream in pipe]
            >>> report = pipe.stall_stats()
            >>> report["objects"], report["requests"], list(report["workers"]), report["object_wait_s"]["count"]
            (2, 2, ['main'], 2.0)
        """
        return stall_report(self._shared.processes())

    _grouping: Grouping | None = None  # how runs of small objects are read together (none: one GET each)

    def __len__(self) -> int:
        if self.skip_missing:
            raise TypeError(f"{type(self).__name__} with skip_missing=True has no known length")
        return len(self.source_datapipe)
