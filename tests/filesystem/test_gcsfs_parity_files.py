"""The file objects ``open`` gives, as gcsfs's and Python's own behave, over HTTP to the emulator: a file opened
for writing refuses reads with ``io.UnsupportedOperation`` (a ``ValueError`` and an ``OSError``), and a reader's
``url()`` is a method giving the HTTP URL of the version it reads."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import requests

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fs(gcs_emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)


READS: dict[str, Callable[[Any], object]] = {
    "read": lambda f: f.read(),
    "read(3)": lambda f: f.read(3),
    "readline": lambda f: f.readline(),
    "readinto": lambda f: f.readinto(bytearray(3)),
}


@pytest.mark.parametrize("mode", ["wb", "xb"])
@pytest.mark.parametrize("read", sorted(READS))
def test_a_file_opened_for_writing_refuses_reads_as_python_files_do(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str, mode: str, read: str
) -> None:
    with fs.open(f"{gcs_bucket}/w.bin", mode) as f:
        f.write(b"abc")
        assert not f.readable()
        with pytest.raises(io.UnsupportedOperation) as caught:
            READS[read](f)
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, OSError)
        f.write(b"def")  # the refusal left the file as it was
    assert gcs_emulator.read(gcs_bucket, "w.bin") == b"abcdef"
    with pytest.raises(ValueError, match="closed"):
        READS[read](f)


def test_writers_of_a_transaction_and_text_writers_refuse_reads_too(fs: GCSFileSystem, gcs_bucket: str) -> None:
    with fs.transaction, fs.open(f"{gcs_bucket}/staged.bin", "wb") as staged:
        with pytest.raises(io.UnsupportedOperation):
            staged.read()
        staged.write(b"staged")
    with pytest.raises(ValueError, match="closed"):
        staged.read()
    with fs.open(f"{gcs_bucket}/t.txt", "w") as text:
        with pytest.raises(io.UnsupportedOperation):
            text.read()
        text.write("text")
    assert fs.cat(f"{gcs_bucket}/staged.bin") == b"staged" and fs.cat(f"{gcs_bucket}/t.txt") == b"text"


def test_a_readers_url_is_a_method_giving_the_version_it_reads(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    fs.pipe_file(f"{gcs_bucket}/dir/a b.txt", b"alpha")
    with fs.open(f"gs://{gcs_bucket}/dir/a b.txt", "rb") as f:
        url = f.url()
        generation = f.details["generation"]
    assert url == fs.url(f"{gcs_bucket}/dir/a b.txt", generation=generation)
    assert url.startswith(f"{gcs_emulator.endpoint}/") and f"generation={generation}" in url
    answer = requests.get(url, timeout=30)
    assert answer.status_code == 200 and answer.content == b"alpha"
