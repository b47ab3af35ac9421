"""Checkpoints as every checkpoint front end writes and reads them: one streaming writer per object
(multipart or composite, zstd-compressed if asked), ``torch.save`` into it, and the object's checked
bytes read back (decompressed while downloading where a block table allows) for ``torch.load``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Literal, cast

import torch

from .._ops.checksums import ObjectInfo
from .._ops.client import Client
from .._ops.paging import ITEM_FIELDS
from .._ops.urls import parse_url
from .._transport.deadline import call_deadline
from ..config import WriteConfig, Zstd
from .compressed_read import block_table_of, read_decompressed_into
from .compressing import CompressingWriter
from .compression import decompress, is_compressed
from .local_cache import LocalCache, read_through
from .memory_file import memory_file
from .publishing import StreamingWriter
from .ranges import read_into, read_into_buffer
from .serializer_errors import library_errors_first
from .streams import MemoryStream
from .upload import new_writer

__all__ = ["ZIP_MAGIC", "Strategy", "load", "open_reader", "open_writer", "remove", "save", "write_config"]

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


def open_writer(url: str, client: Client, write: WriteConfig) -> StreamingWriter | CompressingWriter:
    """A binary writer that publishes ``url`` on a clean close, as ``write`` says (compressed if it asks)."""
    writer = new_writer(url, client, write)
    return writer if write.compression is None else CompressingWriter(writer, cast(Zstd, write.compression))


def save(obj: Any, url: str, client: Client, write: WriteConfig) -> int:
    """``torch.save(obj)`` streamed to ``url``, under the retry policy's deadline; the published generation."""
    with (
        call_deadline(client.retry),
        open_writer(url, client, write) as writer,
        library_errors_first(),
    ):
        torch.save(obj, cast(IO[bytes], writer))
    assert writer.generation is not None
    return writer.generation


def _object_info(url: str, client: Client) -> ObjectInfo:
    bucket, name = parse_url(url, allow_prefix=False)
    resource = client.head(bucket, name, ITEM_FIELDS, missing_ok=False)
    assert resource is not None
    return ObjectInfo.from_json(resource)


def open_reader(url: str, client: Client) -> IO[bytes]:
    """The object's bytes in memory, checked, decompressed if it was saved compressed."""
    with call_deadline(client.retry):
        buffer = read_into_buffer(url, _object_info(url, client), client)
    return cast(IO[bytes], MemoryStream([decompress(buffer, url)]))


def load(
    url: str, client: Client, *, map_location: Any, weights_only: bool | None, cache: LocalCache | None = None
) -> Any:
    """``torch.load`` of ``url``, compressed or not; mapped from an in-memory file where the system has one. With
    a ``cache``, the object's stored bytes come from it (or are kept in it)."""
    if cache is not None:
        with call_deadline(client.retry):
            info = _object_info(url, client)
            stored = read_through(
                cache, url, info, lambda view: read_into(view, url, info, client), client.stats, client.retry.deadline
            )
        stream = cast(IO[bytes], MemoryStream([memoryview(decompress(stored, url))]))
        return torch.load(stream, map_location=map_location, weights_only=weights_only)
    with call_deadline(client.retry), _downloaded(url, _object_info(url, client), client) as (path, view):
        head = bytes(view[:16])
        if is_compressed(head):  # compressed without a block table: older checkpoints, other zstd writers
            view = memoryview(decompress(view, url))
        elif path is not None and head.startswith(ZIP_MAGIC):
            return torch.load(path, mmap=True, map_location=map_location, weights_only=weights_only)
        stream = cast(IO[bytes], MemoryStream([view]))  # a binary file object, as torch.load takes
        return torch.load(stream, map_location=map_location, weights_only=weights_only)


@contextmanager
def _downloaded(url: str, info: ObjectInfo, client: Client) -> Iterator[tuple[str | None, memoryview]]:
    """The checkpoint's bytes (decompressed, where a block table allows it while downloading), in an
    anonymous in-memory file (its path given) where the system has them, else in a buffer."""
    table = block_table_of(url, info, client)
    size = info.size if table is None else sum(block.raw for block in table[0])
    with memory_file(size) as file:
        path, buffer = (None, bytearray(size)) if file is None else file
        with memoryview(buffer) as view:
            if table is None:
                read_into(view, url, info, client)
            else:
                read_decompressed_into(view, url, info, table, client)
            yield path, view


def remove(url: str, client: Client) -> bool:
    """Delete the checkpoint at ``url``; ``False`` if there was none."""
    bucket, name = parse_url(url, allow_prefix=False)
    with call_deadline(client.retry):
        return client.delete(bucket, name)
