"""Settings for talking to GCS: frozen, validated, and safe to pickle into worker processes.

Settings hold configuration, not clients: each process resolves its credentials (Application Default
Credentials unless told otherwise) at its first request; only a google-auth ``Credentials`` object given
as ``ClientConfig(credentials=...)`` is pickled along with the settings into worker processes.

Examples:
    >>> from torchdata_gcs import ClientConfig, TransferConfig
    >>> ClientConfig(endpoint="http://127.0.0.1:4443").endpoint
    'http://127.0.0.1:4443'
    >>> TransferConfig(max_in_flight=32).max_in_flight
    32
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import google.auth.credentials

__all__ = [
    "ClientConfig",
    "RetryConfig",
    "TransferConfig",
    "WriteConfig",
    "Zstd",
    "parse_size",
    "require_integer",
]

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB
"""GCS refuses smaller parts of an XML API multipart upload, except the last."""
MIN_COMPOSE_PART_SIZE = 256 * 1024
"""The smallest part ``strategy="compose"`` writes (each part is an object of its own)."""
MAX_PART_SIZE = 5 * 1024**3
"""GCS refuses larger parts of an XML API multipart upload."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def require_integer(name: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``int`` (not a ``bool`` or ``float``) from ``low`` to ``high``."""
    bounds = f"{low}..{high}" if high is not None else f">= {low}"
    _require(
        isinstance(value, int) and not isinstance(value, bool) and low <= value and (high is None or value <= high),
        f"{name} must be an integer {bounds}, got {value!r}",
    )


_UNITS: dict[str, int] = {"B": 1, **{f"{unit}B": 1000**power for power, unit in enumerate("KMGT", 1)}}
_UNITS.update({f"{unit}IB": 1024**power for power, unit in enumerate("KMGT", 1)})


def parse_size(name: str, size: int | str) -> int:
    """Bytes, from a positive ``int`` or a size such as ``"5GB"`` (powers of 1000) or ``"512MiB"`` (of 1024);
    ``ValueError`` naming the setting ``name`` for anything else.

    >>> parse_size("shard_size", "512MiB"), parse_size("shard_size", "1GB"), parse_size("shard_size", 4096)
    (536870912, 1000000000, 4096)
    """
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?I?B)\s*", size.upper()) if isinstance(size, str) else None
    if match is None or match[2] == "IB" or int(match[1]) == 0:
        raise ValueError(f"{name}: expected a positive number of bytes or a size such as '5GB', got {size!r}")
    return int(match[1]) * _UNITS[match[2]]


@dataclass(frozen=True)
class ClientConfig:
    """Where requests go and how they authenticate.

    Args:
        endpoint: base URL of the JSON API, such as ``http://127.0.0.1:4443`` for an emulator.
            Unset: ``STORAGE_EMULATOR_HOST`` if that is set (read when a client is made from these settings:
            it goes with the client into worker processes), else real GCS.
        anonymous: send no credentials. Unset: anonymous exactly when the endpoint is an emulator
            (taken from ``STORAGE_EMULATOR_HOST``, or a plain ``http://`` endpoint, where a token
            would travel in clear text); otherwise Application Default Credentials.
        credentials_file: path of a service-account or authorized-user JSON file to use instead of
            Application Default Credentials. The path is stored, never the secret it holds.
        credentials: a google-auth ``Credentials`` object to use instead (scoped to read and write
            storage if it needs scopes). It travels with the settings, pickled, into DataLoader
            workers; prefer ``credentials_file`` or ADC where secrets must not be pickled.
            :meth:`from_storage_client` takes a ``google.cloud.storage.Client``'s.
        user_project: project billed for requests to requester-pays buckets (sent as the JSON API's
            ``userProject`` parameter and the XML API's ``x-goog-user-project`` header).
        connect_timeout: seconds to wait for a connection.
        read_timeout: seconds to wait for the next bytes of a response; a request that hangs
            longer fails with a ``TransientError`` and is retried.
        completion_timeout: seconds the completion of a multipart upload may take, which GCS says can
            be several minutes: its request waits that long for its answer (``read_timeout`` does not
            apply), and an answer lost sooner is followed by a look at the object, then by the request
            again, until that long has passed since it was first sent.
    """

    endpoint: str | None = None
    anonymous: bool | None = None
    credentials_file: str | None = None
    user_project: str | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    completion_timeout: float = 600.0
    credentials: google.auth.credentials.Credentials | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            _require(
                parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.query,
                f"endpoint must be an http(s) base URL such as http://127.0.0.1:4443, got {self.endpoint!r}",
            )
            _require(
                parts.username is None and parts.password is None,
                "endpoint must not embed credentials",
            )
        _require(
            self.credentials is None or isinstance(self.credentials, google.auth.credentials.Credentials),
            f"credentials must be a google.auth.credentials.Credentials, got {type(self.credentials).__name__}",
        )
        _require(
            not (self.anonymous and (self.credentials_file or self.credentials)),
            "anonymous=True and credentials contradict each other",
        )
        _require(
            not (self.credentials_file and self.credentials),
            "give credentials_file or credentials, not both",
        )
        _require(self.connect_timeout > 0, f"connect_timeout must be > 0, got {self.connect_timeout}")
        _require(self.read_timeout > 0, f"read_timeout must be > 0, got {self.read_timeout}")
        _require(self.completion_timeout > 0, f"completion_timeout must be > 0, got {self.completion_timeout}")

    @classmethod
    def from_storage_client(cls, client: Any, **settings: Any) -> ClientConfig:
        """The settings of a ``google.cloud.storage.Client``: its endpoint and credentials (anonymous for
        an anonymous client). Its project is not taken: nothing here bills or creates by project (pass
        ``user_project=`` for requester-pays buckets). ``settings`` are the other fields.

        Examples:
            >>> from google.cloud import storage
            >>> ClientConfig.from_storage_client(storage.Client.create_anonymous_client()).anonymous
            True
        """
        credentials = getattr(client, "_credentials", None)
        if not isinstance(credentials, google.auth.credentials.Credentials):
            raise TypeError(f"expected a google.cloud.storage.Client, got {type(client).__name__}")
        endpoint = getattr(client, "api_endpoint", None)
        if isinstance(credentials, google.auth.credentials.AnonymousCredentials):
            return cls(endpoint=endpoint, anonymous=True, **settings)
        return cls(endpoint=endpoint, anonymous=False, credentials=credentials, **settings)


@dataclass(frozen=True)
class RetryConfig:
    """How transient failures (408, 429, 5xx, resets, timeouts, truncated bodies) are retried.

    Delays grow exponentially from ``initial_delay`` by ``multiplier`` up to ``max_delay``, each
    drawn with full jitter; a ``Retry-After`` answer is honoured. ``deadline`` bounds a call as a
    whole, every attempt, wait and byte included (a checkpoint save or load, an fsspec call; each
    request of a loader or lister): past it, ``DeadlineExceededError``. Answers that ask to try
    again (408, 429, 5xx: throttling, an outage) are retried until then however many come; other
    failures (resets, timeouts, damaged answers) at most ``max_attempts`` times.

    429 is the process's business, not one request's: every loader and writer of a process shares
    one throttle, which after a 429 paces the process's requests (retries first) at a share of what
    the bucket granted lately and grows the pace back as requests succeed; a 429 retry waits a
    full-jitter delay at the process's backoff step, which grows with each cut that no success
    follows. Sustained 429s slow a job down without killing it while it makes progress: a request
    answered 429 fails only when no request of the process has succeeded for ``deadline`` seconds
    (a call's deadline, such as a checkpoint save's, still bounds the call).

    A write is retried only where GCS makes a repeat harmless (its retry strategy): an upload, compose
    or rewrite with an ``ifGenerationMatch`` precondition, a delete of one generation, an XML multipart
    upload's requests. The library gives its own writes such a precondition; a write without one is
    sent once, since a late repeat could replace or delete a newer object, unless
    ``retry_unconditional_writes`` asks for it to be retried as well.
    """

    max_attempts: int = 8
    deadline: float = 300.0
    initial_delay: float = 0.1
    max_delay: float = 30.0
    multiplier: float = 2.0
    retry_unconditional_writes: bool = False

    def __post_init__(self) -> None:
        require_integer("max_attempts", self.max_attempts, 1)
        _require(self.deadline > 0, f"deadline must be > 0 seconds, got {self.deadline}")
        _require(self.initial_delay >= 0, f"initial_delay must be >= 0, got {self.initial_delay}")
        _require(
            self.max_delay >= self.initial_delay,
            f"max_delay ({self.max_delay}) must be >= initial_delay ({self.initial_delay})",
        )
        _require(self.multiplier >= 1, f"multiplier must be >= 1, got {self.multiplier}")


@dataclass(frozen=True)
class TransferConfig:
    """How much work is in flight.

    Args:
        max_in_flight: concurrent requests per DataPipe instance (per worker process).
        max_buffered_bytes: bytes downloaded ahead of the consumer, in flight or waiting to be
            yielded. One object larger than this is still fetched, alone.
        part_size: an object larger than this is read as concurrent ranged GETs of this size; a checkpoint
            (an object read whole into one buffer) as 16 smaller ones where each still holds 256 KiB.
        hold_until_verified: hand out no byte of an object before all of it has been checked against
            its length and crc32c. GCS reports a crc32c of the whole object only, so an object larger
            than ``max_buffered_bytes`` then comes whole, held in memory (alone, when its turn comes),
            instead of as a stream whose bytes are checked when its reader reaches the end.
    """

    max_in_flight: int = 128
    max_buffered_bytes: int = 256 * MiB
    part_size: int = 32 * MiB
    hold_until_verified: bool = False

    def __post_init__(self) -> None:
        require_integer("max_in_flight", self.max_in_flight, 1, 1024)
        require_integer("max_buffered_bytes", self.max_buffered_bytes, 1)
        require_integer("part_size", self.part_size, 256 * 1024)
        _require(
            isinstance(self.hold_until_verified, bool),
            f"hold_until_verified must be True or False, got {self.hold_until_verified!r}",
        )


@dataclass(frozen=True)
class Zstd:
    """zstd compression of what a checkpoint writer writes; readers detect it themselves.

    The stream is cut into ``block_size`` blocks compressed independently on ``threads`` threads
    (decompressed in parallel too), as standard zstd frames with checksums that ``zstd -d`` and any
    zstd library read back. With ``byte_grouping``, each block's bytes are regrouped by position
    within 2, 4 or 8-byte words before compression (all first bytes, then all second bytes, ...)
    when a sample of the block compresses better so: the exponent bytes of floats then sit together,
    which zstd finds far more compressible than interleaved with mantissas. That is a format of this
    library's own (smaller on trained float32 weights: ``benchmarks/README.md``), which only it reads.

    Args:
        level: zstd level, 1 (fast) to 19 (small); negative levels are faster still. 1 by default: on
            trained float32 weights with Adam state, levels 3 and 9 came out no smaller once bytes were
            grouped, and slower (``benchmarks/README.md``, compression).
        threads: blocks compressed at once; 0 means one per CPU, at most 4.
        block_size: bytes of input per independently compressed block.
        byte_grouping: try regrouping bytes per block and keep it where it compresses better
            (this library's format; off: standard zstd).
    """

    level: int = 1
    threads: int = 0
    block_size: int = 4 * MiB
    byte_grouping: bool = False

    def __post_init__(self) -> None:
        require_integer("level", self.level, -7, 19)
        require_integer("threads", self.threads, 0, 64)
        require_integer("block_size", self.block_size, 64 * 1024, 256 * MiB)


@dataclass(frozen=True)
class WriteConfig:
    """How a writer streams an object out: in parts of ``part_size``, ``max_parts_in_flight`` at once,
    through ``strategy``, optionally compressed. Taken by :func:`torchdata_gcs.checkpoint.save`,
    :func:`~torchdata_gcs.checkpoint.open_writer`, ``save_by_gcs``, ``GCSStorageWriter`` and
    ``GCSCheckpointIO``. Memory stays near ``part_size x (max_parts_in_flight + 1)``.

    Args:
        part_size: bytes per part (``"multipart"``: 5 MiB to 5 GiB; ``"compose"``: 256 KiB to 5 GiB);
            parts double in size every 1,000 parts, so any object fits GCS's 10,000-part limit.
        max_parts_in_flight: parts uploaded at once.
        strategy: ``"multipart"`` (GCS's XML API multipart upload) or ``"compose"`` (each part an object,
            composed at the end: for endpoints without the XML API).
        compression: ``None``, ``"zstd"`` or ``Zstd(...)``; ``"zstd"`` is kept as ``Zstd()``.

    Examples:
        >>> WriteConfig(part_size=16 * 1024 * 1024, compression="zstd").compression
        Zstd(level=1, threads=0, block_size=4194304, byte_grouping=False)
    """

    part_size: int = 8 * MiB
    max_parts_in_flight: int = 8
    strategy: Literal["multipart", "compose"] = "multipart"
    compression: Literal["zstd"] | Zstd | None = None

    def __post_init__(self) -> None:
        _require(
            self.strategy in ("multipart", "compose"),
            f"strategy must be 'multipart' or 'compose', got {self.strategy!r}",
        )
        smallest = MIN_PART_SIZE if self.strategy == "multipart" else MIN_COMPOSE_PART_SIZE
        require_integer("part_size", self.part_size, smallest, MAX_PART_SIZE)
        require_integer("max_parts_in_flight", self.max_parts_in_flight, 1)
        _require(
            self.compression is None or self.compression == "zstd" or isinstance(self.compression, Zstd),
            f"compression must be None, 'zstd' or a Zstd(...), got {self.compression!r}",
        )
        if self.compression == "zstd":
            object.__setattr__(self, "compression", Zstd())
