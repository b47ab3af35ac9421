"""docs/gcsfs-compatibility.md says, for every public constructor argument, method and attribute of
gcsfs's ``GCSFileSystem``, what ours does with it; these tests hold the filesystem to the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchdata_gcs.fsspec import GCSFileSystem

TABLE = Path(__file__).parents[2] / "docs" / "gcsfs-compatibility.md"

GCSFS_NAMES = frozenset(
    [
        "MIN_CHUNK_SIZE_FOR_CONCURRENCY",
        "async_impl",
        "base",
        "batch_url_base",
        "blocksize",
        "buckets",
        "cachable",
        "call",
        "cat",
        "cat_file",
        "cat_ranges",
        "checksum",
        "clear_instance_cache",
        "close_session",
        "copy",
        "cp",
        "cp_file",
        "created",
        "current",
        "default_block_size",
        "delete",
        "disable_throttling",
        "disk_usage",
        "download",
        "du",
        "end_transaction",
        "exists",
        "expand_path",
        "find",
        "from_dict",
        "from_json",
        "fsid",
        "get",
        "get_file",
        "get_mapper",
        "getxattr",
        "glob",
        "grpc_client",
        "head",
        "info",
        "invalidate_cache",
        "isdir",
        "isfile",
        "lexists",
        "listdir",
        "loop",
        "ls",
        "make_bucket_requester_pays",
        "makedir",
        "makedirs",
        "merge",
        "mirror_sync_methods",
        "mkdir",
        "mkdirs",
        "modified",
        "move",
        "mv",
        "mv_file",
        "on_google",
        "open",
        "open_async",
        "pipe",
        "pipe_file",
        "project",
        "protocol",
        "put",
        "put_file",
        "read_block",
        "read_bytes",
        "read_text",
        "rename",
        "retries",
        "rm",
        "rm_file",
        "rmdir",
        "root_marker",
        "scopes",
        "sep",
        "session",
        "setxattrs",
        "sign",
        "size",
        "sizes",
        "split_path",
        "start_transaction",
        "stat",
        "sync_process_limits_to_offset_and_length",
        "tail",
        "to_dict",
        "to_json",
        "touch",
        "transaction",
        "transaction_type",
        "tree",
        "ukey",
        "unstrip_protocol",
        "upload",
        "url",
        "walk",
        "write_bytes",
        "write_text",
    ]
)
"""The public names of ``gcsfs.GCSFileSystem`` 2026.10.1 (``dir()``, no leading underscore)."""

GCSFS_ARGUMENTS = frozenset(
    [
        "project",
        "access",
        "token",
        "block_size",
        "consistency",
        "cache_timeout",
        "secure_serialize",
        "check_connection",
        "requests_timeout",
        "requester_pays",
        "asynchronous",
        "session_kwargs",
        "loop",
        "timeout",
        "endpoint_url",
        "default_location",
        "version_aware",
        "finalize_on_close",
        "mrd_pool_cache_size",
        "max_mrd_pool_cache_queue_size",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "skip_instance_cache",
        "batch_size",
    ]
)
"""gcsfs 2026.10.1's constructor arguments, its base classes' (fsspec's) included."""

TAKEN = {
    "project": "my-project",
    "token": "anon",
    "block_size": 1024,
    "consistency": "md5",
    "cache_timeout": 10,
    "requester_pays": False,
    "asynchronous": False,
    "loop": None,
    "endpoint_url": "http://127.0.0.1:1",
    "default_location": "EU",
    "version_aware": True,
    "use_listings_cache": False,
    "listings_expiry_time": 5,
    "max_paths": 10,
    "skip_instance_cache": True,
    "batch_size": 4,
}
"""A value each argument the table says is taken is tried with (no request is made)."""


def rows(section: str) -> dict[str, str]:
    """``{name: what ours does}`` of the table under the heading ``section``."""
    text = TABLE.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| (.+) \|$", text, re.MULTILINE))


def status(text: str) -> str:
    word = re.split(r"[ :;,(]", text, maxsplit=1)[0]
    assert word in ("same", "differs", "refused"), f"a row must say same, differs or refused: {text!r}"
    return word


def test_the_table_lists_every_name_of_gcsfs_and_ours() -> None:
    ours = {name for name in dir(GCSFileSystem) if not name.startswith("_")}
    assert set(rows("Methods and attributes")) == GCSFS_NAMES | ours
    assert set(rows("Constructor arguments")) == GCSFS_ARGUMENTS


@pytest.mark.parametrize("name", sorted(GCSFS_ARGUMENTS))
def test_each_constructor_argument_is_taken_or_refused_by_name(name: str) -> None:
    said = status(rows("Constructor arguments")[name])
    if said == "refused":
        with pytest.raises(TypeError, match=name):
            GCSFileSystem(skip_instance_cache=True, **{name: None})
    else:
        fs = GCSFileSystem(**{"skip_instance_cache": True, "endpoint_url": "http://127.0.0.1:1", name: TAKEN[name]})
        assert isinstance(fs, GCSFileSystem)


@pytest.mark.parametrize("name", sorted(GCSFS_NAMES))
def test_each_method_is_there_or_refused_saying_where_to_look(name: str) -> None:
    said = status(rows("Methods and attributes")[name])
    fs = GCSFileSystem(skip_instance_cache=True, endpoint_url="http://127.0.0.1:1", token="anon", project="p")
    if said == "refused":
        with pytest.raises(AttributeError, match=rf"'{name}'.*gcsfs-compatibility\.md"):
            getattr(fs, name)
    else:
        assert name in dir(fs)
