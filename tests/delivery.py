"""What every exactly-once test checks of the items a loader delivered."""

from __future__ import annotations

import collections


def read(url: str, stream) -> tuple[str, bytes]:
    """A transform that reads each object whole where it is loaded."""
    return url, stream.read()


def assert_exactly_once(delivered: list[tuple[str, bytes]], expected: dict[str, bytes]) -> None:
    counts = collections.Counter(url for url, _ in delivered)
    assert set(counts) == set(expected), "missing or unexpected objects"
    assert max(counts.values()) == 1, "an object was delivered more than once"
    assert all(data == expected[url] for url, data in delivered), "bytes differ"
