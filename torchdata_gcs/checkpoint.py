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

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Literal, cast

import torch

from ._engines.compressed_read import block_table_of, read_decompressed_into
from ._engines.compressing import CompressingWriter
from ._engines.compression import decompress, is_compressed
from ._engines.download import LoadStats
from ._engines.memory_file import memory_file
from ._engines.ranges import read_into, read_into_buffer
from ._engines.streams import MemoryStream
from ._engines.upload import StreamingWriter, library_errors_first, new_writer
from ._ops.checksums import ObjectInfo
from ._ops.client import Client
from ._ops.paging import ITEM_FIELDS
from ._ops.urls import parse_url
from ._transport.deadline import call_deadline
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

Strategy = Literal["multipart", "compose"]
ZIP_MAGIC = b"PK\x03\x04"
"""How ``torch.save``'s archive format starts (the only one ``torch.load`` can map)."""


def write_config(write: WriteConfig | None, where: str, **keywords: Any) -> WriteConfig:
    """``write`` (default ``WriteConfig()``); or, deprecated, the one built from the loose keywords
    (``part_size``, ``max_parts_in_flight``, ``strategy``, ``compression``) of earlier releases."""
    given = {name: value for name, value in keywords.items() if value is not None}
    if not given:
        return write or WriteConfig()
    if write is not None:
        raise TypeError(f"{where}: pass write=WriteConfig(...) or {', '.join(given)}, not both")
    warnings.warn(
        f"{where}({', '.join(f'{name}=' for name in given)}...) is deprecated and goes in the next release: "
        f"pass write=WriteConfig({', '.join(f'{name}=...' for name in given)})",
        DeprecationWarning,
        stacklevel=3,
    )
    return WriteConfig(**given)


def open_writer(
    url: str,
    *,
    client: ClientConfig | None = None,
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

    Args:
        url: ``gs://bucket/object``.
        client: endpoint and credentials; defaults to ``ClientConfig()``.
        retry: retry policy for every request.
        write: part size, parts in flight, strategy and compression (:class:`WriteConfig`).
        part_size, max_parts_in_flight, strategy, compression: deprecated; use ``write``.
    """
    write = write_config(write, "open_writer", part_size=part_size, max_parts_in_flight=max_parts_in_flight,
                         strategy=strategy, compression=compression)  # fmt: skip
    writer = new_writer(url, client or ClientConfig(), retry or RetryConfig(), write)
    return writer if write.compression is None else CompressingWriter(writer, cast(Zstd, write.compression))


def save(
    obj: Any,
    url: str,
    *,
    client: ClientConfig | None = None,
    retry: RetryConfig | None = None,
    write: WriteConfig | None = None,
    part_size: int | None = None,
    max_parts_in_flight: int | None = None,
    strategy: Strategy | None = None,
    compression: str | Zstd | None = None,
) -> int:
    """``torch.save(obj)`` to ``url``, streamed; returns the published generation. The settings are
    :func:`open_writer`'s.

    Example:
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
    retry = retry or RetryConfig()
    with (
        call_deadline(retry),
        open_writer(url, client=client, retry=retry, write=write) as writer,
        library_errors_first(),
    ):
        torch.save(obj, cast(IO[bytes], writer))
    assert writer.generation is not None
    return writer.generation


def _object_info(url: str, client: ClientConfig, retry: RetryConfig) -> ObjectInfo:
    bucket, name = parse_url(url, allow_prefix=False)
    resource = Client(client, retry).head(bucket, name, ITEM_FIELDS, missing_ok=False)
    assert resource is not None
    return ObjectInfo.from_json(resource)


def open_reader(
    url: str,
    *,
    client: ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
) -> IO[bytes]:
    """The object's bytes as a seekable binary stream held in memory, decompressed if it was saved
    compressed. They are read as concurrent ranges of ``transfer.part_size`` into one buffer (no
    second copy of an uncompressed object) and checked against GCS's crc32c.

    Raises:
        NotFoundError: no such object, or no such bucket.
        IntegrityError: the bytes (or their compression) do not check out.
    """
    client, transfer, retry = client or ClientConfig(), transfer or TransferConfig(), retry or RetryConfig()
    with call_deadline(retry):
        buffer = read_into_buffer(url, _object_info(url, client, retry), client, transfer, retry, LoadStats())
    return cast(IO[bytes], MemoryStream([decompress(buffer, url)]))


def load(
    url: str,
    *,
    map_location: Any = None,
    weights_only: bool | None = True,
    client: ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
) -> Any:
    """``torch.load`` of ``url`` (compressed or not); ``weights_only=None`` leaves the choice to
    ``torch.load``'s own default.

    The checkpoint is read as concurrent checked ranges; a compressed one is decompressed range by
    range as it arrives, on several threads. On Linux the bytes land in an anonymous in-memory file
    that ``torch.load(mmap=True)`` then maps: the tensors use those bytes themselves, so loading holds
    the checkpoint once, not twice.
    """
    client, transfer, retry = client or ClientConfig(), transfer or TransferConfig(), retry or RetryConfig()
    with (
        call_deadline(retry),
        _downloaded(url, _object_info(url, client, retry), client, transfer, retry) as (path, view),
    ):
        head = bytes(view[:16])
        if is_compressed(head):  # compressed without a block table: older checkpoints, other zstd writers
            view = memoryview(decompress(view, url))
        elif path is not None and head.startswith(ZIP_MAGIC):
            return torch.load(path, mmap=True, map_location=map_location, weights_only=weights_only)
        return torch.load(MemoryStream([view]), map_location=map_location, weights_only=weights_only)


@contextmanager
def _downloaded(
    url: str, info: ObjectInfo, client: ClientConfig, transfer: TransferConfig, retry: RetryConfig
) -> Iterator[tuple[str | None, memoryview]]:
    """The checkpoint's bytes (decompressed, where a block table allows it while downloading), in an
    anonymous in-memory file (its path given) where the system has them, else in a buffer."""
    stats = LoadStats()
    table = block_table_of(url, info, client, transfer, retry, stats)
    size = info.size if table is None else sum(block.raw for block in table[0])
    with memory_file(size) as file:
        path, buffer = (None, bytearray(size)) if file is None else file
        with memoryview(buffer) as view:
            if table is None:
                read_into(view, url, info, client, transfer, retry, stats)
            else:
                read_decompressed_into(view, url, info, table, client, transfer, retry, stats)
            yield path, view


def remove(url: str, *, client: ClientConfig | None = None, retry: RetryConfig | None = None) -> bool:
    """Delete the checkpoint at ``url``; ``False`` if there was none."""
    bucket, name = parse_url(url, allow_prefix=False)
    retry = retry or RetryConfig()
    with call_deadline(retry):
        return Client(client or ClientConfig(), retry).delete(bucket, name)
