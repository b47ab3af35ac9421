"""Paths and writers as gcsfs treats them, over HTTP to the emulator: a leading ``/`` is dropped, a bad
name is an ``OSError`` that ``exists``/``isdir`` answer False on, and a text writer left by an exception
publishes nothing."""

from __future__ import annotations

import pytest

from torchdata_gcs import InvalidURIError
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator

pytestmark = pytest.mark.timeout(60)


def filesystem(emulator: Emulator) -> GCSFileSystem:
    return GCSFileSystem(client=emulator.client_config, skip_instance_cache=True)


def test_a_leading_slash_is_dropped(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.upload(gcs_bucket, "x/a.txt", b"alpha")
    fs = filesystem(gcs_emulator)
    assert fs.ls(f"/{gcs_bucket}/x", detail=False) == [f"{gcs_bucket}/x/a.txt"]
    assert fs.cat(f"/{gcs_bucket}/x/a.txt") == b"alpha"
    fs.pipe_file(f"/{gcs_bucket}/x/b.txt", b"beta")
    assert fs.cat(f"gs://{gcs_bucket}/x/b.txt") == b"beta"


@pytest.mark.parametrize("name", ["a\nb", ".."])
def test_a_bad_object_name_is_an_oserror_that_exists_and_isdir_deny(
    gcs_emulator: Emulator, gcs_bucket: str, name: str
) -> None:
    fs = filesystem(gcs_emulator)
    path = f"gs://{gcs_bucket}/{name}"
    with pytest.raises(OSError) as raised:
        fs.info(path)
    assert isinstance(raised.value, InvalidURIError) and isinstance(raised.value, ValueError)
    with pytest.raises(OSError):
        fs.pipe_file(path, b"data")
    assert fs.exists(path) is False
    assert fs.isdir(path) is False
    assert fs.exists("gs://") is False  # no bucket at all


def test_a_text_writer_left_by_an_exception_publishes_nothing(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    fs = filesystem(gcs_emulator)
    path = f"gs://{gcs_bucket}/model.txt"
    with pytest.raises(RuntimeError, match="failed midway"), fs.open(path, "w") as f:
        f.write("partial\n")
        f.flush()
        raise RuntimeError("failed midway")
    assert not fs.exists(path)
    with fs.open(path, "w", encoding="utf-8") as f:
        f.write("whole ✓\n")
    assert fs.cat(path) == "whole ✓\n".encode()
    with fs.open(path, "r", encoding="utf-8") as f:
        assert f.read() == "whole ✓\n"
