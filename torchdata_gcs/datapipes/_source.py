"""Shared handling of a DataPipe's input: a DataPipe, an iterable, or a single string."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe

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
