"""``GCSClient``, the one handle every front end takes as ``client=``: its endpoint is resolved once, when it is
made, and goes with it into other processes; a transport given to it carries every request of every front end
(shown with a second HTTP stack, urllib3, counted against what the GCS front received)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import DataLoader

from tests.doc_blocks import doc_block
from tests.transport_kit import MARK, RecordingTransport
from torchdata_gcs import ClientConfig, GCSClient, GCSMapDataset, RetryConfig, TransferConfig, checkpoint
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

BUCKET = "client-transport"


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    gcs_emulator.seed(BUCKET, {f"d/{i}.bin": b"object %d" % i for i in range(12)})
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        yield running


@dataclass
class Recorded:
    client: GCSClient
    transport: RecordingTransport
    since: int  # requests the front had received before

    def assert_every_request_went_through(self, front: GCSFront) -> None:
        """The transport sent requests, and every request the front received since carries its mark: none
        went out another way (a batch's calls, which the front carries out itself, carry their batch's)."""
        received = front.recorded[self.since :]
        assert self.transport.sent and len(received) >= len(self.transport.sent)
        assert [r.target for r in received if r.header(MARK[0]) != [MARK[1]]] == []


@pytest.fixture
def recorded(front: GCSFront) -> Recorded:
    transport = RecordingTransport()
    client = GCSClient(front.client_config, retry=RetryConfig(deadline=60), transport=transport)
    return Recorded(client, transport, len(front.recorded))


def test_a_dataset_sends_every_request_through_the_clients_transport(front: GCSFront, recorded: Recorded) -> None:
    client, transport = recorded.client, recorded.transport
    dataset = GCSMapDataset(f"gs://{BUCKET}/d/", transform=lambda stream: stream.read(), client=client)
    assert sorted(item for batch in DataLoader(dataset, batch_size=5) for item in batch) == sorted(
        b"object %d" % i for i in range(12)
    )
    recorded.assert_every_request_went_through(front)
    assert {method for method, _ in transport.sent} == {"GET"} and len(transport.sent) >= 13  # a listing, 12 reads


def test_the_filesystem_sends_every_request_through_the_clients_transport(front: GCSFront, recorded: Recorded) -> None:
    client, transport = recorded.client, recorded.transport
    fs = GCSFileSystem(client=client, skip_instance_cache=True)
    fs.pipe_file(f"{BUCKET}/fs/a.txt", b"alpha")
    with fs.open(f"{BUCKET}/fs/b.txt", "wb") as file:
        file.write(b"beta")
    assert fs.ls(f"{BUCKET}/fs", detail=False) == [f"{BUCKET}/fs/a.txt", f"{BUCKET}/fs/b.txt"]
    assert fs.cat(f"{BUCKET}/fs/b.txt") == b"beta" and fs.client is client
    fs.rm(f"{BUCKET}/fs", recursive=True)  # a batch of deletes
    assert not fs.exists(f"{BUCKET}/fs/a.txt")
    recorded.assert_every_request_went_through(front)
    assert any("/batch/" in target for _, target in transport.sent)


def test_checkpoints_save_and_load_through_the_clients_transport(front: GCSFront, recorded: Recorded) -> None:
    client = recorded.client
    state = {"weights": torch.arange(3_000_000, dtype=torch.float32)}  # 12 MB: a save in parts
    url = f"gs://{BUCKET}/ckpt/model.pt"
    checkpoint.save(state, url, client=client.replace(transfer=TransferConfig(part_size=8 << 20)))
    assert torch.equal(checkpoint.load(url, client=client)["weights"], state["weights"])
    recorded.assert_every_request_went_through(front)
    assert sum("partNumber=" in target for _, target in recorded.transport.sent) == 2  # parts of 8 MiB


def test_the_endpoint_is_resolved_once_when_the_client_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    client = GCSClient()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9999")
    assert client.endpoint == "http://127.0.0.1:4443"
    assert GCSClient().endpoint == "http://127.0.0.1:9999"
    assert GCSClient(ClientConfig(endpoint="http://127.0.0.1:1234/")).endpoint == "http://127.0.0.1:1234"
    # It goes with the client into another process, whatever that process's environment says.
    script = "import pickle, sys; print(pickle.load(sys.stdin.buffer).endpoint)"
    child = subprocess.run(
        [sys.executable, "-c", script], input=pickle.dumps(client), capture_output=True, timeout=60, check=True
    )
    assert child.stdout.decode().strip() == "http://127.0.0.1:4443"


def test_settings_beside_a_client_replace_its_own_and_bad_ones_are_refused(front: GCSFront) -> None:
    client = GCSClient(front.client_config, retry=RetryConfig(deadline=30))
    dataset = GCSMapDataset(f"gs://{BUCKET}/d/", client=client, transfer=TransferConfig(max_in_flight=3))
    assert dataset.client.transfer.max_in_flight == 3 and dataset.client.retry.deadline == 30
    assert dataset.client.endpoint == client.endpoint == front.endpoint
    assert pickle.loads(pickle.dumps(client)) == client
    with pytest.raises(TypeError, match="config must be a ClientConfig, got str"):
        GCSClient("http://127.0.0.1:4443")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client must be a GCSClient or a ClientConfig, got dict"):
        GCSMapDataset(f"gs://{BUCKET}/d/", client={"endpoint": front.endpoint})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a RecordingTransport holds connections"):
        pickle.dumps(GCSClient(front.client_config, transport=RecordingTransport()))


def test_the_readme_settings_snippet_reads_and_saves_through_one_client(
    gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    gcs_emulator.seed("readme-client", {"train/a.bin": b"a", "train/b.bin": b"b"})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    namespace: dict[str, object] = {}
    exec(doc_block("client = GCSClient(").replace("gs://my-bucket/", "gs://readme-client/"), namespace)  # noqa: S102
    assert [url for url, _ in namespace["dataset"]] == [
        "gs://readme-client/train/a.bin",
        "gs://readme-client/train/b.bin",
    ]  # type: ignore[attr-defined]
    assert checkpoint.load("gs://readme-client/ckpt/step-1.pt", client=namespace["client"]) == {"step": 1}  # type: ignore[arg-type]
