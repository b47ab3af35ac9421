"""The library's own error first, where a serializer reports a failed write as an error of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import GCSError

__all__ = ["library_errors_first"]


@contextmanager
def library_errors_first() -> Iterator[None]:
    """Raise the library's own error when a serializer reports it as one of its own.

    ``torch.save`` turns a failed write into ``RuntimeError: [enforce fail at inline_container.cc]``
    with the write's ``GCSError`` only in its ``__context__``, where ``except GCSError`` cannot see it;
    this raises that ``GCSError`` instead, caused by the serializer's error.
    """
    try:
        yield
    except Exception as exc:
        ours = _first_gcs_error(exc)
        if ours is None or ours is exc:
            raise
        exc.__context__ = exc.__cause__ = None  # ``ours`` is raised caused by ``exc``: no cycle back
        raise ours from exc


def _first_gcs_error(exc: BaseException) -> GCSError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, GCSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
