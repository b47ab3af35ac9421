"""The parallel lister that ``ls`` and ``bench`` read a prefix with, kept for its stats."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..config import ClientConfig
from ..datapipes.listing import GCSFileListerIterDataPipe

__all__ = ["listed_with_stats"]


def listed_with_stats(
    url: str, client: ClientConfig, concurrency: int
) -> tuple[GCSFileListerIterDataPipe, Iterator[Any]]:
    """The parallel lister of ``url`` (for its stats) and its ``(url, ObjectInfo)`` pairs."""
    # An empty prefix is an answer here (ls prints 0 objects; bench says there is nothing to measure).
    lister = GCSFileListerIterDataPipe(
        url, with_metadata=True, client=client, concurrency=concurrency, allow_empty=True
    )
    return lister, iter(lister)
