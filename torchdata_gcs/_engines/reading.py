"""The one reading core under every front end: objects read concurrently and delivered in their order as binary
streams, each wait for one recorded; small runs read as server-side composites where a front end asks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import closing
from typing import IO, Protocol

from .._ops.checksums import ObjectInfo
from .._ops.client import Client
from .._ops.urls import brief
from ..errors import InvalidURIError
from .download import Loaded, as_stream, load_in_order
from .local_cache import LocalCache
from .stalls import WaitHistogram, timed

__all__ = ["Grouping", "Item", "read_in_order", "split_item"]

Item = str | tuple[str, ObjectInfo]
"""What the front ends read: a ``gs://`` URL, or the ``(url, ObjectInfo)`` pair a listing yields (then no
metadata request is needed to read it)."""


def split_item(item: object) -> tuple[str, ObjectInfo | None]:
    """``(url, ObjectInfo or None)`` of an :data:`Item`; ``InvalidURIError`` for anything else."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], ObjectInfo):
        return item
    raise InvalidURIError(f"expected a gs:// URL or a (url, ObjectInfo) pair, got {brief(item)}")


class Grouping(Protocol):
    """How runs of objects are read together (``compose.Composing``: as server-side composites)."""

    def load(
        self,
        items: Iterable[tuple[str, ObjectInfo | None]],
        client: Client,
        *,
        skip_missing: bool,
        cache: LocalCache | None,
    ) -> Iterator[tuple[str, Loaded]]: ...


def read_in_order(
    items: Iterable[tuple[str, ObjectInfo | None]],
    client: Client,
    waits: WaitHistogram,
    *,
    skip_missing: bool,
    grouping: Grouping | None = None,
    cache: LocalCache | None = None,
) -> Iterator[tuple[str, IO[bytes]]]:
    """``(url, stream)`` for each object of ``items``, in their order, up to ``client.transfer.max_in_flight``
    requests ahead (one GET each, or as ``grouping`` reads runs of them); each stream is binary, named by the URL
    (``stream.name``), seekable unless the object is larger than the byte budget, and pickles. A missing object
    raises ``NotFoundError``, or with ``skip_missing`` is left out with a ``MissingObjectWarning``. How long the
    consumer waited for each goes into ``waits``. With a ``cache``, an object whose version is there is read from
    it, any other from GCS and then kept. Closing the iterator cancels what is in flight."""
    if grouping is None:
        loaded = load_in_order(items, client, skip_missing=skip_missing, cache=cache)
    else:
        loaded = grouping.load(items, client, skip_missing=skip_missing, cache=cache)
    with closing(timed(loaded, waits)) as reading:
        for url, data in reading:
            yield url, as_stream(url, data)
