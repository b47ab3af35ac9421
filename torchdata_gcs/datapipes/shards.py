"""``read_shards_by_gcs``: WebDataset tar shards into samples, each shard read with one GET."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import IterDataPipe, functional_datapipe

from .._engines.local_cache import LocalCache
from .._engines.reading import Item
from .._engines.tar_format import read_members, samples_of
from .._ops.client import GCSClient
from ..config import ClientConfig, RetryConfig, TransferConfig
from ..errors import GCSError, ShardWarning
from .loading import GCSFileLoaderIterDataPipe

__all__ = ["GCSShardReaderIterDataPipe"]


@functional_datapipe("read_shards_by_gcs")
class GCSShardReaderIterDataPipe(IterDataPipe[dict[str, Any]]):
    """Reads WebDataset tar shards and yields their samples (functional name: ``read_shards_by_gcs``): a dict
    ``{"__key__": key, "__url__": shard URL, extension: bytes, ...}`` per key, members grouped as WebDataset
    groups them (``000123.jpg`` and ``000123.json`` are one sample).

    Each shard is read as :class:`GCSFileLoaderIterDataPipe` reads an object (one GET, streamed past the byte
    budget, checked against GCS's crc32c, from a ``cache`` if given), and its members parsed as they arrive:
    a shard is never held whole unless it fits the budget. Put ``sharding_filter`` before it, on the shards'
    URLs, so each worker and rank reads its own shards, and ``shuffle`` after it for a buffer of samples. A cut
    or damaged shard, or a member without a key, raises ``IntegrityError`` naming the shard and the byte
    offset (a sample is never yielded in part); with ``skip_bad_shards`` the rest of that shard is skipped
    with a ``ShardWarning`` and counted in :attr:`skipped_shards`.

    Examples:
        >>> import io, tarfile
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> from torchdata_gcs.testing import Emulator
        >>> out = io.BytesIO()
        >>> with tarfile.open(fileobj=out, mode="w") as tar:
        ...     for name in ("1.txt", "1.cls", "2.txt", "2.cls"):
        ...         info = tarfile.TarInfo(name)
        ...         info.size = 1
        ...         tar.addfile(info, io.BytesIO(name[:1].encode()))
        >>> with Emulator() as emulator:
        ...     emulator.seed("data", {"shards/0.tar": out.getvalue()})
        ...     pipe = IterableWrapper(["gs://data/shards/"]).list_files_by_gcs(client=emulator.client_config)
        ...     pipe = pipe.sharding_filter().read_shards_by_gcs(client=emulator.client_config)
        ...     [(sample["__key__"], sample["cls"]) for sample in pipe]
        [('1', b'1'), ('2', b'2')]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Item] | Iterable[Item] | str,
        *,
        skip_bad_shards: bool = False,
        client: GCSClient | ClientConfig | None = None,
        transfer: TransferConfig | None = None,
        retry: RetryConfig | None = None,
        cache: LocalCache | None = None,
    ) -> None:
        self.loader = GCSFileLoaderIterDataPipe(
            source_datapipe, client=client, transfer=transfer, retry=retry, cache=cache
        )
        self.skip_bad_shards = skip_bad_shards
        self.skipped_shards = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for url, stream in self.loader:
            try:
                for sample, members in samples_of(read_members(stream.read, url), url):
                    yield {"__key__": sample.key, "__url__": url, **members}
            except GCSError as exc:
                if not self.skip_bad_shards:
                    raise
                self.skipped_shards += 1
                warnings.warn(f"skipped the rest of {url}: {exc}", ShardWarning, stacklevel=2)
            finally:
                stream.close()
