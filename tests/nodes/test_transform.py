"""The README's nodes snippet with a one-argument ``decode(stream)`` and with ``decode(url, stream)``, and
``ComposeShards`` likewise: the same items either way, as the datasets give them; another shape is refused
when the node is made."""

from __future__ import annotations

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import Loader

from tests.doc_blocks import doc_block
from torchdata_gcs.nodes import ComposeShards, ListFiles, LoadFiles
from torchdata_gcs.testing import Emulator

BUCKET = "nodes-transform"
OBJECTS = {f"train/{i:02d}.png": b"image %d" % i for i in range(10)}  # README's snippet reads *.png


@pytest.fixture(scope="module")
def seeded(gcs_emulator: Emulator) -> str:
    gcs_emulator.seed(BUCKET, OBJECTS)
    return f"gs://{BUCKET}/train/"


def decode(stream) -> tuple[str, bytes]:
    return stream.name, stream.read()


def decode_with_url(url: str, stream) -> tuple[str, bytes]:
    return url, stream.read()


EXPECTED = sorted((f"gs://{BUCKET}/{name}", data) for name, data in OBJECTS.items())


@pytest.mark.parametrize("decoder", [decode, decode_with_url], ids=["stream", "url-and-stream"])
def test_the_readme_load_files_takes_either_decode(
    decoder, seeded: str, gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)  # the snippet's default client
    namespace = {"decode": decoder}
    exec(doc_block("node = LoadFiles(ListFiles(").replace("gs://my-bucket/train/", seeded), namespace)  # noqa: S102
    assert sorted(item for batch in namespace["loader"] for item in batch) == EXPECTED


@pytest.mark.parametrize("decoder", [decode, decode_with_url], ids=["stream", "url-and-stream"])
def test_compose_shards_takes_either_decode(decoder, seeded: str, client) -> None:
    node = ComposeShards(ListFiles(seeded, with_metadata=True, client=client), transform=decoder, client=client)
    assert sorted(Loader(node)) == EXPECTED


@pytest.mark.parametrize("kind", [LoadFiles, ComposeShards])
def test_a_transform_of_another_shape_is_refused_when_the_node_is_made(kind, seeded: str, client) -> None:
    with pytest.raises(TypeError, match=r"transform\(stream\), or .* transform\(url, stream\)"):
        kind(ListFiles(seeded, client=client), transform=lambda url, stream, extra: None, client=client)
