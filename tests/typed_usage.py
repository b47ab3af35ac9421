"""What a type checker sees of the public API: the items each front end gives, with and without a transform.
mypy reads this file (``pyproject.toml`` lists it); its functions are never called."""

from __future__ import annotations

from typing import IO, Any

import torch
from typing_extensions import assert_type

from torchdata_gcs import GCSClient, GCSIterableDataset, GCSMapDataset, checkpoint, safetensors
from torchdata_gcs.shards import ShardDataset, ShardMapDataset


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


def shard_datasets(client: GCSClient) -> None:
    for sample in ShardDataset("gs://bucket/shards/", client=client):
        assert_type(sample, dict[str, Any])
    for size in ShardDataset("gs://bucket/shards/", transform=len):
        assert_type(size, int)
    assert_type(ShardMapDataset("gs://bucket/shards/", transform=len)[0], int)


def checkpoints(client: GCSClient) -> None:
    assert_type(checkpoint.save({"step": 1}, "gs://bucket/ckpt.pt", client=client), int)
    assert_type(safetensors.load_file("gs://bucket/model.safetensors", client=client), dict[str, torch.Tensor])
    assert_type(safetensors.load_files("gs://bucket/llm/", process_group=None), dict[str, torch.Tensor])
