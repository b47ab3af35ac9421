"""Checkpoints on GCS: ``torch.save`` streamed out as a parallel multipart upload, ``torch.load`` read back
as concurrent ranges into one buffer.

A save publishes the object only when ``torch.save`` finished without error (else nothing, not even a
half-written object); a load reads the exact version it found, checked against its crc32c.
"""

from __future__ import annotations

from typing import IO, Any, cast

import torch

from ._client import transport_for
from ._download import LoadStats, read_into_buffer
from ._metadata import ObjectInfo
from ._objects import object_resource
from ._parallel_listing import ITEM_FIELDS
from ._streams import MemoryStream
from ._upload import MultipartWriter
from ._uri import parse_url
from .config import ClientConfig, RetryConfig, TransferConfig
from .errors import NotFoundError

__all__ = ["load", "open_writer", "save"]


def open_writer(
    url: str,
    *,
    client: ClientConfig | None = None,
    retry: RetryConfig | None = None,
    part_size: int = 32 * 1024 * 1024,
    max_parts_in_flight: int = 4,
) -> MultipartWriter:
    """A binary file object for ``torch.save`` (or any writer) that publishes ``url`` on a clean close.

    Use it in a ``with`` block: an exception inside aborts the upload and publishes nothing. Memory
    stays near ``part_size x (max_parts_in_flight + 1)``.
    """
    return MultipartWriter(
        url, client=client, retry=retry, part_size=part_size, max_parts_in_flight=max_parts_in_flight
    )


def save(
    obj: Any,
    url: str,
    *,
    client: ClientConfig | None = None,
    retry: RetryConfig | None = None,
    part_size: int = 32 * 1024 * 1024,
    max_parts_in_flight: int = 4,
) -> int:
    """``torch.save(obj)`` to ``url``, streamed; returns the published generation.

    Example:
        >>> import torch
        >>> from torchdata_gcs import checkpoint, testing
        >>> with testing.Emulator() as emulator:
        ...     emulator.create_bucket("ckpt")
        ...     _ = checkpoint.save({"w": torch.arange(4.0)}, "gs://ckpt/step-1.pt", client=emulator.client_config)
        ...     checkpoint.load("gs://ckpt/step-1.pt", client=emulator.client_config)
        {'w': tensor([0., 1., 2., 3.])}
    """
    settings = {"part_size": part_size, "max_parts_in_flight": max_parts_in_flight}
    with open_writer(url, client=client, retry=retry, **settings) as writer:
        torch.save(obj, cast(IO[bytes], writer))
    assert writer.generation is not None
    return writer.generation


def load(
    url: str,
    *,
    map_location: Any = None,
    weights_only: bool = True,
    client: ClientConfig | None = None,
    transfer: TransferConfig | None = None,
    retry: RetryConfig | None = None,
) -> Any:
    """``torch.load`` of ``url``: its bytes are read as concurrent ranges of ``transfer.part_size``
    into one buffer (no second copy), checked against GCS's crc32c, then unpickled from it."""
    client, transfer, retry = client or ClientConfig(), transfer or TransferConfig(), retry or RetryConfig()
    bucket, name = parse_url(url, allow_prefix=False)
    resource = object_resource(transport_for(client), bucket, name, retry, ITEM_FIELDS)
    if resource is None:
        raise NotFoundError(f"{url} does not exist", url=url, status=404)
    buffer = read_into_buffer(url, ObjectInfo.from_json(resource), client, transfer, retry, LoadStats())
    stream = cast(IO[bytes], MemoryStream([buffer]))
    return torch.load(stream, map_location=map_location, weights_only=weights_only)
