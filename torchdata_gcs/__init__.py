"""Google Cloud Storage for PyTorch: DataPipes, datasets, checkpoints and an fsspec filesystem.

Importing the package registers the functional DataPipes on ``IterDataPipe``:

    import torchdata_gcs
    from torch.utils.data.datapipes.iter import IterableWrapper

    pipe = IterableWrapper(["gs://bucket/train/"]).list_files_by_gcs(masks="*.jpg").shuffle()
    pipe = pipe.sharding_filter().load_files_by_gcs()
"""

from . import checkpoint
from ._engines.local_cache import LocalCache
from ._engines.parallel_listing import ListingStats
from ._ops.checksums import ObjectInfo
from ._ops.client import GCSClient
from ._ops.urls import format_url, parse_url
from ._transport.context import LoadStats
from .config import ClientConfig, RetryConfig, TransferConfig, WriteConfig, Zstd
from .datapipes import (
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    GCSSaverIterDataPipe,
    GCSShardComposerIterDataPipe,
)
from .datasets import GCSIterableDataset, GCSMapDataset
from .errors import (
    AccessDeniedError,
    CacheWarning,
    ComposeFallbackWarning,
    DeadlineExceededError,
    EndpointError,
    GCSError,
    IntegrityError,
    InvalidURIError,
    ListingError,
    MissingObjectWarning,
    NotFoundError,
    PreconditionFailedError,
    RankFailedError,
    ResumeError,
    ShardWarning,
    TransientError,
    UploadError,
)

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "CacheWarning",
    "ClientConfig",
    "ComposeFallbackWarning",
    "DeadlineExceededError",
    "EndpointError",
    "GCSClient",
    "GCSError",
    "GCSFileListerIterDataPipe",
    "GCSFileLoaderIterDataPipe",
    "GCSIterableDataset",
    "GCSMapDataset",
    "GCSSaverIterDataPipe",
    "GCSShardComposerIterDataPipe",
    "IntegrityError",
    "InvalidURIError",
    "ListingError",
    "ListingStats",
    "LoadStats",
    "LocalCache",
    "MissingObjectWarning",
    "NotFoundError",
    "ObjectInfo",
    "PreconditionFailedError",
    "RankFailedError",
    "ResumeError",
    "RetryConfig",
    "ShardWarning",
    "TransferConfig",
    "TransientError",
    "UploadError",
    "WriteConfig",
    "Zstd",
    "checkpoint",
    "format_url",
    "parse_url",
]
