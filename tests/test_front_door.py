"""Every front end that expands ``gs://`` inputs answers a typo, a glob, a missing object and a local path
the same way: the lister DataPipe, both datasets, the nodes (where torchdata.nodes exists) and, where
gcsfs answers so, the fsspec filesystem."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import (
    ClientConfig,
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    GCSIterableDataset,
    GCSMapDataset,
    GCSShardComposerIterDataPipe,
    InvalidURIError,
    MissingObjectWarning,
    NotFoundError,
)
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator

BUCKET = "front-door"
NAMES = ["train/a.jpg", "train/b.jpg", "train/c.txt", "train/deep/d.jpg", "train/deep/er/e.jpg", "val/f.jpg"]
HAS_NODES = (
    importlib.util.find_spec("torchdata") is not None and importlib.util.find_spec("torchdata.nodes") is not None
)


@pytest.fixture(scope="module")
def bucket(gcs_emulator: Emulator) -> str:
    gcs_emulator.seed(BUCKET, {name: name.encode() for name in NAMES})
    return BUCKET


def lister(urls: Any, client: ClientConfig, **settings: Any) -> list[str]:
    return list(GCSFileListerIterDataPipe(urls, client=client, **settings))


def map_dataset(urls: Any, client: ClientConfig, **settings: Any) -> list[str]:
    return [url for url, _ in GCSMapDataset(urls, client=client, **settings)]


def iterable_dataset(urls: Any, client: ClientConfig, **settings: Any) -> list[str]:
    return [url for url, _ in GCSIterableDataset(urls, client=client, **settings)]


def nodes(urls: Any, client: ClientConfig, **settings: Any) -> list[str]:
    from torchdata_gcs.nodes import ListFiles

    return list(ListFiles(urls, client=client, **settings))


FRONT_ENDS = [
    lister,
    map_dataset,
    iterable_dataset,
    pytest.param(nodes, marks=pytest.mark.skipif(not HAS_NODES, reason="torchdata.nodes: the second environment")),
]


def url(name: str) -> str:
    return f"gs://{BUCKET}/{name}"


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize(
    ("inputs", "settings", "expected"),
    [
        ("gs://front-door/train/*.jpg", {}, ["train/a.jpg", "train/b.jpg"]),
        (
            "gs://front-door/train/**/*.jpg",
            {},
            ["train/a.jpg", "train/b.jpg", "train/deep/d.jpg", "train/deep/er/e.jpg"],
        ),
        ("gs://front-door/*/d*/*.jpg", {}, ["train/deep/d.jpg"]),
        ("gs://front-door/train/?.txt", {}, ["train/c.txt"]),
        ("gs://front-door/train/[ab].jpg", {}, ["train/a.jpg", "train/b.jpg"]),
        (
            "gs://front-door/train/",
            {"masks": "**/*.jpg"},
            ["train/a.jpg", "train/b.jpg", "train/deep/d.jpg", "train/deep/er/e.jpg"],
        ),
        ("gs://front-door/train/", {"masks": "*/*.jpg"}, ["train/deep/d.jpg"]),
        ("gs://front-door/train/", {"masks": ["*.txt", "e.*"]}, ["train/c.txt", "train/deep/er/e.jpg"]),
        (
            "gs://front-door/train",
            {"masks": "*.jpg"},
            ["train/a.jpg", "train/b.jpg", "train/deep/d.jpg", "train/deep/er/e.jpg"],
        ),
    ],
)
def test_globs_in_urls_and_masks_expand_as_fsspec_reads_them(
    bucket: str, client: ClientConfig, front_end: Callable[..., list[str]], inputs: str, settings: dict, expected: list
) -> None:
    assert front_end(inputs, client, **settings) == [url(name) for name in expected]


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize(
    ("inputs", "settings", "said"),
    [
        ("gs://front-door/trian/", {}, r"no object matches gs://front-door/trian/: there is no object under"),
        (
            "gs://front-door/train/",
            {"masks": "*.jpeg"},
            r"gs://front-door/train/ with masks \['\*\.jpeg'\]: 5 listed, none kept",
        ),
        ("gs://front-door/train/*.bin", {}, r"no object matches gs://front-door/train/\*\.bin: 5 listed, none kept"),
        (
            ["gs://front-door/train/a.jpg", "gs://front-door/train/z.jpg"],
            {},
            r"gs://front-door/train/z.jpg does not exist",
        ),
    ],
)
def test_an_input_that_matches_nothing_is_an_error_naming_it(
    bucket: str, client: ClientConfig, front_end: Callable[..., list[str]], inputs: Any, settings: dict, said: str
) -> None:
    with pytest.raises(NotFoundError, match=said) as raised:
        front_end(inputs, client, **settings)
    assert raised.value.url in (inputs if isinstance(inputs, list) else [inputs])
    assert front_end(inputs, client, allow_empty=True, **settings) in ([], [url("train/a.jpg")])


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_a_missing_object_is_skipped_when_asked(bucket: str, client: ClientConfig, front_end: Callable) -> None:
    inputs = [url("train/a.jpg"), url("train/z.jpg"), url("val/")]
    with pytest.warns(MissingObjectWarning, match="gs://front-door/train/z.jpg"):
        assert front_end(inputs, client, skip_missing=True) == [url("train/a.jpg"), url("val/f.jpg")]
    with pytest.raises(NotFoundError, match="no object matches gs://front-door/nothing/"):
        front_end([url("nothing/")], client, skip_missing=True)  # a prefix is not a missing object


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_a_missing_bucket_is_an_error(gcs_emulator: Emulator, client: ClientConfig, front_end: Callable) -> None:
    with pytest.raises(NotFoundError):
        front_end("gs://no-such-front-door/train/", client, allow_empty=True)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_a_local_path_is_refused_saying_what_is_accepted(client: ClientConfig, front_end: Callable) -> None:
    with pytest.raises(InvalidURIError, match=r"expected a 'gs://bucket/name' string.*local path"):
        front_end(PurePosixPath("gs://front-door/train"), client)
    with pytest.raises(InvalidURIError, match=r"expected a 'gs://bucket/name' string.*got int"):
        front_end([url("train/"), 7], client)


def test_the_lister_counts_skipped_objects(bucket: str, client: ClientConfig) -> None:
    pipe = IterableWrapper([url("train/z.jpg"), url("val/")]).list_files_by_gcs(client=client, skip_missing=True)
    assert isinstance(pipe, GCSFileListerIterDataPipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingObjectWarning)
        assert list(pipe) == [url("val/f.jpg")]
    assert pipe.stats.missing == 1


def test_a_shared_listing_checks_its_inputs_too(bucket: str, client: ClientConfig) -> None:
    """The replica that lists fails and publishes nothing; one that reads a manifest checks it as well."""
    folder = "gs://front-door/manifests/"
    with pytest.raises(NotFoundError, match=r"with masks \['\*\.jpeg'\]"):
        lister(url("train/"), client, masks="*.jpeg", manifest=folder)
    assert lister(url("train/"), client, masks="*.jpeg", manifest=folder, allow_empty=True) == []
    with pytest.raises(NotFoundError, match=r"no object matches gs://front-door/train/ with masks .* shared listing"):
        lister(url("train/"), client, masks="*.jpeg", manifest=folder)


# -- fsspec: as gcsfs answers ---------------------------------------------------------------------


def test_fsspec_globs_as_gcsfs_and_raises_where_gcsfs_raises(bucket: str, client: ClientConfig) -> None:
    fs = GCSFileSystem(client=client, skip_instance_cache=True)
    assert fs.glob(url("train/*.jpg")) == [f"{BUCKET}/train/a.jpg", f"{BUCKET}/train/b.jpg"]
    assert fs.glob(url("train/**/e.jpg")) == [f"{BUCKET}/train/deep/er/e.jpg"]
    assert fs.glob(url("train/*.jpeg")) == []  # gcsfs answers an empty glob with []
    assert fs.find(url("trian/")) == []  # and an empty find too
    with pytest.raises(FileNotFoundError):
        fs.ls(url("trian/"))
    with pytest.raises(FileNotFoundError):
        fs.find("gs://no-such-front-door/x/")
    with pytest.raises(FileNotFoundError):
        fs.glob("gs://no-such-front-door/x/*.jpg")


def test_the_loaders_name_a_missing_object_or_count_it_when_skipping(bucket: str, client: ClientConfig) -> None:
    urls = [url("train/a.jpg"), url("train/z.jpg")]
    for loader in (GCSFileLoaderIterDataPipe, GCSShardComposerIterDataPipe):
        with pytest.raises(NotFoundError, match="gs://front-door/train/z.jpg"):
            list(loader(urls, client=client))
        pipe = loader(urls, client=client, skip_missing=True)
        with pytest.warns(MissingObjectWarning, match="gs://front-door/train/z.jpg"):
            assert [name for name, _ in pipe] == [url("train/a.jpg")]
        assert pipe.stats.missing == 1 and pipe.stats.objects == 1
