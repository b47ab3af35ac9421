"""What a front end makes of each object it reads: the one rule for a ``transform``, the same in every front end."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import IO, Any, Generic, TypeVar, cast

__all__ = ["ItemMaker", "Transform"]

T = TypeVar("T")

Transform = Callable[[str, IO[bytes]], T] | Callable[[IO[bytes]], T]
"""What a front end does with each object: given the binary stream over its bytes (whose ``name`` is the
URL), or its URL and that stream, the item."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _stream_alone(transform: Callable[..., Any]) -> bool:
    """Whether ``transform`` is given the stream alone (it takes one positional argument) rather than the URL
    and the stream (it takes two); ``TypeError`` if it takes neither. A callable whose signature cannot be
    read (some builtins') is given the stream alone."""
    try:
        parameters = list(inspect.signature(transform).parameters.values())
    except (TypeError, ValueError):
        return True
    required = sum(p.kind in _POSITIONAL and p.default is p.empty for p in parameters)
    accepted = sum(p.kind in _POSITIONAL for p in parameters)
    varying = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    needs_keyword = any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in parameters)
    stream_alone: bool | None = None
    if not needs_keyword:  # a required keyword-only argument would never be given
        if required == 1 or (required == 0 and accepted == 1 and not varying):
            stream_alone = True
        elif required == 2 or (required == 0 and (accepted >= 2 or varying)):
            stream_alone = False
    if stream_alone is None:
        name = getattr(transform, "__qualname__", type(transform).__name__)
        raise TypeError(
            "transform must take the stream, transform(stream), or the URL and the stream, "
            f"transform(url, stream); {name}{inspect.signature(transform)} takes neither"
        )
    return stream_alone


class ItemMaker(Generic[T]):
    """``transform`` as every front end calls it: ``transform(stream)`` for a callable that takes one
    positional argument, ``transform(url, stream)`` for one that takes two (checked when made: anything
    else raises ``TypeError`` naming the shapes accepted). Pickles when ``transform`` does."""

    __slots__ = ("transform", "stream_alone")

    def __init__(self, transform: Transform[T]) -> None:
        if not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self.transform = transform
        self.stream_alone = _stream_alone(transform)

    def __call__(self, url: str, stream: IO[bytes]) -> T:
        if self.stream_alone:  # its shape was checked when made
            return cast(Callable[[IO[bytes]], T], self.transform)(stream)
        return cast(Callable[[str, IO[bytes]], T], self.transform)(url, stream)
