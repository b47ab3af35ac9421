"""ListFiles -> LoadFiles / ComposeShards in torchdata.nodes.Loader: exactly once, and an exact resume."""

from __future__ import annotations

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import Batcher, IterableWrapper, Loader

from tests.delivery import assert_exactly_once, read
from tests.doc_blocks import doc_block
from torchdata_gcs import InvalidURIError, MissingObjectWarning, NotFoundError, ResumeError
from torchdata_gcs.nodes import ComposeShards, ListFiles, LoadFiles
from torchdata_gcs.testing import Emulator

N_OBJECTS = 70


@pytest.fixture(scope="module")
def dataset(gcs_emulator: Emulator) -> tuple[str, dict[str, bytes]]:
    bucket = "nodes-data"
    objects = {f"n/{i:03d}.bin": f"item {i};".encode() * (i % 11 + 1) for i in range(N_OBJECTS)}
    gcs_emulator.seed(bucket, objects)
    return bucket, {f"gs://{bucket}/{name}": data for name, data in objects.items()}


def build(kind, bucket: str, client):
    listed = ListFiles(f"gs://{bucket}/n/", with_metadata=True, client=client)
    return Batcher(kind(listed, transform=read, client=client), batch_size=6, drop_last=False)


@pytest.mark.parametrize("kind", [LoadFiles, ComposeShards])
def test_loader_resumes_mid_epoch_with_nothing_lost_or_repeated(dataset, client, kind) -> None:
    bucket, expected = dataset
    assert_exactly_once([item for batch in Loader(build(kind, bucket, client)) for item in batch], expected)
    loader = Loader(build(kind, bucket, client))
    iterator = iter(loader)
    before = [item for _ in range(4) for item in next(iterator)]
    state = loader.state_dict()
    fresh = Loader(build(kind, bucket, client))
    fresh.load_state_dict(state)
    after = [item for batch in fresh for item in batch]
    assert len(before) == 24 and len(after) == N_OBJECTS - 24
    assert_exactly_once(before + after, expected)


def test_list_files_resumes_after_its_last_url(dataset, client) -> None:
    bucket, expected = dataset
    node = ListFiles(f"gs://{bucket}/n/", client=client)
    first = [next(node) for _ in range(10)]
    fresh = ListFiles(f"gs://{bucket}/n/", client=client)
    fresh.reset(node.state_dict())
    assert first + list(fresh) == sorted(expected)


@pytest.mark.parametrize("kind", [LoadFiles, ComposeShards])
def test_missing_objects_are_skipped_and_the_resume_stays_exact(dataset, client, kind) -> None:
    bucket, expected = dataset
    urls = sorted(expected)
    with_missing = [*urls[:10], f"gs://{bucket}/n/gone-1", *urls[10:30], f"gs://{bucket}/n/gone-2", *urls[30:]]

    def build_with_missing():
        node = kind(IterableWrapper(with_missing), transform=read, skip_missing=True, client=client)
        return Batcher(node, batch_size=6, drop_last=False)

    loader = Loader(build_with_missing())
    iterator = iter(loader)
    with pytest.warns(MissingObjectWarning, match="gone-1"):
        before = [item for _ in range(4) for item in next(iterator)]
    state = loader.state_dict()
    fresh = Loader(build_with_missing())
    fresh.load_state_dict(state)
    with pytest.warns(MissingObjectWarning, match="gone-2"):
        after = [item for batch in fresh for item in batch]
    assert len(before) == 24
    assert_exactly_once(before + after, expected)
    with pytest.raises(NotFoundError, match="gone-1"):
        list(Loader(Batcher(kind(IterableWrapper(with_missing), client=client), batch_size=6)))


def test_compose_shards_refuses_a_reuse_prefix_it_cannot_keep_composites_under(client) -> None:
    for prefix in ("cache", ".torchdata-gcs-tmp/cache/"):
        with pytest.raises(InvalidURIError, match="reuse_prefix"):
            ComposeShards(IterableWrapper([]), reuse_prefix=prefix, client=client)
    with pytest.raises(ValueError, match="storage_classes"):
        ComposeShards(IterableWrapper([]), storage_classes="STANDARD", client=client)


def test_the_readme_nodes_snippet_delivers_every_object_the_last_partial_batch_too(
    gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = "nodes-readme"
    objects = {f"train/{i:03d}.png": f"image {i}".encode() for i in range(300)}  # 4 batches of 64, then 44
    gcs_emulator.seed(bucket, objects)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)  # the snippet's default client
    snippet = doc_block("node = LoadFiles(ListFiles(")
    namespace = {"decode": read}
    exec(snippet.replace("gs://my-bucket/train/", f"gs://{bucket}/train/"), namespace)  # noqa: S102 - our own README
    batches = list(namespace["loader"])
    assert [len(batch) for batch in batches] == [64, 64, 64, 64, 44]
    assert_exactly_once(
        [item for batch in batches for item in batch], {f"gs://{bucket}/{n}": d for n, d in objects.items()}
    )


def test_list_files_refuses_a_malformed_position_or_one_of_other_inputs(dataset, client) -> None:
    bucket, expected = dataset
    node = ListFiles(f"gs://{bucket}/n/", client=client)
    with pytest.raises(ResumeError, match=r"'after' must be None or \[input index >= 0, gs:// URL\], got \[-5, "):
        node.reset({"after": [-5, sorted(expected)[3]]})
    with pytest.raises(ResumeError, match="expected {'after': ...} from a lister"):
        node.reset({"position": 3})
    other = ListFiles(f"gs://{bucket}/other/", client=client, allow_empty=True)
    other.reset({"after": [0, sorted(expected)[3]]})
    with pytest.raises(ResumeError, match=f"here input 0 is gs://{bucket}/other/"):
        next(other)
