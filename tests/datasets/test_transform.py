"""README's datasets snippets with a one-argument ``decode(stream)`` and with ``decode(url, stream)``: the same
items either way; a transform of another shape is refused when the dataset is made."""

from __future__ import annotations

import pytest

from tests.doc_blocks import doc_block
from torchdata_gcs import GCSIterableDataset, GCSMapDataset
from torchdata_gcs.testing import Emulator

BUCKET = "datasets-transform"
OBJECTS = {f"train/{i:02d}.png": b"image %d" % i for i in range(10)}  # README's snippets read *.png


@pytest.fixture(scope="module")
def seeded(gcs_emulator: Emulator) -> str:
    gcs_emulator.seed(BUCKET, OBJECTS)
    return f"gs://{BUCKET}/train/"


def decode(stream) -> tuple[str, bytes]:
    return stream.name, stream.read()


def decode_with_url(url: str, stream) -> tuple[str, bytes]:
    return url, stream.read()


def expected() -> list[tuple[str, bytes]]:
    return sorted((f"gs://{BUCKET}/{name}", data) for name, data in OBJECTS.items())


def run_snippet(containing: str, prefix: str, decoder) -> list[tuple[str, bytes]]:
    snippet = doc_block(containing).replace("gs://my-bucket/train/", prefix)
    snippet = snippet.replace("num_workers=2", "num_workers=0")
    namespace = {"decode": decoder}
    exec(snippet, namespace)  # noqa: S102 - our own README
    return sorted((url, data) for batch in namespace["loader"] for url, data in zip(*batch, strict=True))


@pytest.mark.parametrize("decoder", [decode, decode_with_url], ids=["stream", "url-and-stream"])
def test_the_readme_map_dataset_takes_either_decode(
    decoder, seeded: str, gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)  # the snippet's default client
    assert run_snippet("images = next(iter(loader))", seeded, decoder) == expected()


@pytest.mark.parametrize("decoder", [decode, decode_with_url], ids=["stream", "url-and-stream"])
def test_the_readme_iterable_dataset_takes_either_decode(
    decoder, seeded: str, gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchdata.stateful_dataloader", reason="the snippet's StatefulDataLoader is torchdata's")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    snippet = 'GCSIterableDataset("gs://my-bucket/train/", masks="*.png", transform=decode, shuffle=True, seed=0)'
    assert run_snippet(snippet, seeded, decoder) == expected()


@pytest.mark.parametrize("kind", [GCSMapDataset, GCSIterableDataset])
def test_a_transform_of_another_shape_is_refused_when_the_dataset_is_made(kind, seeded: str, client) -> None:
    with pytest.raises(TypeError, match=r"transform\(stream\), or .* transform\(url, stream\)"):
        kind(seeded, transform=lambda url, stream, extra: None, client=client)
