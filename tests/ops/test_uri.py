"""URL parsing and formatting: pure, so property-tested."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchdata_gcs import InvalidURIError, format_url, parse_url
from torchdata_gcs._ops.urls import validate_bucket

bucket_names = st.from_regex(r"[a-z0-9][a-z0-9_-]{1,40}[a-z0-9]", fullmatch=True).filter(
    lambda b: not b.startswith("goog") and "google" not in b and "g00gle" not in b
)
object_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    min_size=1,
    max_size=200,
).filter(lambda n: n not in (".", "..") and len(n.encode()) <= 1024)


@given(bucket=bucket_names, name=object_names)
def test_format_then_parse_round_trips(bucket: str, name: str) -> None:
    assert parse_url(format_url(bucket, name)) == (bucket, name)


@given(bucket=bucket_names, name=object_names)
def test_gcs_scheme_parses_like_gs(bucket: str, name: str) -> None:
    assert parse_url(f"gcs://{bucket}/{name}") == parse_url(f"gs://{bucket}/{name}")


@given(bucket=bucket_names, name=object_names)
def test_parse_then_format_is_canonical(bucket: str, name: str) -> None:
    url = f"gs://{bucket}/{name}"
    assert format_url(*parse_url(url)) == url


@pytest.mark.parametrize(
    "url, expected",
    [
        ("gs://b-1/a b#c?d%20e+f//g", ("b-1", "a b#c?d%20e+f//g")),
        ("gs://bucket", ("bucket", "")),
        ("gs://bucket/", ("bucket", "")),
        ("gs://bucket/dir/", ("bucket", "dir/")),
        ("gs://bucket/ünï/ç😀", ("bucket", "ünï/ç😀")),
        ("gs://a.b.c/x", ("a.b.c", "x")),
    ],
)
def test_names_are_taken_literally(url: str, expected: tuple[str, str]) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/x",
        "bucket/x",
        "gs:/bucket/x",
        "gs:///x",
        "gs://Bucket/x",
        "gs://ab/x",
        "gs://-bucket/x",
        "gs://bucket-/x",
        "gs://buck et/x",
        "gs://" + "a" * 64 + "/x",
        "gs://goog-bucket/x",
        "gs://my-google-bucket/x",
        "gs://my-g00gle/x",
        "gs://192.168.1.1/x",
        "gs://a..b/x",
        "gs://bucket/line\nbreak",
        "gs://bucket/..",
        "gs://bucket/" + "x" * 1025,
    ],
)
def test_bad_urls_raise_invalid_uri(url: str) -> None:
    with pytest.raises(InvalidURIError) as info:
        parse_url(url)
    assert isinstance(info.value, ValueError)


def test_object_url_requires_a_name() -> None:
    for url in ("gs://bucket/", "gs://bucket"):
        with pytest.raises(InvalidURIError, match=f"'{url}' names a bucket or folder, not an object"):
            parse_url(url, allow_prefix=False)


def test_non_string_is_rejected() -> None:
    with pytest.raises(InvalidURIError):
        parse_url(b"gs://bucket/x")  # type: ignore[arg-type]


@pytest.mark.parametrize("bucket", ["abc", "a" * 63, "a-b_c.d", "1bucket", ("a" * 63 + ".") * 3 + "a" * 30])
def test_valid_bucket_names(bucket: str) -> None:
    assert validate_bucket(bucket) == bucket


def test_dotted_bucket_parts_are_limited() -> None:
    with pytest.raises(InvalidURIError):
        validate_bucket("a" * 64 + ".com")
