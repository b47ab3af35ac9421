"""Shared handling of the loaders' input: a DataPipe, an iterable or one URL."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe

from .._ops.checksums import ObjectInfo
from .._ops.urls import brief, not_a_url
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
    if isinstance(source, os.PathLike) or not isinstance(source, Iterable):
        raise InvalidURIError(f"{not_a_url(source)}, or a DataPipe of them")
    return tuple(source)


def split_item(item: Item) -> tuple[str, ObjectInfo | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], ObjectInfo):
        return item
    raise InvalidURIError(f"expected a gs:// URL or a (url, ObjectInfo) pair, got {brief(item)}")
