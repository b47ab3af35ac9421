"""The filesystem: :class:`GCSFileSystem`, made of its parts (paths, calls, the listings cache, listing,
files, changes, removing, buckets) and built from fsspec's and gcsfs's arguments."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any
from urllib.parse import urlsplit

from .._ops.attributes import kms_key
from .._ops.client import Client, GCSClient, client_of
from .._transport.loop import io_loop  # the loop fsspec runs the blocking methods on: no _ops name is a loop
from ..config import ClientConfig, RetryConfig, TransferConfig, WriteConfig
from .buckets import Buckets
from .changes import Changes
from .files import PublishingTransaction
from .options import GCSFS_ONLY, client_from_gcsfs_options, listings_cache_options
from .removing import Removing

__all__ = ["GCSFileSystem"]


class GCSFileSystem(Changes, Removing, Buckets):
    """GCS as an fsspec ``AsyncFileSystem``, on the same engines as the DataPipes and checkpoints.

    Args:
        client: a ``GCSClient`` (or the ``ClientConfig`` of one): endpoint, credentials, transport; the default
            takes ``STORAGE_EMULATOR_HOST``, then Application Default Credentials.
        retry: how transient failures are retried, in place of the client's own.
        transfer: requests in flight per call and the part size of concurrent ranged reads, in place of the
            client's own.
        write: part size, parts in flight and strategy of streamed writes (``compression`` must be
            ``None``: files are stored as written; fsspec's own ``compression=`` compresses them).
        **storage_options: fsspec's own (``asynchronous``, ``loop``, ``skip_instance_cache``, ...), and
            gcsfs's where they mean something here, so that ``storage_options`` written for gcsfs work
            unchanged: ``token`` (``"anon"``, ``"google_default"``, ``"cloud"`` or ``None``, a credentials
            file path, or a ``google.auth`` ``Credentials``), ``endpoint_url``, ``project``,
            ``requester_pays`` (``True``: bill ``project``; or the project to bill), ``consistency``
            (every read is checked by crc32c whatever it says), ``version_aware`` (see below), ``cache_timeout``
            (seconds a listing is kept, as ``listings_expiry_time``; 0 or less keeps none), ``block_size`` (how
            far ahead ``open()``'s readers read: 4 MiB by default, ``0`` only what is asked) and
            ``kms_key_name``, the Cloud KMS key every write (and what ``cp``, ``mv_file`` and ``merge`` make) is
            encrypted with unless the write names its own (gcsfs takes it per file). Any other gcsfs argument
            raises ``TypeError`` naming it, rather than being ignored. ``encoding``, ``errors``
            and ``newline`` are the defaults of text-mode ``open()`` (Hugging Face ``datasets`` passes a
            file's encoding so when it streams). ``project`` (with ``client=`` too) is also
            the project whose buckets ``ls("")`` lists and ``mkdir("bucket")`` creates, in
            ``default_location`` if given (else GCS's default, the ``US`` multi-region).

    Directory listings are cached as gcsfs caches them (fsspec's ``use_listings_cache``, default on,
    ``listings_expiry_time``, default never, and ``max_paths``): ``ls`` keeps each directory's listing in
    ``dircache``, and ``info``, ``exists``, ``isdir`` and ``ls`` answer from the cached listing of a path's
    parent. Writes and deletes through this filesystem drop the listings they change, so it never lists
    stale what it changed itself; what another process writes shows once the listing expires, after
    ``invalidate_cache()``, or with ``ls(..., refresh=True)``. Reads (``open``, ``cat``) always ask GCS.

    With ``version_aware=True`` (as gcsfs) a path ``bucket/name#<generation>`` names that version of the
    object, noncurrent ones too: ``info``, ``exists``, ``cat``, ``open``, ``get`` and ``cp`` read it, ``rm``
    deletes it for good; ``ls`` and ``find`` with ``versions=True`` list every version so named. Without it,
    ``#`` is part of a name.

    ``stats`` counts the requests, retries and bytes of every call. The filesystem pickles as its
    settings and works after a fork (its requests go out on the I/O loop of whichever process it is in).

    Examples:
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.create_bucket("demo")
        ...     fs = GCSFileSystem(client=emulator.client_config)
        ...     fs.pipe_file("gs://demo/logs/a.txt", b"alpha")
        ...     with fs.open("gs://demo/logs/b.txt", "wb") as f:
        ...         _ = f.write(b"beta")
        ...     fs.ls("gs://demo/logs", detail=False), fs.cat("gs://demo/logs/b.txt")
        (['demo/logs/a.txt', 'demo/logs/b.txt'], b'beta')
    """

    transaction_type = PublishingTransaction

    def __init__(
        self,
        client: GCSClient | ClientConfig | None = None,
        retry: RetryConfig | None = None,
        transfer: TransferConfig | None = None,
        write: WriteConfig | None = None,
        **storage_options: Any,
    ) -> None:
        kms_key_name = storage_options.pop("kms_key_name", None)
        listings_cache_options(storage_options)
        self._project = storage_options.get("project")
        self._project_known = bool(self._project)
        self.requester_pays: bool | str = storage_options.get("requester_pays", False)
        """gcsfs's: ``True`` bills ``project`` for requests to requester-pays buckets, a string bills that project."""
        self.default_location = storage_options.pop("default_location", None)
        version_aware = bool(storage_options.pop("version_aware", False))
        self.block_size = storage_options.pop("block_size", None)  # gcsfs's; open()'s default
        self._text = {
            key: storage_options.pop(key) for key in ("encoding", "errors", "newline") if key in storage_options
        }
        client = client_from_gcsfs_options(client, storage_options)
        if not storage_options.get("asynchronous"):
            storage_options.setdefault("loop", io_loop())
        super().__init__(**storage_options)
        self.client = client_of(client, retry, transfer)
        """The client every request goes through: its ``config``, ``retry``, ``transfer`` and ``endpoint``."""
        self.write = write or WriteConfig()
        if self.write.compression is not None:
            raise ValueError(
                "GCSFileSystem stores files as written: pass compression= to fsspec.open instead of WriteConfig"
            )
        self.kms_key_name = kms_key(kms_key_name)
        """The Cloud KMS key every write (``cp`` too) encrypts with unless it names its own; ``None``: the
        bucket's default encryption."""
        self._gcs = Client(self.client)
        self.stats = self._gcs.stats
        self.version_aware = version_aware
        self._hierarchical = {}
        self._invalidations = itertools.count()
        self._epoch = next(self._invalidations)
        self._writers = {}

    def __getattr__(self, name: str) -> Any:
        if name in GCSFS_ONLY:
            raise AttributeError(
                f"GCSFileSystem has no {name!r} (gcsfs's): docs/gcsfs-compatibility.md says what to use instead"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def on_google(self) -> bool:
        """Whether requests go to Google's endpoint (a ``*.googleapis.com`` host), not an emulator or another
        server, as gcsfs's ``on_google`` tells."""
        host = urlsplit(self.client.endpoint).hostname or ""
        return host == "googleapis.com" or host.endswith(".googleapis.com")

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the blocking methods run on: the I/O loop of the current process (fork-safe)."""
        return self._loop if self.asynchronous else io_loop()
