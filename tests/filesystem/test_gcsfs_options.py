"""gcsfs's constructor arguments, as ``storage_options`` written for gcsfs pass them: honoured where they mean
something here, refused with a ``TypeError`` naming them otherwise, never ignored."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront


def test_endpoint_url_and_anonymous_token_send_requests_where_asked(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    with GCSFront(gcs_emulator.endpoint) as front:
        fs = GCSFileSystem(endpoint_url=front.endpoint, token="anon", project="demo", skip_instance_cache=True)
        fs.pipe_file(f"gs://{gcs_bucket}/a.txt", b"alpha")
        assert fs.cat(f"gs://{gcs_bucket}/a.txt") == b"alpha"
        assert front.counts["upload"] == 1 and fs.client.endpoint == front.endpoint and fs.client.config.anonymous
        again = pickle.loads(pickle.dumps(fs))
        assert again.client.endpoint == front.endpoint and again.cat(f"gs://{gcs_bucket}/a.txt") == b"alpha"


@pytest.mark.parametrize("name", ["session_kwargs", "timeout"])
def test_gcsfs_arguments_not_honoured_are_refused_by_name(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        GCSFileSystem(skip_instance_cache=True, **{name: None})


def test_other_protocols_options_and_client_kwargs_are_left_unused(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """fsspec hands a filesystem the options keyed by other protocols' names (meant for the other hops of a
    chained URL), Hugging Face ``datasets`` adds ``hf`` to the options it is given and passes ``client_kwargs``
    to any filesystem beneath a compressed file: gcsfs leaves them unused."""
    with GCSFront(gcs_emulator.endpoint) as front:
        fs = GCSFileSystem(
            endpoint_url=front.endpoint,
            token="anon",
            hf={"token": None},
            s3={"anon": True},
            client_kwargs={"trust_env": True},
            skip_instance_cache=True,
        )
        fs.pipe_file(f"gs://{gcs_bucket}/a.txt", b"alpha")
        assert front.counts["upload"] == 1 and fs.client.endpoint == front.endpoint
    with pytest.raises(TypeError, match="does not take: gs$"):
        GCSFileSystem(gs={}, skip_instance_cache=True)


@pytest.mark.parametrize(("block_size", "fetched"), [(None, 2**20), (0, 10), (2**16, 10 + 2**16)])
def test_block_size_is_how_far_ahead_readers_read(
    block_size: int | None, fetched: int, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """gcsfs's ``block_size`` is the default of ``open()``'s readers (4 MiB without it); an ``open()`` may
    still give its own."""
    fs = GCSFileSystem(client=gcs_emulator.client_config, block_size=block_size, skip_instance_cache=True)
    data = bytes(range(256)) * 4096  # 1 MiB
    fs.pipe_file(f"gs://{gcs_bucket}/a.bin", data)
    before = fs.stats.bytes
    with fs.open(f"gs://{gcs_bucket}/a.bin", "rb") as f:
        assert f.read(10) == data[:10]
    assert fs.stats.bytes - before == fetched
    with fs.open(f"gs://{gcs_bucket}/a.bin", "rb", block_size=100) as f:
        assert f.read(10) == data[:10]
    assert fs.stats.bytes - before == fetched + 110


def test_encoding_errors_and_newline_are_the_defaults_of_text_modes(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    fs = GCSFileSystem(client=gcs_emulator.client_config, encoding="latin-1", newline="\r\n", skip_instance_cache=True)
    with fs.open(f"gs://{gcs_bucket}/notes.txt", "w") as f:
        f.write("café\n")
    assert fs.cat(f"gs://{gcs_bucket}/notes.txt") == "café\r\n".encode("latin-1")
    with fs.open(f"gs://{gcs_bucket}/notes.txt", "r", newline="") as f:
        assert f.read() == "café\r\n"
    with pytest.raises(UnicodeDecodeError), fs.open(f"gs://{gcs_bucket}/notes.txt", "r", encoding="utf-8") as f:
        f.read()
    with fs.open(f"gs://{gcs_bucket}/notes.txt", "rb") as f:
        assert f.read() == "café\r\n".encode("latin-1")


def test_requester_pays_bills_the_project_named() -> None:
    paying = GCSFileSystem(requester_pays=True, project="payer", token="anon", skip_instance_cache=True)
    assert paying.client.config.user_project == "payer"
    other = GCSFileSystem(requester_pays="billed", token="anon", skip_instance_cache=True)
    assert other.client.config.user_project == "billed"
    with pytest.raises(ValueError, match="project"):
        GCSFileSystem(requester_pays=True, skip_instance_cache=True)


def test_tokens_are_taken_as_gcsfs_takes_them(tmp_path: Path) -> None:
    key = tmp_path / "key.json"
    key.write_text("{}")
    assert GCSFileSystem(token=str(key), skip_instance_cache=True).client.config.credentials_file == str(key)
    assert not GCSFileSystem(token="google_default", skip_instance_cache=True).client.config.anonymous
    with pytest.raises(ValueError, match="credentials file"):
        GCSFileSystem(token=str(tmp_path / "missing.json"), skip_instance_cache=True)
    with pytest.raises(TypeError, match="token"):
        GCSFileSystem(token={"type": "authorized_user"}, skip_instance_cache=True)
    with pytest.raises(ValueError, match="consistency"):
        GCSFileSystem(consistency="sha1", skip_instance_cache=True)


def test_client_and_gcsfs_arguments_together_are_refused(gcs_emulator: Emulator) -> None:
    with pytest.raises(TypeError, match="either client= or gcsfs's endpoint_url"):
        GCSFileSystem(client=gcs_emulator.client_config, endpoint_url=gcs_emulator.endpoint, skip_instance_cache=True)


def test_ls_names_entries_unless_asked_for_details(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """gcsfs's ``ls`` (and fsspec's local one) answers names by default."""
    fs = GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)
    fs.pipe_file(f"gs://{gcs_bucket}/d/a.txt", b"a")
    assert fs.ls(f"gs://{gcs_bucket}/d") == [f"{gcs_bucket}/d/a.txt"]
    assert fs.ls(f"gs://{gcs_bucket}/d", detail=True)[0]["name"] == f"{gcs_bucket}/d/a.txt"
