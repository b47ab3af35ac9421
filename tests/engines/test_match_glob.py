"""Masks and globs are sent to GCS as a ``matchGlob`` when GCS is sure to select at least what they keep,
so fewer names and pages come back; the client-side check still decides, and nothing is lost."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from torchdata_gcs import GCSFileListerIterDataPipe, NotFoundError
from torchdata_gcs._ops.patterns import NameFilter, server_glob
from torchdata_gcs.testing import Emulator, GCSFront
from torchdata_gcs.testing._match_glob import glob_pattern


def list_names(front: GCSFront, inputs: str | list[str], masks: str | list[str] = "", **settings: bool) -> list[str]:
    return list(GCSFileListerIterDataPipe(inputs, masks, client=front.client_config, **settings))


def match_globs_sent(front: GCSFront) -> list[str | None]:
    lists = [r for r in front.recorded if r.method == "GET" and urlsplit(r.target).path.endswith("/o")]
    return [dict(parse_qsl(urlsplit(r.target).query)).get("matchGlob") for r in lists]


def seed_ten_jpgs_in_3000(emulator: Emulator, bucket: str, folder: str) -> list[str]:
    """3,000 objects under ``folder``, 10 of them ``.jpg``; their names in order."""
    names = [f"{folder}{i:05d}.{'jpg' if i % 300 == 7 else 'txt'}" for i in range(3000)]
    emulator.seed(bucket, {name: b"x" for name in names}, concurrency=32)
    return names


def test_a_mask_over_a_large_prefix_comes_back_in_one_small_page(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    names = seed_ten_jpgs_in_3000(gcs_emulator, gcs_bucket, "imgs/")
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        listed = list_names(front, f"gs://{gcs_bucket}/imgs/", "*.jpg")
        assert listed == [f"gs://{gcs_bucket}/{name}" for name in names if name.endswith(".jpg")]
        assert len(listed) == 10
        assert front.counts["list"] == 1
        assert match_globs_sent(front) == ["imgs/**.jpg"]


@pytest.mark.parametrize(
    ("source", "masks"),
    [
        ("lit/", "x{1,2}.bin"),  # braces: literal to fnmatch, alternatives to GCS
        ("lit/*/[!y]*.bin", ""),  # a negated set that fsspec lets match "/"
        ("lit/", "a\\b.bin"),  # a backslash: literal to fnmatch, an escape to GCS
        ("lit/", "*"),  # keeps everything: nothing to narrow
    ],
)
def test_a_pattern_gcs_may_read_otherwise_is_listed_without_a_glob_and_right(
    gcs_emulator: Emulator, gcs_bucket: str, source: str, masks: str
) -> None:
    objects = ["lit/x{1,2}.bin", "lit/x1.bin", "lit/a\\b.bin", "lit/d/z.bin", "lit/d/y.bin"]
    gcs_emulator.seed(gcs_bucket, {name: b"x" for name in objects})
    keep = NameFilter.of(source, [masks])
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        listed = list_names(front, f"gs://{gcs_bucket}/{source}", masks)
        assert listed == [f"gs://{gcs_bucket}/{name}" for name in sorted(objects) if keep(name)]
        assert listed and match_globs_sent(front) == [None]


@pytest.mark.parametrize(
    ("source", "masks"),
    [
        ("t/", ["*.jpg"]),
        ("t/", ["?.jpg", "deep/*.jpg"]),
        ("t/", ["[ab]*.jpg"]),
        ("t/", ["[!a]*"]),
        ("t/**/*.jpg", []),
        ("t/*/d*.jpg", []),
        ("t/deep/**", []),
        ("t/**/er/*", []),
        ("t/a", ["*.jpg"]),
    ],
)
def test_a_narrowed_listing_keeps_what_the_client_side_check_alone_keeps(
    gcs_emulator: Emulator, gcs_bucket: str, source: str, masks: list[str]
) -> None:
    """The front selects as GCS reads a glob (as narrowly as GCS allows), the emulator alone not at all."""
    objects = ["t/a", "t/a/c.jpg", "t/a.jpg", "t/b.jpg", "t/c.png", "t/deep/d.jpg", "t/deep/er/e.jpg", "t/e.jpg.txt"]
    gcs_emulator.seed(gcs_bucket, {name: b"x" for name in objects})
    inputs = f"gs://{gcs_bucket}/{source}"
    unfiltered = list(GCSFileListerIterDataPipe(inputs, masks, client=gcs_emulator.client_config))
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        assert list_names(front, inputs, masks) == unfiltered
        assert any(match_globs_sent(front))


def test_an_input_gcs_finds_nothing_for_says_which_glob_it_asked_with_and_what_is_there(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"train/a.jpg": b"x", "train/b.jpg": b"x"})
    with GCSFront(gcs_emulator.endpoint) as front:
        with pytest.raises(NotFoundError) as raised:
            list_names(front, f"gs://{gcs_bucket}/train/", "*.jpeg")
        assert str(raised.value).startswith(
            f"no object matches gs://{gcs_bucket}/train/ with masks ['*.jpeg']: GCS lists none that its glob "
            f"'train/**.jpeg' selects (the first name there: 'gs://{gcs_bucket}/train/a.jpg')"
        )
        with pytest.raises(NotFoundError, match="there is no object under"):
            list_names(front, f"gs://{gcs_bucket}/trian/", "*.jpg")
        assert list_names(front, f"gs://{gcs_bucket}/train/", "*.jpeg", allow_empty=True) == []


@pytest.mark.parametrize("glob", ["a[bc", "{a,b", "a}", "x\\", "[!]"])
def test_the_front_refuses_an_invalid_match_glob_with_400(gcs_emulator: Emulator, gcs_bucket: str, glob: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"x"})
    with GCSFront(gcs_emulator.endpoint) as front:
        answer = requests.get(f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o", params={"matchGlob": glob}, timeout=30)
    assert answer.status_code == 400 and "matchGlob" in answer.json()["error"]["message"]


def test_the_front_reads_globs_as_gcs_does() -> None:
    """What GCS selected in the official client's system test of ``match_glob``."""
    names = ["foo/bar", "foo/baz", "foo/foobar", "foobar"]
    selected = {
        "foo*bar": ["foobar"],
        "foo**bar": ["foo/bar", "foo/foobar", "foobar"],
        "**/foobar": ["foo/foobar", "foobar"],
        "*/ba[rz]": ["foo/bar", "foo/baz"],
        "*/ba[!a-y]": ["foo/baz"],
        "**/{foobar,baz}": ["foo/baz", "foo/foobar", "foobar"],
        "foo/{foo*,*baz}": ["foo/baz", "foo/foobar"],
    }
    for glob, expected in selected.items():
        assert [name for name in names if glob_pattern(glob).fullmatch(name)] == expected, glob


NAME = st.lists(st.sampled_from(["a", "b", "x", "/", ".jpg", "-", "e", "!"]), max_size=8).map("".join)
MASK = st.lists(
    st.sampled_from(["*", "?", "a", "x", ".jpg", "[ab]", "[!a]", "[a-c]", "/", "**", "{", ",", "\\", "]"]),
    min_size=1,
    max_size=5,
).map("".join)


@settings(max_examples=1000)
@given(name=NAME, masks=st.lists(MASK, min_size=1, max_size=2), root=st.sampled_from(["", "r/", "r/x"]))
def test_a_sent_glob_selects_every_name_the_masks_keep(name: str, masks: list[str], root: str) -> None:
    try:
        keep = NameFilter.of(root, masks)
    except ValueError:  # fsspec refuses the mask (``**`` inside a level)
        return
    glob = server_glob(keep, root, masks)
    full = keep.root + name
    if glob is not None and keep(full):
        assert glob_pattern(glob).fullmatch(full), (glob, full)


@settings(max_examples=1000)
@given(name=NAME, pattern=MASK)
def test_a_sent_glob_selects_every_name_a_url_glob_keeps(name: str, pattern: str) -> None:
    source = "r/" + pattern
    try:
        keep = NameFilter.of(source)
    except ValueError:
        return
    glob = server_glob(keep, source)
    full = keep.root + name
    if glob is not None and keep(full):
        assert glob_pattern(glob).fullmatch(full), (glob, full)
