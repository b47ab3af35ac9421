"""Every script ends, through ``torchdata.nodes``: a ``Loader`` over ``ListFiles`` -> ``LoadFiles``, with and
without ``EpochObjects``, stopped early in each way of ``tests/script_endings.py``; "two workers" map what
it reads in two threads (``ParallelMapper``, whose own thread then reads ``LoadFiles``).

Not with ``method="process"``: its worker processes, which run no code of ours, print their own
KeyboardInterrupt tracebacks at Ctrl-C and outlive a main process ended by SIGTERM (they never look
for their parent), whatever they map."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.script_endings import run_scripts, scripts_of, seeded_emulator
from torchdata_gcs.testing import Emulator

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata 0.10+ (the second environment)")

LOADER = """
from torchdata.nodes import Loader, ParallelMapper
from torchdata_gcs.nodes import EpochObjects, ListFiles, LoadFiles

def read(url, stream):
    return stream.read()

def make():
    node = LoadFiles({source}, transform=read)
    if WORKERS:
        node = ParallelMapper(node, map_fn=len, num_workers=WORKERS, method="thread")
    return Loader(node)
"""

FRONTS = {
    "nodes": LOADER.format(source="ListFiles([URL])"),
    "nodes_epochs": LOADER.format(source="EpochObjects(ListFiles([URL]), shuffle=True)"),
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
