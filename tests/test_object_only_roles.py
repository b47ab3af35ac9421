"""An identity with object roles only (Storage Object Viewer, User, Admin: no ``storage.buckets.*``
permission, the usual grant of a training service account) can do everything the data path does:
list, load, compose, checkpoint, and the fsspec calls on a bucket (``info``, ``exists``, ``isdir``,
``mkdir``, ``makedirs``). ``GCSFront(object_only=True)`` refuses every call on a bucket's own
resource with GCS's 403, as GCS does for such an identity."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import AccessDeniedError, GCSMapDataset, WriteConfig, checkpoint
from torchdata_gcs._engines.upload import MIN_PART_SIZE
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

MISSING = "no-such-bucket-9e2a"


@pytest.fixture
def front(gcs_emulator: Emulator) -> GCSFront:
    with GCSFront(gcs_emulator.endpoint, object_only=True) as running:
        yield running


def answer(url: str, method: str = "GET") -> tuple[int, dict]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_front_refuses_bucket_calls_with_gcs_words_and_lets_object_calls_pass(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"a.txt": b"alpha"})
    base = f"{front.endpoint}/storage/v1/b"
    status, body = answer(f"{base}/{gcs_bucket}?fields=name")
    message = body["error"]["message"]
    assert status == 403 and body["error"]["errors"][0]["reason"] == "forbidden"
    assert "does not have storage.buckets.get access to the Google Cloud Storage bucket." in message
    assert "Permission 'storage.buckets.get' denied on resource (or it may not exist)." in message
    assert answer(f"{base}/{gcs_bucket}", "DELETE")[0] == 403
    assert "storage.buckets.delete" in answer(f"{base}/{gcs_bucket}", "DELETE")[1]["error"]["message"]
    assert (
        "storage.buckets.list access to the Google Cloud project" in answer(f"{base}?project=p")[1]["error"]["message"]
    )
    assert "storage.buckets.getIamPolicy" in answer(f"{base}/{gcs_bucket}/iam")[1]["error"]["message"]
    assert answer(f"{base}/{gcs_bucket}/o?maxResults=1")[0] == 200
    assert answer(f"{base}/{gcs_bucket}/o/a.txt")[0] == 200
    assert answer(f"{base}/{MISSING}/o?maxResults=1")[0] == 404  # a missing bucket is still told apart
    status, layout = answer(f"{base}/{gcs_bucket}/storageLayout")  # storage.objects.list suffices
    assert status == 200 and layout["hierarchicalNamespace"] == {"enabled": False} and layout["location"]
    assert answer(f"{base}/{MISSING}/storageLayout")[0] == 404
    assert gcs_emulator.names(gcs_bucket) == ["a.txt"]  # the refused DELETE reached nothing


@pytest.mark.parametrize("empty", [False, True])
def test_fsspec_calls_on_a_bucket_need_object_permissions_only(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, empty: bool
) -> None:
    if not empty:
        gcs_emulator.seed(gcs_bucket, {"data/a.txt": b"alpha"})
    fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
    for path in (f"gs://{gcs_bucket}", f"gs://{gcs_bucket}/", gcs_bucket):
        assert fs.info(path) == {"name": gcs_bucket, "type": "directory", "size": 0}
        assert fs.exists(path) and fs.isdir(path)
    fs.makedirs(f"gs://{gcs_bucket}", exist_ok=True)
    fs.makedirs(f"gs://{gcs_bucket}/checkpoints/run-1", exist_ok=True)
    fs.mkdir(f"gs://{gcs_bucket}/logs")
    fs.mkdir(f"gs://{gcs_bucket}")
    fs.pipe_file(f"gs://{gcs_bucket}/checkpoints/run-1/done", b"1")
    assert fs.cat(f"gs://{gcs_bucket}/checkpoints/run-1/done") == b"1"
    # Never a GET of the bucket: one of the object, whose live generation makes pipe_file's write conditional
    # (so it may be retried); cat reads the media.
    assert front.counts["metadata"] == 1


def test_a_missing_bucket_is_still_missing_without_bucket_permissions(front: GCSFront) -> None:
    fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
    assert not fs.exists(f"gs://{MISSING}") and not fs.isdir(f"gs://{MISSING}")
    with pytest.raises(FileNotFoundError, match=f"bucket '{MISSING}' does not exist"):
        fs.info(f"gs://{MISSING}")
    with pytest.raises(FileNotFoundError, match=f"bucket '{MISSING}' does not exist"):
        fs.makedirs(f"gs://{MISSING}/dir", exist_ok=True)


def test_an_identity_that_may_only_create_objects_can_still_make_directories(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    # Storage Object Creator has storage.objects.create alone: listing is refused as well.
    with GCSFront(gcs_emulator.endpoint, object_only=True, faults=[Fault("http_403", match="list")]) as front:
        fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
        fs.makedirs(f"gs://{gcs_bucket}/out", exist_ok=True)
        fs.mkdir(f"gs://{gcs_bucket}/out")
        fs.pipe_file(f"gs://{gcs_bucket}/out/a.txt", b"alpha")
        with pytest.raises(AccessDeniedError, match="needs storage.objects.list"):
            fs.info(f"gs://{gcs_bucket}")
    assert gcs_emulator.names(gcs_bucket) == ["out/a.txt"]


def test_the_data_path_never_asks_for_the_bucket(front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {f"ds/{i:03d}.bin": bytes([i]) * (100 + i) for i in range(40)}
    gcs_emulator.seed(gcs_bucket, objects)
    client = front.client_config
    expected = {f"gs://{gcs_bucket}/{name}": data for name, data in objects.items()}
    listed = list(IterableWrapper([f"gs://{gcs_bucket}/ds/"]).list_files_by_gcs(client=client))
    assert listed == sorted(expected)
    loaded = {url: stream.read() for url, stream in IterableWrapper(listed).load_files_by_gcs(client=client)}
    composed = {url: stream.read() for url, stream in IterableWrapper(listed).compose_shards_by_gcs(client=client)}
    assert loaded == composed == expected
    dataset = GCSMapDataset.from_prefix(f"gs://{gcs_bucket}/ds/", client=client)
    assert dict(dataset[i] for i in range(len(dataset))) == expected  # items are (url, bytes) by default
    state = {"weights": torch.arange(3 * MIN_PART_SIZE // 4, dtype=torch.float32)}
    url = f"gs://{gcs_bucket}/run/step-1.pt"
    checkpoint.save(state, url, client=client, write=WriteConfig(part_size=MIN_PART_SIZE))
    assert torch.equal(checkpoint.load(url, client=client)["weights"], state["weights"])
