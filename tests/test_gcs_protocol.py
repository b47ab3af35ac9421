"""Requests and answers as GCS documents them, through a front as strict as GCS: headers GCS does not
promise may be missing, hashes come on separate lines, damaged parts are refused, preconditions hold."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import parse_qsl, urlsplit
from xml.etree import ElementTree

import pytest
import requests
import torch
import torch.distributed.checkpoint as dcp

from tests.http_proxy import RecordingProxy
from torchdata_gcs import (
    ClientConfig,
    GCSError,
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    IntegrityError,
    PreconditionFailedError,
    RetryConfig,
    TransferConfig,
    UploadError,
    WriteConfig,
    checkpoint,
)
from torchdata_gcs._engines.upload import MIN_PART_SIZE, CompositeWriter, MultipartWriter
from torchdata_gcs._ops.checksums import crc32c_base64
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.objects import multipart_body
from torchdata_gcs._ops.uploads import unfinished_uploads
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.dcp import GCSStorageReader, GCSStorageWriter
from torchdata_gcs.testing import Emulator, Fault, GCSFront, RecordedRequest

MiB = 1024 * 1024
BUCKET = "gcs-protocol"
FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


@pytest.fixture
def strict(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    """A front that sends only the response headers GCS promises."""
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, only_promised_headers=True) as running:
        yield running


@pytest.fixture
def front(gcs_emulator: Emulator, gcs_front: GCSFront) -> GCSFront:
    gcs_emulator.create_bucket(BUCKET)
    return gcs_front


def multipart_save(front: GCSFront, name: str, data: bytes, **settings) -> MultipartWriter:
    with MultipartWriter(
        f"gs://{BUCKET}/{name}",
        client=Client(front.client_config, settings.pop("retry", None)),
        part_size=MIN_PART_SIZE,
        **settings,
    ) as writer:
        writer.write(data)
    return writer


def live_generation(emulator: Emulator, name: str) -> int:
    resource = Client(emulator.client_config, FAST_RETRY).head(BUCKET, name, "generation")
    assert resource is not None, f"{name} does not exist"
    return int(resource["generation"])


# -- the multipart writer ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sent", [(), ("x-goog-generation",), ("x-goog-hash",)], ids=["neither", "no-hash", "no-generation"]
)
def test_a_completion_answer_without_generation_or_hash_saves_and_keeps_the_object(
    gcs_emulator: Emulator, sent: tuple[str, ...]
) -> None:
    gcs_emulator.create_bucket(BUCKET)
    gcs_emulator.upload(BUCKET, "ckpt.pt", b"the previous checkpoint")
    data = os.urandom(11 * MiB)
    with GCSFront(gcs_emulator.endpoint, only_promised_headers=True, also_send=sent) as strict:
        writer = multipart_save(strict, "ckpt.pt", data)
        assert strict.open_uploads == [] and strict.counts["delete"] == 1  # the upload's marker, nothing else
    assert gcs_emulator.read(BUCKET, "ckpt.pt") == data
    assert writer.generation == live_generation(gcs_emulator, "ckpt.pt")


def test_a_part_damaged_on_the_way_is_refused_by_gcs_and_sent_again(front: GCSFront, gcs_emulator: Emulator) -> None:
    front.set_faults([Fault("corrupt", match=r"^PUT .*partNumber=2", times=1)])
    data = os.urandom(12 * MiB)
    multipart_save(front, "ckpt.pt", data, retry=FAST_RETRY)
    assert gcs_emulator.read(BUCKET, "ckpt.pt") == data
    assert front.faults_injected["corrupt"] == 1
    assert front.counts["upload"] == 1 + 1 + 3 + 1 + 1  # initiate, marker, 3 parts, the damaged one again, complete


def test_an_existing_checkpoint_survives_a_save_whose_parts_keep_arriving_damaged(
    front: GCSFront, gcs_emulator: Emulator
) -> None:
    gcs_emulator.upload(BUCKET, "ckpt.pt", b"the previous checkpoint")
    front.set_faults([Fault("corrupt", match=r"^PUT .*partNumber=")])
    with pytest.raises(UploadError, match="aborted") as raised:
        multipart_save(front, "ckpt.pt", os.urandom(11 * MiB), retry=FAST_RETRY)
    assert isinstance(raised.value.__cause__, IntegrityError)
    assert gcs_emulator.read(BUCKET, "ckpt.pt") == b"the previous checkpoint"
    assert front.open_uploads == []


def test_every_part_carries_its_crc32c(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        data = os.urandom(6 * MiB)
        multipart_save(front, "ckpt.pt", data)
        parts = sorted((r for r in front.recorded if r.method == "PUT"), key=lambda r: r.target)  # partNumber=1, 2
    assert [r.header("x-goog-hash") for r in parts] == [
        [f"crc32c={crc32c_base64(data[:MIN_PART_SIZE])}"],
        [f"crc32c={crc32c_base64(data[MIN_PART_SIZE:])}"],
    ]


# -- reads -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [100_000, 3 * MiB], ids=["one-request", "ranges"])
def test_hashes_on_separate_lines_md5_first_and_a_flipped_byte_raise(
    front: GCSFront, gcs_emulator: Emulator, size: int
) -> None:
    gcs_emulator.upload(BUCKET, "known.bin", os.urandom(size))
    front.set_faults([Fault("corrupt", match=r"^GET /download/")])
    transfer = TransferConfig(part_size=1 * MiB)
    pipe = GCSFileLoaderIterDataPipe(
        [f"gs://{BUCKET}/known.bin"], client=front.client_config, retry=FAST_RETRY, transfer=transfer
    )
    with pytest.raises(IntegrityError, match="crc32c"):
        [stream.read() for _, stream in pipe]
    assert front.faults_injected["corrupt"] >= 3


def test_one_flipped_byte_on_a_known_url_is_read_again(front: GCSFront, gcs_emulator: Emulator) -> None:
    data = os.urandom(100_000)
    gcs_emulator.upload(BUCKET, "known.bin", data)
    front.set_faults([Fault("corrupt", match="range_get", times=1)])
    pipe = GCSFileLoaderIterDataPipe([f"gs://{BUCKET}/known.bin"], client=front.client_config, retry=FAST_RETRY)
    assert [stream.read() for _, stream in pipe] == [data]
    assert front.faults_injected["corrupt"] == 1


# -- the writers and readers where GCS sends only what it promises ------------------------------------


@pytest.mark.parametrize("size", [0, 70_000, 3 * MiB + 5], ids=["empty", "one-request", "ranges"])
def test_reads_need_no_header_gcs_does_not_promise(strict: GCSFront, gcs_emulator: Emulator, size: int) -> None:
    data = os.urandom(size)
    gcs_emulator.upload(BUCKET, "object.bin", data)
    url = f"gs://{BUCKET}/object.bin"
    transfer = TransferConfig(part_size=1 * MiB)
    known = GCSFileLoaderIterDataPipe([url], client=strict.client_config, retry=FAST_RETRY, transfer=transfer)
    assert [stream.read() for _, stream in known] == [data]
    listed = GCSFileListerIterDataPipe(url, client=strict.client_config, with_metadata=True)
    pipe = GCSFileLoaderIterDataPipe(listed, client=strict.client_config, retry=FAST_RETRY, transfer=transfer)
    assert [stream.read() for _, stream in pipe] == [data]


def test_reads_of_several_ranges_are_pinned_and_checked_without_those_headers(
    gcs_emulator: Emulator,
) -> None:
    gcs_emulator.create_bucket(BUCKET)
    data = os.urandom(3 * MiB)
    gcs_emulator.upload(BUCKET, "object.bin", data)
    with GCSFront(
        gcs_emulator.endpoint, only_promised_headers=True, also_send=["content-length"], record=True
    ) as strict:
        strict.set_faults([Fault("corrupt", match="range_get")])
        pipe = GCSFileLoaderIterDataPipe(
            [f"gs://{BUCKET}/object.bin"],
            client=strict.client_config,
            retry=FAST_RETRY,
            transfer=TransferConfig(part_size=1 * MiB),
        )
        with pytest.raises(IntegrityError):  # the crc32c came from the object's metadata
            [stream.read() for _, stream in pipe]
        first, *ranges = [r for r in strict.recorded if r.header("Range")]
    generation = str(live_generation(gcs_emulator, "object.bin"))
    # the first part is asked before the generation is known; every later range is pinned to it
    assert "generation" not in dict(parse_qsl(urlsplit(first.target).query))
    assert ranges and all(dict(parse_qsl(urlsplit(r.target).query))["generation"] == generation for r in ranges)


@pytest.mark.parametrize("strategy", ["multipart", "compose"])
def test_checkpoints_round_trip_without_those_headers(strict: GCSFront, strategy: str) -> None:
    state = {"weights": torch.randn(700, 1000), "step": 7}
    url = f"gs://{BUCKET}/ckpt-{strategy}.pt"
    generation = checkpoint.save(
        state, url, client=strict.client_config, write=WriteConfig(part_size=MIN_PART_SIZE, strategy=strategy)
    )
    loaded = checkpoint.load(url, client=strict.client_config, transfer=TransferConfig(part_size=1 * MiB))
    assert generation > 0 and loaded["step"] == 7 and torch.equal(loaded["weights"], state["weights"])


def test_composed_shards_without_those_headers(strict: GCSFront, gcs_emulator: Emulator) -> None:
    objects = {f"shards/{i:03d}.bin": os.urandom(1000 + i) for i in range(40)}
    gcs_emulator.seed(BUCKET, objects)
    listed = GCSFileListerIterDataPipe(f"gs://{BUCKET}/shards/", client=strict.client_config, with_metadata=True)
    pipe = listed.compose_shards_by_gcs(client=strict.client_config, retry=FAST_RETRY)
    assert [(url, stream.read()) for url, stream in pipe] == [(f"gs://{BUCKET}/{n}", d) for n, d in objects.items()]
    assert pipe.stats.composes == 2


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_distributed_checkpoint_without_those_headers(strict: GCSFront) -> None:
    state = {"weights": torch.randn(1024, 1536), "bias": torch.arange(10)}
    url = f"gs://{BUCKET}/dcp/step-1"
    dcp.save(
        state,
        storage_writer=GCSStorageWriter(url, client=strict.client_config, write=WriteConfig(part_size=MIN_PART_SIZE)),
    )
    loaded = {key: torch.zeros_like(value) for key, value in state.items()}
    reader = GCSStorageReader(url, client=strict.client_config, transfer=TransferConfig(part_size=1 * MiB))
    dcp.load(loaded, storage_reader=reader)
    assert all(torch.equal(loaded[key], state[key]) for key in state)


def test_composite_writer_without_those_headers(strict: GCSFront, gcs_emulator: Emulator) -> None:
    data = os.urandom(2 * MiB + 3)
    with CompositeWriter(f"gs://{BUCKET}/c.bin", client=Client(strict.client_config), part_size=256 * 1024) as writer:
        writer.write(data)
    assert gcs_emulator.read(BUCKET, "c.bin") == data
    assert not [name for name in gcs_emulator.names(BUCKET) if name.startswith(TEMPORARY_PREFIX)]


# -- requester pays ------------------------------------------------------------------------------------


def test_requester_pays_names_the_project_as_each_api_documents(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        client = ClientConfig(endpoint=front.endpoint, user_project="billed-project")
        with MultipartWriter(f"gs://{BUCKET}/rp.bin", client=Client(client), part_size=MIN_PART_SIZE) as writer:
            writer.write(os.urandom(6 * MiB))
        assert list(unfinished_uploads(Client(client, FAST_RETRY), BUCKET)) == []
        [stream.read() for _, stream in GCSFileLoaderIterDataPipe([f"gs://{BUCKET}/rp.bin"], client=client)]
        recorded = front.recorded

    def is_json(request: RecordedRequest) -> bool:
        return request.target.startswith(("/storage/", "/upload/", "/download/"))

    xml = [r for r in recorded if not is_json(r)]
    json_api = [r for r in recorded if is_json(r)]
    assert len(xml) == 1 + 2 + 1 + 1 and json_api  # initiate, 2 parts, complete, list uploads; a read
    # the query of initiation and listing as the XML API documents it: a bare `uploads`, not `uploads=`
    assert xml[0].target == f"/{BUCKET}/rp.bin?uploads" and xml[-1].target == f"/{BUCKET}?uploads", xml
    for request in xml:
        assert request.header("x-goog-user-project") == ["billed-project"], request.target
        assert "userProject" not in dict(parse_qsl(urlsplit(request.target).query)), request.target
    for request in json_api:
        assert dict(parse_qsl(urlsplit(request.target).query))["userProject"] == "billed-project"


# -- the official client, as the reference for what GCS accepts ----------------------------------------


def official_upload(front: GCSFront, name: str, path: str, chunk_size: int) -> None:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage import transfer_manager

    client = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=front.endpoint)
    )
    blob = client.bucket(BUCKET).blob(name)
    transfer_manager.upload_chunks_concurrently(
        path, blob, content_type="application/octet-stream", chunk_size=chunk_size, worker_type="thread", max_workers=1
    )


def xml_requests(front: GCSFront) -> list[RecordedRequest]:
    """The XML API requests recorded, parts in part-number order (they go out concurrently)."""
    xml = [r for r in front.recorded if not r.target.startswith(("/storage/", "/upload/", "/download/"))]
    return [
        xml[0],
        *sorted(xml[1:-1], key=lambda r: int(dict(parse_qsl(r.target.partition("?")[2]))["partNumber"])),
        xml[-1],
    ]


def test_the_official_client_multipart_upload_passes_the_strict_front(
    strict: GCSFront, gcs_emulator: Emulator, tmp_path
) -> None:
    data = os.urandom(11 * MiB)
    (tmp_path / "file.bin").write_bytes(data)
    official_upload(strict, "official.bin", str(tmp_path / "file.bin"), MIN_PART_SIZE)
    assert gcs_emulator.read(BUCKET, "official.bin") == data
    assert strict.open_uploads == []


def test_our_multipart_requests_match_the_official_client(gcs_emulator: Emulator, tmp_path) -> None:
    gcs_emulator.create_bucket(BUCKET)
    data = os.urandom(11 * MiB)
    (tmp_path / "file.bin").write_bytes(data)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        official_upload(front, "same.bin", str(tmp_path / "file.bin"), MIN_PART_SIZE)
        official = xml_requests(front)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        multipart_save(front, "same.bin", data)
        ours = xml_requests(front)

    def shape(request: RecordedRequest) -> tuple[str, str, list[str]]:
        path, _, query = request.target.partition("?")
        return request.method, path, sorted(key for key, _ in parse_qsl(query, keep_blank_values=True))

    assert [shape(r) for r in ours] == [shape(r) for r in official]
    assert ours[0].header("Content-Type") == official[0].header("Content-Type")
    # the completion document's type as GCS's documentation gives it (the official client sends its
    # object's content type there, which GCS accepts too)
    assert ours[-1].header("Content-Type") == ["application/xml"]
    assert [r.body for r in ours[1:-1]] == [r.body for r in official[1:-1]]  # the same parts
    # the same completion document: the parts in order, each with the ETag its upload was answered
    assert ElementTree.fromstring(ours[-1].body).tag == ElementTree.fromstring(official[-1].body).tag
    assert ours[-1].body == official[-1].body
    # each part of ours carries its crc32c, which GCS's XML API accepts on part uploads
    assert all(r.header("x-goog-hash") for r in ours[1:-1])
    assert gcs_emulator.read(BUCKET, "same.bin") == data


# -- gzip-encoded objects ------------------------------------------------------------------------------


def test_gzip_encoded_objects_load_as_their_stored_and_checked_bytes(strict: GCSFront, gcs_emulator: Emulator) -> None:
    """GCS would decompress them on the way (decompressive transcoding), serving bytes that no
    checksum it keeps covers; asking for gzip gets the stored bytes, which the crc32c covers."""
    text = b"a line of text\n" * 5000
    stored = gzip.compress(text)
    body, headers = multipart_body("logs.txt", stored, "text/plain")
    body = b"".join(body).replace(
        b'"contentType": "text/plain"}', b'"contentType": "text/plain", "contentEncoding": "gzip"}', 1
    )
    upload = requests.post(
        f"{gcs_emulator.endpoint}/upload/storage/v1/b/{BUCKET}/o",
        params={"uploadType": "multipart"},
        data=body,
        headers=headers,
        timeout=30,
    )
    assert upload.json()["contentEncoding"] == "gzip"
    url = f"gs://{BUCKET}/logs.txt"
    known = GCSFileLoaderIterDataPipe([url], client=strict.client_config, retry=FAST_RETRY)
    listed = GCSFileLoaderIterDataPipe(
        GCSFileListerIterDataPipe(url, client=strict.client_config, with_metadata=True), client=strict.client_config
    )
    for pipe in (known, listed):
        ((_, stream),) = list(pipe)
        assert gzip.decompress(stream.read()) == text


def upload_gzip_encoded(emulator: Emulator, name: str, stored: bytes) -> None:
    body, headers = multipart_body(name, stored, "text/plain")
    body = b"".join(body).replace(
        b'"contentType": "text/plain"}', b'"contentType": "text/plain", "contentEncoding": "gzip"}', 1
    )
    upload = requests.post(
        f"{emulator.endpoint}/upload/storage/v1/b/{BUCKET}/o",
        params={"uploadType": "multipart"},
        data=body,
        headers=headers,
        timeout=30,
    )
    assert upload.json()["contentEncoding"] == "gzip"


def test_a_range_answered_whole_fails_at_once_with_what_happened(gcs_emulator: Emulator) -> None:
    """A proxy that drops ``Accept-Encoding: gzip`` makes GCS decompress and ignore Range: the answer
    is 200 with the whole object, every time, so it is named, not retried as damaged bytes."""
    gcs_emulator.create_bucket(BUCKET)
    stored = gzip.compress(os.urandom(1 * MiB))
    upload_gzip_encoded(gcs_emulator, "big.txt.gz", stored)
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        proxy.replace_headers = {"Accept-Encoding": "identity"}
        client = ClientConfig(endpoint=proxy.endpoint)
        listed = GCSFileListerIterDataPipe(f"gs://{BUCKET}/big.txt.gz", client=client, with_metadata=True)
        pipe = GCSFileLoaderIterDataPipe(listed, client=client, transfer=TransferConfig(part_size=256 * 1024))
        with pytest.raises(GCSError, match="got status 200") as caught:
            list(pipe)
    assert not isinstance(caught.value, IntegrityError)
    media = [path for method, path, _ in proxy.requests if "alt=media" in path]
    assert len(media) == len(range(0, len(stored), 256 * 1024)), "each range asked once, none retried"


def test_reads_ask_for_gzip_and_writes_do_not(gcs_emulator: Emulator) -> None:
    """Stored bytes for object reads (the checksums cover them); compressed JSON for listing pages and
    metadata, which the front compresses as GCS does when asked and the client decompresses; plain
    answers for uploads, composes and deletes."""
    gcs_emulator.create_bucket(BUCKET)
    gcs_emulator.seed(BUCKET, {f"s/{i}.bin": os.urandom(100) for i in range(4)})
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        listed = GCSFileListerIterDataPipe(f"gs://{BUCKET}/s/", client=front.client_config, with_metadata=True)
        pipe = listed.compose_shards_by_gcs(client=front.client_config)
        assert len([stream.read() for _, stream in pipe]) == 4
        with CompositeWriter(
            f"gs://{BUCKET}/c.bin", client=Client(front.client_config), part_size=256 * 1024
        ) as writer:
            writer.write(os.urandom(600 * 1024))
        recorded = front.recorded
    media = [r for r in recorded if r.method == "GET" and "alt=media" in r.target]
    metadata = [r for r in recorded if r.method == "GET" and "alt=media" not in r.target]
    rest = [r for r in recorded if r.method != "GET"]
    assert media and metadata and {r.method for r in rest} == {"POST", "DELETE"}
    assert any(urlsplit(r.target).path == f"/storage/v1/b/{BUCKET}/o" for r in metadata), "a listing page"
    assert {str(r.header("User-Agent")) for r in recorded} == {str(media[0].header("User-Agent"))}, "one HTTP stack"
    assert "gzip" in media[0].header("User-Agent")[0]  # Google's APIs compress only for an agent that says so
    assert [r.header("Accept-Encoding") for r in media + metadata] == [["gzip"]] * len(media + metadata)
    assert [(r.target, r.header("Accept-Encoding")) for r in rest] == [(r.target, ["identity"]) for r in rest]


def test_a_damaged_compressed_listing_page_is_asked_again(gcs_emulator: Emulator) -> None:
    gcs_emulator.seed(BUCKET, {f"damaged/{i}.bin": b"x" for i in range(50)})
    faults = [Fault("corrupt", match="list", times=1)]
    with GCSFront(gcs_emulator.endpoint, faults=faults) as front:
        listed = list(GCSFileListerIterDataPipe(f"gs://{BUCKET}/damaged/", client=front.client_config))
        assert front.counts["list"] == 2  # the damaged page, and the same page again
    assert sorted(listed) == sorted(f"gs://{BUCKET}/damaged/{i}.bin" for i in range(50))


def test_temporary_objects_are_deleted_by_generation(gcs_emulator: Emulator) -> None:
    """So that object versioning keeps no noncurrent copy of them."""
    gcs_emulator.create_bucket(BUCKET)
    gcs_emulator.seed(BUCKET, {f"s/{i}.bin": os.urandom(100) for i in range(4)})
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        listed = GCSFileListerIterDataPipe(f"gs://{BUCKET}/s/", client=front.client_config, with_metadata=True)
        assert len(list(listed.compose_shards_by_gcs(client=front.client_config))) == 4
        with CompositeWriter(
            f"gs://{BUCKET}/c.bin", client=Client(front.client_config), part_size=256 * 1024
        ) as writer:
            writer.write(os.urandom(600 * 1024))
        deletes = [r for r in front.recorded if r.method == "DELETE"]
    assert len(deletes) == 1 + 1  # the probe, one composite (the writer's compose deleted its three parts)
    for request in deletes:
        params = dict(parse_qsl(urlsplit(request.target).query))
        assert params.get("generation", "").isdigit() and "ifGenerationMatch" not in params, request.target
    assert not [name for name in gcs_emulator.names(BUCKET) if name.startswith(TEMPORARY_PREFIX)]


# -- a retried create that meets its own first write -----------------------------------------------------


def test_a_create_whose_answer_was_lost_is_recognised_on_retry(front: GCSFront, gcs_emulator: Emulator) -> None:
    client = Client(front.client_config, FAST_RETRY)
    front.set_faults([Fault("truncate", match="upload", times=1)])  # written, the answer cut short
    generation = client.create(BUCKET, "once.bin", b"ours", if_generation_match=0)
    assert generation == live_generation(gcs_emulator, "once.bin") and front.faults_injected["truncate"] == 1
    with pytest.raises(PreconditionFailedError):  # a first attempt's 412 is a real conflict
        client.create(BUCKET, "once.bin", b"ours", if_generation_match=0)
    front.set_faults([Fault("http_503", match="upload", times=1)])  # nothing written, then a 412 on retry
    with pytest.raises(PreconditionFailedError):  # someone else's bytes are never taken for ours
        client.create(BUCKET, "once.bin", b"theirs", if_generation_match=0)
    assert gcs_emulator.read(BUCKET, "once.bin") == b"ours"


def test_composing_survives_a_lost_answer_to_its_probe(front: GCSFront, gcs_emulator: Emulator) -> None:
    objects = {f"p/{i}.bin": os.urandom(500) for i in range(6)}
    gcs_emulator.seed(BUCKET, objects)
    front.set_faults([Fault("truncate", match="upload", times=1)])
    listed = GCSFileListerIterDataPipe(f"gs://{BUCKET}/p/", client=front.client_config, with_metadata=True)
    pipe = listed.compose_shards_by_gcs(client=front.client_config, retry=FAST_RETRY)
    assert [(url, stream.read()) for url, stream in pipe] == [(f"gs://{BUCKET}/{n}", d) for n, d in objects.items()]
    assert pipe.stats.composes == 1 and front.faults_injected["truncate"] == 1
    assert not [name for name in gcs_emulator.names(BUCKET) if name.startswith(TEMPORARY_PREFIX)]


# -- settings GCS refuses ------------------------------------------------------------------------------


def test_parts_larger_than_gcs_takes_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="part_size must be"):
        MultipartWriter(f"gs://{BUCKET}/x", client=Client(ClientConfig()), part_size=5 * 1024**3 + 1)


def test_unfinished_uploads_of_a_prefix(front: GCSFront) -> None:
    for name in ("scratch/a.bin", "scratch/b.bin", "other/c.bin"):
        assert requests.post(f"{front.endpoint}/{BUCKET}/{name}", params={"uploads": ""}, timeout=30).ok
    client = Client(front.client_config, FAST_RETRY)
    listed = unfinished_uploads(client, BUCKET, prefix="scratch/")
    assert [upload.name for upload in listed] == ["scratch/a.bin", "scratch/b.bin"]
    assert len(list(unfinished_uploads(client, BUCKET))) == 3


# -- a save whose every completion answer is lost ----------------------------------------------------


@pytest.mark.parametrize("strategy", ["multipart", "compose"])
def test_a_save_whose_completion_answers_are_all_lost_reports_what_was_published(
    front: GCSFront, gcs_emulator: Emulator, strategy: str
) -> None:
    url = f"gs://{BUCKET}/lost-{strategy}.pt"
    completion = (
        rf"POST /{BUCKET}/lost-{strategy}\.pt\?uploadId" if strategy == "multipart" else r"/lost-[a-z]+\.pt/compose"
    )
    state = {"weights": torch.randn(1024, 1536)}  # 6 MiB: two parts
    front.set_faults([Fault("truncate", match=completion)])  # carried out, every answer cut short
    generation = checkpoint.save(
        state,
        url,
        client=front.client_config,
        retry=FAST_RETRY,
        write=WriteConfig(part_size=MIN_PART_SIZE, strategy=strategy),
    )
    assert generation == live_generation(gcs_emulator, f"lost-{strategy}.pt")
    # A completion is not sent again once its object is found; a retried compose, conditional, meets its
    # own earlier one (412) and stops there: the URL holds exactly the bytes written either way.
    cuts = front.faults_injected["truncate"]
    assert cuts == 1 if strategy == "multipart" else cuts >= 1
    assert torch.equal(checkpoint.load(url, client=front.client_config)["weights"], state["weights"])

    # never carried out; a 503 is retried until the deadline (a completion's own: completion_timeout)
    front.set_faults([Fault("http_503", match=completion)])
    with pytest.raises(UploadError, match=f"holds generation {generation}, other bytes; nothing was deleted"):
        checkpoint.save({"weights": torch.zeros(1024, 1536)}, url,
                        client=replace(front.client_config, completion_timeout=3),
                        retry=replace(FAST_RETRY, deadline=3),
                        write=WriteConfig(part_size=MIN_PART_SIZE, strategy=strategy))  # fmt: skip
    assert torch.equal(checkpoint.load(url, client=front.client_config)["weights"], state["weights"])
    assert front.open_uploads == [] and not [n for n in gcs_emulator.names(BUCKET) if n.startswith(TEMPORARY_PREFIX)]
