"""An fsspec filesystem on this library's engines, for tools that reach storage through fsspec:
Lightning's ``ModelCheckpoint``, ``torch.distributed.checkpoint`` with a ``gs://`` checkpoint id,
pandas and pyarrow. ``docs/guides/fsspec.md`` says what each call does on GCS, and
``docs/gcsfs-compatibility.md`` sets every argument, method and attribute beside gcsfs's.

In every process, ``gs://`` and ``gcs://`` are served by :class:`GCSFileSystem` once :func:`register`
was called there or in a parent (it sets ``TORCHDATA_GCS_FSSPEC=1``) or that variable is set; by gcsfs
with ``TORCHDATA_GCS_FSSPEC=0``; otherwise by gcsfs if it is installed, else by :class:`GCSFileSystem`:

    import torchdata_gcs.fsspec
    torchdata_gcs.fsspec.register()  # needed only where gcsfs is installed too
    fs, path = fsspec.url_to_fs("gs://bucket/data")
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from fsspec.registry import register_implementation

from torchdata_gcs_fsspec_handler import VARIABLE

from .buckets import BucketExistsError, BucketNotEmptyError
from .files import GCSFile, PublishingTransaction, StagedWriter
from .filesystem import GCSFileSystem
from .paths import InvalidPathError

__all__ = [
    "BucketExistsError",
    "BucketNotEmptyError",
    "GCSFile",
    "GCSFileSystem",
    "InvalidPathError",
    "PublishingTransaction",
    "StagedWriter",
    "register",
]

# Named where users import them from, as before the filesystem became a package: fsspec's to_json, pickles,
# reprs and tracebacks say torchdata_gcs.fsspec.GCSFileSystem.
for _public in (
    BucketExistsError,
    BucketNotEmptyError,
    GCSFile,
    GCSFileSystem,
    InvalidPathError,
    PublishingTransaction,
    StagedWriter,
):
    _public.__module__ = __name__
del _public


def register(protocols: Iterable[str] = ("gs", "gcs")) -> None:
    """Make :class:`GCSFileSystem` the handler of ``protocols`` in this process, replacing any other
    (such as gcsfs), so ``fsspec.open``, ``fsspec.url_to_fs`` and every tool built on them use it; and of
    ``gs://`` and ``gcs://`` in the processes started from now on, DataLoader workers included.

    Child processes learn it from ``TORCHDATA_GCS_FSSPEC=1``, set here, which they inherit. A forkserver
    already running keeps the environment it started with: call this before the first forkserver worker
    starts, or set the variable for the whole job instead.

    Examples:
        >>> import fsspec, os
        >>> register()
        >>> type(fsspec.filesystem("gs", skip_instance_cache=True)).__name__, os.environ["TORCHDATA_GCS_FSSPEC"]
        ('GCSFileSystem', '1')
    """
    os.environ[VARIABLE] = "1"
    for protocol in protocols:
        register_implementation(protocol, GCSFileSystem, clobber=True)
