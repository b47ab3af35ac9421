"""The functional DataPipes; importing this package registers them on ``IterDataPipe``."""

from .composing import GCSShardComposerIterDataPipe
from .listing import GCSFileListerIterDataPipe
from .loading import GCSFileLoaderIterDataPipe
from .saving import GCSSaverIterDataPipe
from .shards import GCSShardReaderIterDataPipe

__all__ = [
    "GCSFileListerIterDataPipe",
    "GCSFileLoaderIterDataPipe",
    "GCSSaverIterDataPipe",
    "GCSShardComposerIterDataPipe",
    "GCSShardReaderIterDataPipe",
]
