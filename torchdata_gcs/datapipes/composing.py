"""``compose_shards_by_gcs``: load many small objects as a few server-side composites."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from torch.utils.data import IterDataPipe, functional_datapipe

from .._engines.compose import COMPOSED_CLASSES, Composing
from .._engines.local_cache import LocalCache
from .._engines.reading import Item
from .._ops.client import GCSClient
from .._ops.objects import MAX_SOURCES
from ..config import ClientConfig, RetryConfig, TransferConfig
from .loading import GCSFileLoaderIterDataPipe

__all__ = ["GCSShardComposerIterDataPipe"]


@functional_datapipe("compose_shards_by_gcs")
class GCSShardComposerIterDataPipe(GCSFileLoaderIterDataPipe):
    """Loads small objects through server-side composites, yielding ``(url, StreamWrapper)`` pairs in
    input order (functional name: ``compose_shards_by_gcs``): a drop-in for ``load_files_by_gcs``.

    Consecutive objects of one bucket, up to ``max_sources`` of them and ``max_composite_bytes`` in
    all, are concatenated by one GCS compose call, downloaded in one request and cut back into
    the original objects: about three requests (compose, read, delete) per ``max_sources`` objects
    instead of one per object. Objects larger than ``max_composite_bytes`` are read directly.

    A group holds objects of one storage class, one of ``storage_classes`` (GCS composes only
    sources of one class, and a composite takes their class: a cold one deleted after reading pays
    early-deletion charges); objects of other classes, or of a class not known (an ``ObjectInfo``
    without one: one ``ComposeFallbackWarning``), are read directly. A compose that GCS refuses,
    for whatever reason, means direct reads of that group only; the first refusal other than a
    changed object's is a ``ComposeFallbackWarning``, later ones are logged.

    Nothing wrong is ever yielded: every compose source is pinned to its listed generation, and
    every piece is checked against its listed size and crc32c; a group whose objects changed since
    they were listed is loaded object by object, so an overwritten object raises ``NotFoundError``
    (or is skipped) as with ``load_files_by_gcs``. Plain URLs cost one metadata request each
    first: feed ``list_files_by_gcs(with_metadata=True)`` to avoid it.

    Temporary composites are written under ``.torchdata-gcs-tmp/<time>-<host>-<pid>-<random>/`` in
    the objects' bucket (listings skip that prefix) and deleted once read; what is left when the
    iteration ends, stops early or fails, or at process exit is deleted then; a killed process
    (SIGTERM, SIGKILL) leaves them to a small cleanup process that deletes them once it has ended.
    Only a lost machine leaves some: ``torchdata-gcs clean gs://bucket`` or a lifecycle rule removes
    them. Where the credentials may not create and delete objects (checked once per bucket by
    writing and deleting an empty probe), objects are loaded directly with one
    ``ComposeFallbackWarning``.

    With ``reuse_prefix``, composites are kept under that prefix of the bucket, named by a hash of
    their sources (names, generations, sizes, checksums), and the prefix's listing serves as the
    manifest: a later iteration that meets the same objects in the same order reads the kept
    composites and makes no compose call; changed sources make a new name, a wrong composite is
    rebuilt. Put ``shuffle`` after this DataPipe when reusing (before it, groups differ every epoch).
    A kept composite is read only at the generation this process (or the one it was forked from)
    composed it as; one composed elsewhere or replaced since is composed again in its place first,
    since a replacement may have the same size and crc32c.

    Args:
        source_datapipe: a DataPipe, an iterable or one item; items are ``gs://`` URLs or the
            ``(url, ObjectInfo)`` pairs that ``list_files_by_gcs(with_metadata=True)`` yields.
        max_sources: objects per composite, 2 to 32 (GCS's limit).
        max_composite_bytes: size limit of one composite (at most half of
            ``transfer.max_buffered_bytes`` is used); larger objects are read directly.
        reuse_prefix: object-name prefix (such as ``"cache/composites/"``) under which composites
            are kept across iterations; ``None`` deletes them once read.
        storage_classes: the storage classes whose objects are composed, such as
            ``("STANDARD", "NEARLINE")``; the default composes Standard objects only.
        skip_missing, client, transfer, retry, cache: as for ``load_files_by_gcs`` (the objects are cached,
            not the composites; a run is composed of those not found in the cache).

    Returns:
        ``(url, StreamWrapper)`` pairs, as ``load_files_by_gcs`` yields them.

    Raises:
        NotFoundError: as ``load_files_by_gcs`` raises it, and also for an object changed since it was listed;
            the other errors are ``load_files_by_gcs``'s.
        ValueError: for bad settings.

    Examples:
        >>> from torchdata_gcs import testing
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> with testing.Emulator() as emulator:
        ...     emulator.seed("demo", {f"{i}.txt": f"sample {i}".encode() for i in range(5)})
        ...     client = emulator.client_config
        ...     pipe = IterableWrapper(["gs://demo/"]).list_files_by_gcs(client=client, with_metadata=True)
        ...     pipe = pipe.compose_shards_by_gcs(client=client)
        ...     samples = [(url, stream.read()) for url, stream in pipe]
        ...     names = emulator.names("demo")
        >>> samples[:2]
        [('gs://demo/0.txt', b'sample 0'), ('gs://demo/1.txt', b'sample 1')]
        >>> pipe.stats.composes, names
        (1, ['0.txt', '1.txt', '2.txt', '3.txt', '4.txt'])
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Item] | Iterable[Item] | str,
        *,
        max_sources: int = MAX_SOURCES,
        max_composite_bytes: int = 32 * 1024 * 1024,
        reuse_prefix: str | None = None,
        storage_classes: Collection[str] = COMPOSED_CLASSES,
        skip_missing: bool = False,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        cache: LocalCache | None = None,
    ) -> None:
        super().__init__(
            source_datapipe, skip_missing=skip_missing, client=client, transfer=transfer, retry=retry, cache=cache
        )
        self._grouping = Composing(max_sources, max_composite_bytes, reuse_prefix, storage_classes)
