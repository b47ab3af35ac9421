"""Checkpoints on GCS: ``torch.save`` streamed out in parallel parts, ``torch.load`` read back as
concurrent ranges into one buffer.

A save publishes the object only when ``torch.save`` finished without error (else nothing, not even a
half-written object); a load reads the exact version it found, checked against its crc32c, and
decompresses it if it was saved compressed (no need to say so).

Two upload strategies: ``"multipart"`` (GCS's XML API multipart upload, the default) and
``"compose"`` (parts as temporary objects, then composed; for endpoints without the XML API, such
as the emulator, or buckets where multipart uploads are not wanted).
"""

from __future__ import annotations

from typing import IO, Any

from ._engines import checkpoints
from ._engines.checkpoints import Strategy, write_config
from ._engines.compressing import CompressingWriter
from ._engines.local_cache import LocalCache, check_cache
from ._engines.publishing import StreamingWriter
from ._ops.client import Client, GCSClient
from .config import ClientConfig, RetryConfig, TransferConfig, WriteConfig, Zstd

__all__ = [
    "Strategy",
    "load",
    "open_reader",
    "open_writer",
    "remove",
    "save",
    "write_config",
]


def open_writer(
    url: str,
    *,
    client: GCSClient | ClientConfig | None = None,
    retry: RetryConfig | None = None,
    write: WriteConfig | None = None,
    part_size: int | None = None,
    max_parts_in_flight: int | None = None,
    strategy: Strategy | None = None,
    compression: str | Zstd | None = None,
) -> StreamingWriter | CompressingWriter:
    """A binary file object for ``torch.save`` (or any writer) that publishes ``url`` on a clean close.

    Use it in a ``with`` block: an exception inside discards the parts and publishes nothing. Memory
    stays near ``part_size x (max_parts_in_flight + 1)`` (plus 8 compression blocks when compressing).
    Where the endpoint serves no XML API multipart upload (the bare emulator), ``strategy="multipart"``
    writes as ``"compose"`` does, said once in a log line.

    ``part_size``, ``max_parts_in_flight``, ``strategy`` and ``compression`` are deprecated: use ``write``.

    Args:
        url: ``gs://bucket/object``.
        client: a ``GCSClient`` (or the ``ClientConfig`` of one): endpoint, credentials, transport; the default
            takes ``STORAGE_EMULATOR_HOST``, then Application Default Credentials.
        retry: retry policy for every request, in place of the client's own.
        write: part size, parts in flight, strategy and compression (:class:`WriteConfig`).
    """
    write = write_config(write, "open_writer", part_size=part_size, max_parts_in_flight=max_parts_in_flight,
                         strategy=strategy, compression=compression)  # fmt: skip
    return checkpoints.open_writer(url, Client(client, retry), write)


def save(
    obj: Any,
    url: str,
    *,
    client: GCSClient | ClientConfig | None = None,
    retry: RetryConfig | None = None,
    write: WriteConfig | None = None,
    part_size: int | None = None,
    max_parts_in_flight: int | None = None,
    strategy: Strategy | None = None,
    compression: str | Zstd | None = None,
) -> int:
    """``torch.save(obj)`` to ``url``, streamed; returns the published generation. The settings are
    :func:`open_writer`'s.

    Examples:
        >>> import torch
        >>> from torchdata_gcs import WriteConfig, checkpoint, testing
        >>> with testing.Emulator() as emulator:
        ...     emulator.create_bucket("ckpt")
        ...     _ = checkpoint.save({"w": torch.arange(4.0)}, "gs://ckpt/step-1.pt", client=emulator.client_config)
        ...     _ = checkpoint.save(
        ...         {"w": torch.ones(3)}, "gs://ckpt/step-2.pt", client=emulator.client_config,
        ...         write=WriteConfig(compression="zstd"),
        ...     )
        ...     checkpoint.load("gs://ckpt/step-1.pt", client=emulator.client_config)
        ...     checkpoint.load("gs://ckpt/step-2.pt", client=emulator.client_config)
        {'w': tensor([0., 1., 2., 3.])}
        {'w': tensor([1., 1., 1.])}
    """
    write = write_config(write, "save", part_size=part_size, max_parts_in_flight=max_parts_in_flight,
                         strategy=strategy, compression=compression)  # fmt: skip
    return checkpoints.save(obj, url, Client(client, retry), write)


def open_reader(
    url: str,
    *,
    client: GCSClient | ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
) -> IO[bytes]:
    """The object's bytes as a seekable binary stream held in memory, decompressed if it was saved
    compressed. They are read as concurrent ranges into one buffer (16 in flight where the object is 4 MiB
    or more, none over ``transfer.part_size``; no second copy of an uncompressed object) and checked
    against GCS's crc32c.

    Raises:
        NotFoundError: no such object, or no such bucket.
        IntegrityError: the bytes (or their compression) do not check out.
    """
    return checkpoints.open_reader(url, Client(client, retry, transfer=transfer))


def load(
    url: str,
    *,
    map_location: Any = None,
    weights_only: bool | None = True,
    client: GCSClient | ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
    cache: LocalCache | None = None,
) -> Any:
    """``torch.load`` of ``url`` (compressed or not); ``weights_only=None`` leaves the choice to
    ``torch.load``'s own default.

    The checkpoint is read as concurrent checked ranges; a compressed one is decompressed range by
    range as it arrives, on several threads. On Linux the bytes land in an anonymous in-memory file
    that ``torch.load(mmap=True)`` then maps: the tensors use those bytes themselves, so loading holds
    the checkpoint once, not twice. With a ``cache`` (a ``LocalCache``), the checkpoint's stored bytes are
    read from this machine's disk if its version is there, else downloaded once for every process of the
    machine and kept; they are then held in memory (no mapping).
    """
    gcs = Client(client, retry, transfer=transfer)
    return checkpoints.load(url, gcs, map_location=map_location, weights_only=weights_only, cache=check_cache(cache))


def remove(url: str, *, client: GCSClient | ClientConfig | None = None, retry: RetryConfig | None = None) -> bool:
    """Delete the checkpoint at ``url``; ``False`` if there was none."""
    return checkpoints.remove(url, Client(client, retry))
