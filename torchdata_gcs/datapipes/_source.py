"""Shared handling of the loaders' input: a DataPipe, an iterable or one URL."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe

from .._ops.urls import not_a_url
from ..errors import InvalidURIError

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
