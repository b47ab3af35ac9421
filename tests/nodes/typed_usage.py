"""What a type checker sees of the nodes: the items ``LoadFiles`` and ``ComposeShards`` give, with and without a
transform (mypy reads this file in the environment with torchdata 0.10+; its functions are never called)."""

from __future__ import annotations

from typing import IO

from typing_extensions import assert_type

from torchdata_gcs.nodes import ComposeShards, EpochObjects, ListFiles, LoadFiles


def length(stream: IO[bytes]) -> int:
    return len(stream.read())


def nodes() -> None:
    listed = ListFiles("gs://bucket/", with_metadata=True)
    assert_type(LoadFiles(listed).next(), tuple[str, IO[bytes]])
    assert_type(LoadFiles(EpochObjects(listed), transform=length).next(), int)
    assert_type(LoadFiles(EpochObjects(listed, locality="node")).next(), tuple[str, IO[bytes]])
    assert_type(ComposeShards(listed, transform=length).next(), int)
