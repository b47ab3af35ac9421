"""Every script ends: one that stops reading early (an iterator half-read at the end of the file, ``break``, its
own exception, ``sys.exit``, Ctrl-C, SIGTERM), with no worker or two, ends within seconds with the status
that says how, and prints nothing but its own traceback, through every front end of the first environment.
The nodes' scripts are in ``tests/nodes/test_scripts_end.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.script_endings import run_scripts, scripts_of, seeded_emulator
from torchdata_gcs.testing import Emulator

FRONTS = {
    "datapipes": """
from torch.utils.data.datapipes.iter import IterableWrapper
import torchdata_gcs

def read(pair):
    return pair[0], pair[1].read()

def make():
    pipe = IterableWrapper([URL]).list_files_by_gcs().sharding_filter().load_files_by_gcs().map(read)
    return pipe if WORKERS == 0 else DataLoader(pipe, batch_size=None, num_workers=WORKERS)
""",
    "map_dataset": """
from torchdata_gcs import GCSMapDataset

def read(stream):
    return stream.read()

def make():
    return DataLoader(GCSMapDataset(URL, transform=read), batch_size=4, num_workers=WORKERS)
""",
    "iterable_dataset": """
from torchdata_gcs import GCSIterableDataset

def read(stream):
    return stream.read()

def make():
    return DataLoader(GCSIterableDataset(URL, transform=read), batch_size=4, num_workers=WORKERS)
""",
    "shard_dataset": """
from torchdata_gcs.shards import ShardDataset

def key(sample):
    return sample["__key__"]

def make():
    return DataLoader(ShardDataset(SHARDS, transform=key, shuffle_buffer=50), batch_size=4, num_workers=WORKERS)
""",
    "fsspec_find": """
from torchdata_gcs.fsspec import GCSFileSystem

class Found(IterableDataset):
    def __iter__(self):
        fs = GCSFileSystem()
        for path in mine(fs.find(URL)):
            yield fs.cat_file(path)

def make():
    return Found() if WORKERS == 0 else DataLoader(Found(), batch_size=None, num_workers=WORKERS)
""",
    "fsspec_glob": """
from torchdata_gcs.fsspec import GCSFileSystem

class Globbed(IterableDataset):
    def __iter__(self):
        fs = GCSFileSystem()
        for path in mine(fs.glob(URL + "*.bin")):
            with fs.open(path, "rb") as file:
                yield file.read()

def make():
    return Globbed() if WORKERS == 0 else DataLoader(Globbed(), batch_size=None, num_workers=WORKERS)
""",
    "fsspec_open": """
from torchdata_gcs.fsspec import GCSFileSystem

class Chunks(IterableDataset):
    def __iter__(self):
        fs = GCSFileSystem()
        for path in mine(sorted(fs.ls(BIG))):
            with fs.open(path, "rb") as file:
                while chunk := file.read(65536):
                    # A worker hands small results over: with 64 KiB ones, torch's DataLoader alone (no library of
                    # ours) takes 5 s a worker to end at Ctrl-C when a worker's result pipe is full at that moment.
                    yield chunk if WORKERS == 0 else len(chunk)

def make():
    return Chunks() if WORKERS == 0 else DataLoader(Chunks(), batch_size=None, num_workers=WORKERS)
""",
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with seeded_emulator() as running:
        yield running


@pytest.mark.parametrize("front", list(FRONTS))
def test_every_script_ends_at_once_and_quietly(front: str, emulator: Emulator) -> None:
    endings = run_scripts(scripts_of(front, FRONTS[front]), emulator.environ)
    failed = [str(ending) for ending in endings if ending.problems()]
    assert not failed, "\n".join(failed)
