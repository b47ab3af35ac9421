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

from typing import IO, Any, Literal, cast

import torch

from ._engines.compression import CompressingWriter, decompress
from ._engines.download import LoadStats, read_into_buffer
from ._engines.parallel_listing import ITEM_FIELDS
from ._engines.streams import MemoryStream
from ._engines.upload import (
    DEFAULT_PART_SIZE,
    DEFAULT_PARTS_IN_FLIGHT,
    CompositeWriter,
    MultipartWriter,
    StreamingWriter,
)
from ._ops.checksums import ObjectInfo
from ._ops.objects import delete_object, object_resource
from ._ops.urls import parse_url
from ._transport.http import transport_for
from .config import ClientConfig, RetryConfig, TransferConfig, Zstd
from .errors import NotFoundError, library_errors_first

__all__ = [
    "DEFAULT_PARTS_IN_FLIGHT",
    "DEFAULT_PART_SIZE",
    "Strategy",
    "check_writer_settings",
    "load",
    "open_reader",
    "open_writer",
    "remove",
    "save",
]

Strategy = Literal["multipart", "compose"]
_WRITERS: dict[str, type[StreamingWriter]] = {"multipart": MultipartWriter, "compose": CompositeWriter}


def check_writer_settings(
    part_size: int, max_parts_in_flight: int, strategy: str, compression: str | Zstd | None
) -> Zstd | None:
    """Raise ``ValueError`` for settings no writer accepts; the compression settings, resolved."""
    if strategy not in _WRITERS:
        raise ValueError(f"strategy must be 'multipart' or 'compose', got {strategy!r}")
    _WRITERS[strategy].check_settings(part_size, max_parts_in_flight)
    if compression is None or isinstance(compression, Zstd):
        return compression
    if compression == "zstd":
        return Zstd()
    raise ValueError(f"compression must be None, 'zstd' or a Zstd(...), got {compression!r}")


def open_writer(
    url: str,
    *,
    client: ClientConfig | None = None,
    retry: RetryConfig | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    max_parts_in_flight: int = DEFAULT_PARTS_IN_FLIGHT,
    strategy: Strategy = "multipart",
    compression: str | Zstd | None = None,
) -> StreamingWriter | CompressingWriter:
    """A binary file object for ``torch.save`` (or any writer) that publishes ``url`` on a clean close.

    Use it in a ``with`` block: an exception inside discards the parts and publishes nothing. Memory
    stays near ``part_size x (max_parts_in_flight + 1)`` (plus 8 compression blocks when compressing).

    Args:
        url: ``gs://bucket/object``.
        client: endpoint and credentials; defaults to ``ClientConfig()``.
        retry: retry policy for every request.
        part_size: bytes per part (``multipart``: at least 5 MiB; ``compose``: at least 256 KiB);
            doubles every 1,000 parts so any object fits GCS's 10,000-part limit.
        max_parts_in_flight: parts uploaded at once.
        strategy: ``"multipart"`` or ``"compose"`` (see the module's description).
        compression: ``None``, ``"zstd"`` or ``Zstd(level=..., threads=...)``.
    """
    settings = check_writer_settings(part_size, max_parts_in_flight, strategy, compression)
    writer = _WRITERS[strategy](
        url, client=client, retry=retry, part_size=part_size, max_parts_in_flight=max_parts_in_flight
    )
    return writer if settings is None else CompressingWriter(writer, settings)


def save(
    obj: Any,
    url: str,
    *,
    client: ClientConfig | None = None,
    retry: RetryConfig | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    max_parts_in_flight: int = DEFAULT_PARTS_IN_FLIGHT,
    strategy: Strategy = "multipart",
    compression: str | Zstd | None = None,
) -> int:
    """``torch.save(obj)`` to ``url``, streamed; returns the published generation. The settings are
    :func:`open_writer`'s.

    Example:
        >>> import torch
        >>> from torchdata_gcs import checkpoint, testing
        >>> with testing.Emulator() as emulator:
        ...     emulator.create_bucket("ckpt")
        ...     _ = checkpoint.save({"w": torch.arange(4.0)}, "gs://ckpt/step-1.pt", client=emulator.client_config)
        ...     _ = checkpoint.save(
        ...         {"w": torch.ones(3)}, "gs://ckpt/step-2.pt", client=emulator.client_config, compression="zstd"
        ...     )
        ...     checkpoint.load("gs://ckpt/step-1.pt", client=emulator.client_config)
        ...     checkpoint.load("gs://ckpt/step-2.pt", client=emulator.client_config)
        {'w': tensor([0., 1., 2., 3.])}
        {'w': tensor([1., 1., 1.])}
    """
    with open_writer(
        url,
        client=client,
        retry=retry,
        part_size=part_size,
        max_parts_in_flight=max_parts_in_flight,
        strategy=strategy,
        compression=compression,
    ) as writer, library_errors_first():
        torch.save(obj, cast(IO[bytes], writer))
    assert writer.generation is not None
    return writer.generation


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
        NotFoundError: no such object.
        IntegrityError: the bytes (or their compression) do not check out.
    """
    client, transfer, retry = client or ClientConfig(), transfer or TransferConfig(), retry or RetryConfig()
    bucket, name = parse_url(url, allow_prefix=False)
    resource = object_resource(transport_for(client), bucket, name, retry, ITEM_FIELDS)
    if resource is None:
        raise NotFoundError(f"{url} does not exist", url=url, status=404)
    buffer = read_into_buffer(url, ObjectInfo.from_json(resource), client, transfer, retry, LoadStats())
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
    """``torch.load`` of ``url``, read through :func:`open_reader` (compressed or not); ``weights_only=None``
    leaves the choice to ``torch.load``'s own default."""
    stream = open_reader(url, client=client, transfer=transfer, retry=retry)
    return torch.load(stream, map_location=map_location, weights_only=weights_only)


def remove(url: str, *, client: ClientConfig | None = None, retry: RetryConfig | None = None) -> bool:
    """Delete the checkpoint at ``url``; ``False`` if there was none."""
    bucket, name = parse_url(url, allow_prefix=False)
    return delete_object(transport_for(client or ClientConfig()), bucket, name, retry or RetryConfig())
