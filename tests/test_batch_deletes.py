"""Deleting many objects through GCS's JSON batch endpoint: at most 100 calls per batch request, each
inner answer read on its own (deleted, already gone, replaced, retried), and a front that serves the
endpoint as GCS documents it, its inner calls counted, checked and faulted as single requests are."""

from __future__ import annotations

import time

import pytest
import requests

from torchdata_gcs import AccessDeniedError, PreconditionFailedError, RetryConfig, TransientError
from torchdata_gcs._ops.batch import BatchAnswer, delete_objects, parse_batch_answer
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.cli import main
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

pytestmark = pytest.mark.timeout(180)

FAST_RETRY = RetryConfig(initial_delay=0.01, max_delay=0.05)


def filesystem(front: GCSFront) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, retry=FAST_RETRY, skip_instance_cache=True)


def test_a_recursive_rm_of_250_objects_sends_3_batches(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {f"run/{i:03d}": b"x" for i in range(250)} | {"keep": b"k"})
    gcs_front.reset_counts()
    filesystem(gcs_front).rm(f"gs://{gcs_bucket}/run", recursive=True)
    assert gcs_emulator.names(gcs_bucket) == ["keep"]
    assert (gcs_front.counts["batch"], gcs_front.counts["delete"]) == (3, 250)
    assert gcs_front.counts["metadata"] <= 2, "generations come from the listing, not one GET per object"


def test_inner_503s_are_retried_alone_until_every_object_is_deleted(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"d/{i:02d}": b"x" for i in range(30)})
    faults = [Fault("http_503", match="delete", times=7), Fault("http_429", match="delete", times=2)]
    with GCSFront(gcs_emulator.endpoint, faults=faults) as front:
        fs = filesystem(front)
        fs.rm(f"gs://{gcs_bucket}/d", recursive=True)
        assert gcs_emulator.names(gcs_bucket) == []
        assert (front.faults_injected["http_503"], front.faults_injected["http_429"]) == (7, 2)
        assert front.counts["delete"] == 39, "only the calls answered 503 or 429 are sent again"
        assert front.counts["batch"] >= 2
        assert fs.stats.retries >= 1
        assert fs.stats.throttled == 2, "an inner 429 slows the process down as a throttled request does"


def test_a_batch_refused_as_a_whole_is_sent_again(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"w/{i}": b"x" for i in range(5)})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match="batch", times=2)]) as front:
        filesystem(front).rm(f"gs://{gcs_bucket}/w", recursive=True)
        assert (front.counts["batch"], front.counts["delete"]) == (3, 5)
    assert gcs_emulator.names(gcs_bucket) == []


def test_a_batch_whose_answer_was_cut_is_sent_again_and_its_calls_count_as_done(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {f"t/{i}": b"x" for i in range(5)})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("truncate", match="batch", times=1)]) as front:
        filesystem(front).rm(f"gs://{gcs_bucket}/t", recursive=True)  # the resent calls find their objects gone
        assert (front.counts["batch"], front.counts["delete"]) == (2, 10)
        assert front.faults_injected["truncate"] == 1
    assert gcs_emulator.names(gcs_bucket) == []


def test_an_inner_412_is_reported_and_the_newer_object_kept(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"1", "b": b"2", "c": b"3"})
    with GCSFront(gcs_emulator.endpoint) as front:
        client = Client(front.client_config, FAST_RETRY)
        generations = {name: client.live_generation(gcs_bucket, name) for name in "abc"}
        gcs_emulator.upload(gcs_bucket, "b", b"newer")  # replaced after its generation was read
        asked = [(name, generations[name]) for name in "abc"] + [("gone", 7)]
        outcomes = client.run(delete_objects, gcs_bucket, asked, live=True)
        assert outcomes[0] is True and outcomes[2] is True and outcomes[3] is False
        assert isinstance(outcomes[1], PreconditionFailedError) and f"gs://{gcs_bucket}/b" in str(outcomes[1])
        assert (front.counts["batch"], front.counts["delete"]) == (1, 4)
    assert gcs_emulator.names(gcs_bucket) == ["b"] and gcs_emulator.read(gcs_bucket, "b") == b"newer"


def test_rm_deletes_an_object_replaced_after_the_listing_as_it_did(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"r/{i}": b"x" for i in range(4)})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_412", match="delete", times=1)]) as front:
        filesystem(front).rm(f"gs://{gcs_bucket}/r", recursive=True)
        assert front.counts["batch"] == 1 and front.counts["delete"] == 5
    assert gcs_emulator.names(gcs_bucket) == []


def test_rm_of_a_list_batches_and_a_missing_path_raises_as_before(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"l/1": b"1", "l/2": b"2", "l/3": b"3"})
    with GCSFront(gcs_emulator.endpoint) as front:
        fs = filesystem(front)
        fs.rm([f"gs://{gcs_bucket}/l/1", f"gs://{gcs_bucket}/l/2"])
        assert (front.counts["batch"], front.counts["delete"]) == (1, 2)
        with pytest.raises(FileNotFoundError, match="no such object"):
            fs.rm([f"gs://{gcs_bucket}/l/3", f"gs://{gcs_bucket}/l/missing"])
    assert gcs_emulator.names(gcs_bucket) == []


def test_clean_of_150_temporaries_sends_2_batches(
    gcs_emulator: Emulator, gcs_front: GCSFront, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef"
    gcs_emulator.seed(gcs_bucket, {f"{job}/{i:09d}": b"t" for i in range(150)} | {"data/keep": b"k"})
    time.sleep(1.1)
    gcs_front.reset_counts()
    assert main(["--endpoint", gcs_front.endpoint, "clean", f"gs://{gcs_bucket}", "--older-than", "1s"]) == 0
    assert "deleted 150 temporary object(s) older than 1s" in capsys.readouterr().out
    assert (gcs_front.counts["batch"], gcs_front.counts["delete"]) == (2, 150)
    assert gcs_emulator.names(gcs_bucket) == ["data/keep"]


def batch_body(calls: list[str], boundary: str = "b0undary") -> bytes:
    parts = [
        f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <{i}>\r\n\r\n{call} HTTP/1.1\r\n\r\n"
        for i, call in enumerate(calls, 1)
    ]
    return ("".join(parts) + f"--{boundary}--\r\n").encode()


def test_the_front_serves_batches_as_gcs_documents_them(gcs_emulator: Emulator, gcs_front: GCSFront) -> None:
    gcs_emulator.seed("batch-front", {"x": b"1"})
    headers = {"Content-Type": "multipart/mixed; boundary=b0undary"}
    calls = ["DELETE /storage/v1/b/batch-front/o/x", "DELETE /storage/v1/b/batch-front/o/x"]
    answer = requests.post(f"{gcs_front.endpoint}/batch/storage/v1", data=batch_body(calls), headers=headers)
    assert answer.status_code == 200
    parsed = parse_batch_answer(answer.headers["Content-Type"], answer.content)
    assert [(a.content_id, a.status) for a in parsed] == [("<response-1>", 204), ("<response-2>", 404)]
    assert b"No such object: batch-front/x" in parsed[1].body
    assert (gcs_front.counts["batch"], gcs_front.counts["delete"]) == (1, 2)

    too_many = [f"DELETE /storage/v1/b/batch-front/o/{i}" for i in range(101)]
    refused = requests.post(f"{gcs_front.endpoint}/batch/storage/v1", data=batch_body(too_many), headers=headers)
    assert refused.status_code == 400 and "100" in refused.json()["error"]["message"]
    assert gcs_front.counts["delete"] == 2, "a refused batch carries out none of its calls"

    plain = requests.post(f"{gcs_front.endpoint}/batch/storage/v1", data=b"x", headers={"Content-Type": "text/plain"})
    assert plain.status_code == 400


def test_the_parser_reads_gcs_documented_answer_format() -> None:
    """An answer as GCS's batch page shows one: the boundary unquoted with ``=`` in it, CRLF lines (or LF
    alone, as GCS has been seen to answer), each part's Content-ID ``response-`` and the request's, an
    inner status line and headers, bodies or none."""
    boundary = "batch_pK7JBAk73-E=_AA5eFwv4m2Q="
    body = (
        f"--{boundary}\r\n"
        "Content-Type: application/http\r\n"
        "Content-ID: <response-b29c5de2-0db4-490b-b421-6a51b598bd22+1>\r\n"
        "\r\n"
        "HTTP/1.1 204 No Content\r\n"
        "Content-Length: 0\r\n"
        "\r\n"
        "\r\n"
        f"--{boundary}\r\n"
        "Content-Type: application/http\r\n"
        "Content-ID: <response-b29c5de2-0db4-490b-b421-6a51b598bd22+2>\r\n"
        "\r\n"
        "HTTP/1.1 412 Precondition Failed\r\n"
        "Content-Type: application/json; charset=UTF-8\r\n"
        "\r\n"
        '{"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold."}}\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    parsed = parse_batch_answer(f"multipart/mixed; boundary={boundary}", body)
    assert [(a.content_id, a.status) for a in parsed] == [
        ("<response-b29c5de2-0db4-490b-b421-6a51b598bd22+1>", 204),
        ("<response-b29c5de2-0db4-490b-b421-6a51b598bd22+2>", 412),
    ]
    assert parsed[0].body == b"" and parsed[1].body.startswith(b'{"error"')
    assert parse_batch_answer(f'multipart/mixed; boundary="{boundary}"', body) == parsed
    assert parse_batch_answer(f"multipart/mixed; boundary={boundary}", body.replace(b"\r\n", b"\n")) == parsed
    assert isinstance(parsed[0], BatchAnswer)
    with pytest.raises(ValueError, match="boundary"):
        parse_batch_answer("application/json", body)


def test_an_endpoint_that_does_not_carry_batched_calls_out_gets_them_one_by_one(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    """fake-gcs-server answers each batched call with a query string 400 "unable to process request", in
    plain text where GCS always sends its JSON error: those calls go again alone, nothing is lost."""
    gcs_emulator.seed(gcs_bucket, {f"e/{i}": b"x" for i in range(3)})
    client = Client(gcs_emulator.client_config, FAST_RETRY)
    versions = [(f"e/{i}", client.live_generation(gcs_bucket, f"e/{i}")) for i in range(3)]
    assert client.run(delete_objects, gcs_bucket, [*versions, ("e/none", 5)], live=False) == [True, True, True, False]
    assert gcs_emulator.names(gcs_bucket) == []


def test_calls_that_keep_failing_end_with_their_error_and_a_refusal_is_typed(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {"f/a": b"a", "f/b": b"b"})
    faults = [Fault("http_503", match=r"DELETE .*f%2Fa"), Fault("http_403", match=r"DELETE .*f%2Fb", times=1)]
    with GCSFront(gcs_emulator.endpoint, faults=faults) as front:
        retry = RetryConfig(initial_delay=0.01, max_delay=0.05, max_attempts=3, deadline=1)
        client = Client(front.client_config, retry)
        versions = [(name, client.live_generation(gcs_bucket, name)) for name in ("f/a", "f/b")]
        outcomes = client.run(delete_objects, gcs_bucket, versions, live=False)
        assert isinstance(outcomes[0], TransientError) and outcomes[0].status == 503
        assert isinstance(outcomes[1], AccessDeniedError) and "gs://" in str(outcomes[1])
        # a 503 asks to try again: sent until the deadline, past max_attempts; the 403 once
        batches = front.counts["batch"]
        assert batches > retry.max_attempts and front.counts["delete"] == batches + 1
    assert gcs_emulator.names(gcs_bucket) == ["f/a", "f/b"]


def test_clean_says_in_one_line_what_gcs_refused(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/000000001"
    gcs_emulator.seed(gcs_bucket, {name: b"t", f"{name}2": b"u"})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="delete", times=1)]) as front:
        assert main(["--endpoint", front.endpoint, "clean", f"gs://{gcs_bucket}", "--older-than", "0s"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"torchdata-gcs clean: GCS answered 403 (gs://{gcs_bucket}/{TEMPORARY_PREFIX}")
    assert err.count("\n") == 1 and "the caller does not have permission" in err


def test_an_endpoint_without_the_batch_endpoint_gets_the_deletes_one_by_one(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {f"n/{i}": b"x" for i in range(3)})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_404", match="batch")]) as front:
        filesystem(front).rm(f"gs://{gcs_bucket}/n", recursive=True)
        assert (front.counts["batch"], front.counts["delete"]) == (1, 3)
    assert gcs_emulator.names(gcs_bucket) == []
