"""What a type checker sees of the public API: the items each front end gives, with and without a transform.
mypy reads this file (``pyproject.toml`` lists it); its functions are never called."""

from __future__ import annotations

from typing import IO

import torch
from typing_extensions import assert_type

from torchdata_gcs import GCSClient, GCSIterableDataset, GCSMapDataset, checkpoint, safetensors


def length(stream: IO[bytes]) -> int:
    return len(stream.read())


def named(url: str, stream: IO[bytes]) -> str:
    return url


def datasets(client: GCSClient) -> None:
    assert_type(GCSMapDataset("gs://bucket/", client=client)[0], tuple[str, bytes])
    assert_type(GCSMapDataset("gs://bucket/", transform=length)[0], int)
    assert_type(GCSMapDataset("gs://bucket/", transform=named).__getitems__([0, 1]), list[str])
    for item in GCSIterableDataset("gs://bucket/", transform=length):
        assert_type(item, int)
    for pair in GCSIterableDataset("gs://bucket/"):
        assert_type(pair, tuple[str, bytes])
    for item in GCSIterableDataset("gs://bucket/", transform=length, locality="node"):
        assert_type(item, int)


def checkpoints(client: GCSClient) -> None:
    assert_type(checkpoint.save({"step": 1}, "gs://bucket/ckpt.pt", client=client), int)
    assert_type(safetensors.load_file("gs://bucket/model.safetensors", client=client), dict[str, torch.Tensor])
    assert_type(safetensors.load_files("gs://bucket/llm/", process_group=None), dict[str, torch.Tensor])
