"""The one rule for a ``transform``: one positional argument gets the stream, two get the URL and the stream,
any other shape is refused when the front end is made, with a ``TypeError`` naming the shapes accepted."""

from __future__ import annotations

import functools
import io
import pickle

import pytest

from torchdata_gcs._engines.transform import ItemMaker

URL = "gs://bucket/a.bin"


def stream() -> io.BytesIO:
    data = io.BytesIO(b"bytes")
    data.name = URL
    return data


def read(stream):
    return stream.read()


def url_and_read(url, stream):
    return url, stream.read()


def scaled(stream, scale=2):
    return scale * len(stream.read())


def tagged(tag, url, stream):
    return tag, url, stream.read()


class Decoder:
    def __call__(self, stream):
        return stream.read().upper()


@pytest.mark.parametrize(
    ("transform", "item"),
    [
        (read, b"bytes"),
        (lambda s: s.name, URL),
        (scaled, 10),  # an optional second argument is left to its default
        (Decoder(), b"BYTES"),
        (functools.partial(tagged, "t"), ("t", URL, b"bytes")),
        (url_and_read, (URL, b"bytes")),
        (lambda url, s: url, URL),
        (lambda *args: len(args), 2),  # takes any number: given both
        (lambda url=None, s=None: url, URL),
        (lambda s=None: s.read(), b"bytes"),
        (io.BufferedReader, io.BufferedReader),  # a class: its __init__'s arguments
        (max, b"bytes"),  # a builtin without a signature to read: given the stream
    ],
)
def test_one_argument_gets_the_stream_two_get_the_url_too(transform, item) -> None:
    made = ItemMaker(transform)(URL, stream())
    assert isinstance(made, item) if isinstance(item, type) else made == item


@pytest.mark.parametrize(
    "transform",
    [lambda: 0, lambda a, b, c: 0, tagged, lambda s, *, size: 0],
    ids=["none", "three", "three-defined", "keyword-only"],
)
def test_any_other_shape_is_refused_naming_the_shapes_accepted(transform) -> None:
    with pytest.raises(TypeError, match=r"transform\(stream\), or .* transform\(url, stream\); .* takes neither"):
        ItemMaker(transform)


def test_what_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="transform must be callable, got str"):
        ItemMaker("decode")


def test_it_pickles_as_its_transform_does() -> None:
    maker = pickle.loads(pickle.dumps(ItemMaker(scaled)))
    assert maker(URL, stream()) == 10
