"""Shared handling of the loaders' input (a DataPipe, an iterable or one URL) and output streams."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper

from .._engines.download import Loaded
from .._engines.streams import MemoryStream
from .._ops.checksums import ObjectInfo
from .._ops.urls import brief
from ..errors import InvalidURIError

Item = str | tuple[str, ObjectInfo]
"""What the loaders take: a ``gs://`` URL, or the ``(url, ObjectInfo)`` pair a listing yields."""

T = TypeVar("T")


def as_source(source: IterDataPipe[T] | Iterable[T] | str) -> IterDataPipe[T] | tuple[Any, ...]:
    """Keep a DataPipe as it is (it is iterated lazily); freeze anything else into a tuple.

    A bare string is one item, not a sequence of characters.
    """
    if isinstance(source, IterDataPipe):
        return source
    if isinstance(source, str):
        return (source,)
    if not isinstance(source, Iterable):
        raise TypeError(f"expected a DataPipe, an iterable of URLs or a URL, got {type(source).__name__}")
    return tuple(source)


def split_item(item: Item) -> tuple[str, ObjectInfo | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], ObjectInfo):
        return item
    raise InvalidURIError(f"expected a gs:// URL or a (url, ObjectInfo) pair, got {brief(item)}")


def as_stream(url: str, data: Loaded) -> StreamWrapper:
    """A loaded object as the binary stream torchdata's decoders expect (seekable unless streamed);
    it pickles, so it crosses from DataLoader workers to the main process."""
    if isinstance(data, bytes):
        stream: io.IOBase = io.BytesIO(data)  # shares the bytes
    else:
        stream = MemoryStream(data) if isinstance(data, list) else data
    return StreamWrapper(stream, name=url)
