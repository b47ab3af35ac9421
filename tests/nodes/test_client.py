"""A ``torchdata.nodes`` loader sends every request through the transport of the ``GCSClient`` it is given."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("torchdata.nodes", reason="torchdata.nodes needs torchdata >= 0.10 (the second test environment)")

from torchdata.nodes import Loader

from tests.transport_kit import MARK, RecordingTransport
from torchdata_gcs import GCSClient
from torchdata_gcs.nodes import EpochObjects, ListFiles, LoadFiles
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET = "nodes-client"
OBJECTS = {f"d/{i}.bin": b"object %d" % i for i in range(9)}


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    gcs_emulator.seed(BUCKET, OBJECTS)
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        yield running


def test_a_nodes_loader_sends_every_request_through_the_clients_transport(front: GCSFront) -> None:
    transport = RecordingTransport()
    client = GCSClient(front.client_config, transport=transport)
    since = len(front.recorded)
    node = LoadFiles(
        EpochObjects(ListFiles(f"gs://{BUCKET}/d/", client=client)), transform=lambda s: s.read().upper(), client=client
    )
    assert sorted(Loader(node)) == sorted(data.upper() for data in OBJECTS.values())
    received = front.recorded[since:]
    assert len(transport.sent) >= 10 and len(received) == len(transport.sent)  # a listing and 9 reads
    assert [r.target for r in received if r.header(MARK[0]) != [MARK[1]]] == []
