"""The test front's XML API multipart upload, spoken over HTTP as a GCS client would."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote
from xml.etree import ElementTree

import google_crc32c
import pytest
import requests

from torchdata_gcs._ops.checksums import crc32c_base64, reported_crc32c
from torchdata_gcs.testing import Emulator, Fault, GCSFront

MiB = 1024 * 1024
BUCKET = "multipart-front"


@pytest.fixture
def front(gcs_emulator: Emulator, gcs_front: GCSFront) -> GCSFront:
    gcs_emulator.create_bucket(BUCKET)
    return gcs_front


def url(front: GCSFront, name: str) -> str:
    return f"{front.endpoint}/{BUCKET}/{quote(name)}"


def text(response: requests.Response, tag: str) -> str:
    return ElementTree.fromstring(response.content).findtext(f"{{*}}{tag}") or ""


def initiate(front: GCSFront, name: str) -> str:
    response = requests.post(url(front, name), params={"uploads": ""}, timeout=30)
    assert response.status_code == 200, response.text
    assert text(response, "Key") == name and text(response, "Bucket") == BUCKET
    return text(response, "UploadId")


def put_part(front: GCSFront, name: str, upload_id: str, number: int, data: bytes) -> requests.Response:
    params = {"partNumber": str(number), "uploadId": upload_id}
    return requests.put(url(front, name), params=params, data=data, timeout=60)


def complete(front: GCSFront, name: str, upload_id: str, parts: list[tuple[int, str]]) -> requests.Response:
    listed = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>" for n, etag in parts)
    document = f"<CompleteMultipartUpload>{listed}</CompleteMultipartUpload>"
    return requests.post(url(front, name), params={"uploadId": upload_id}, data=document, timeout=60)


def error_code(response: requests.Response) -> str:
    return text(response, "Code")


def test_round_trip_in_any_part_order(front: GCSFront, gcs_emulator: Emulator) -> None:
    name = "ckpt/model #1.pt"
    first, second = os.urandom(5 * MiB), os.urandom(123_457)
    upload_id = initiate(front, name)
    assert front.open_uploads == [(BUCKET, name)]
    last = put_part(front, name, upload_id, 2, second)  # parts may arrive in any order
    head = put_part(front, name, upload_id, 1, first)
    assert head.status_code == last.status_code == 200
    assert re.fullmatch(r'"[0-9a-f]{32}"', head.headers["ETag"])
    assert reported_crc32c(head.headers) == crc32c_base64(google_crc32c.value(first))
    assert head.raw.headers.getlist("x-goog-hash")[0].startswith("md5=")  # separate lines, md5 first

    listing = requests.get(url(front, name), params={"uploadId": upload_id}, timeout=30)
    parts = ElementTree.fromstring(listing.content).findall("{*}Part")
    assert [(p.findtext("{*}PartNumber"), p.findtext("{*}Size")) for p in parts] == [
        ("1", str(5 * MiB)),
        ("2", "123457"),
    ]
    assert name not in gcs_emulator.names(BUCKET)  # nothing is visible before completion

    done = complete(front, name, upload_id, [(1, head.headers["ETag"]), (2, last.headers["ETag"])])
    assert done.status_code == 200, done.text
    assert text(done, "Key") == name
    assert reported_crc32c(done.headers) == crc32c_base64(google_crc32c.value(first + second))
    assert int(done.headers["x-goog-generation"]) > 0
    assert gcs_emulator.read(BUCKET, name) == first + second
    assert front.open_uploads == []
    assert front.counts["upload"] == 4  # initiate, two parts, complete


def test_errors_as_gcs_answers_them(front: GCSFront, gcs_emulator: Emulator) -> None:
    name = "bad.bin"
    upload_id = initiate(front, name)
    small = put_part(front, name, upload_id, 1, b"x" * 1000)
    tail = put_part(front, name, upload_id, 2, b"tail")
    small_etag, tail_etag = small.headers["ETag"], tail.headers["ETag"]

    unknown = complete(front, name, "no-such-upload", [(1, small_etag)])
    assert (unknown.status_code, error_code(unknown)) == (404, "NoSuchUpload")
    assert put_part(front, name, "no-such-upload", 1, b"x").status_code == 404
    assert error_code(put_part(front, name, upload_id, 0, b"x")) == "InvalidArgument"
    assert error_code(put_part(front, name, upload_id, 10_001, b"x")) == "InvalidArgument"

    disorder = complete(front, name, upload_id, [(2, tail_etag), (1, small_etag)])
    assert (disorder.status_code, error_code(disorder)) == (400, "InvalidPartOrder")
    wrong = complete(front, name, upload_id, [(1, '"0123456789abcdef0123456789abcdef"'), (2, tail_etag)])
    assert (wrong.status_code, error_code(wrong)) == (400, "InvalidPart")
    missing = complete(front, name, upload_id, [(1, small_etag), (3, tail_etag)])
    assert error_code(missing) == "InvalidPart"
    too_small = complete(front, name, upload_id, [(1, small_etag), (2, tail_etag)])
    assert (too_small.status_code, error_code(too_small)) == (400, "EntityTooSmall")
    malformed = requests.post(url(front, name), params={"uploadId": upload_id}, data=b"<Complete", timeout=30)
    assert (malformed.status_code, error_code(malformed)) == (400, "MalformedXML")

    assert complete(front, name, upload_id, [(2, tail_etag)]).status_code == 200  # one part: may be small
    assert gcs_emulator.read(BUCKET, name) == b"tail"


def test_abort_publishes_nothing(front: GCSFront, gcs_emulator: Emulator) -> None:
    upload_id = initiate(front, "aborted.bin")
    put_part(front, "aborted.bin", upload_id, 1, b"data")
    assert requests.delete(url(front, "aborted.bin"), params={"uploadId": upload_id}, timeout=30).status_code == 204
    assert front.open_uploads == []
    assert requests.delete(url(front, "aborted.bin"), params={"uploadId": upload_id}, timeout=30).status_code == 404
    assert error_code(complete(front, "aborted.bin", upload_id, [(1, '"x"')])) == "NoSuchUpload"
    assert "aborted.bin" not in gcs_emulator.names(BUCKET)


def test_faults_apply_to_parts(gcs_emulator: Emulator) -> None:
    gcs_emulator.create_bucket(BUCKET)
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_503", match=r"PUT .*partNumber", times=1)]) as front:
        upload_id = initiate(front, "flaky.bin")
        assert put_part(front, "flaky.bin", upload_id, 1, b"a").status_code == 503
        retried = put_part(front, "flaky.bin", upload_id, 1, b"a")
        assert retried.status_code == 200
        assert complete(front, "flaky.bin", upload_id, [(1, retried.headers["ETag"])]).status_code == 200
    assert gcs_emulator.read(BUCKET, "flaky.bin") == b"a"


def test_front_lists_multipart_uploads_as_gcs_pages_them(gcs_emulator: Emulator, gcs_front: GCSFront) -> None:
    """What clean relies on: pages in (name, upload ID) order, continued by both markers, none twice."""
    gcs_emulator.create_bucket("cli-upload-pages")
    base = f"{gcs_front.endpoint}/cli-upload-pages"
    for name in ("a.pt", "b.pt", "b.pt", "c/d.pt", "e.pt"):
        assert requests.post(f"{base}/{name}", params={"uploads": ""}, timeout=30).status_code == 200
    pages, params = [], {"uploads": "", "max-uploads": "2"}
    while True:
        root = ElementTree.fromstring(requests.get(base, params=params, timeout=30).content)
        assert root.tag == "{http://s3.amazonaws.com/doc/2006-03-01/}ListMultipartUploadsResult"
        uploads = root.findall("{*}Upload")
        pages.append([(upload.findtext("{*}Key", ""), upload.findtext("{*}UploadId", "")) for upload in uploads])
        for upload in uploads:
            assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", upload.findtext("{*}Initiated") or "")
        if root.findtext("{*}IsTruncated") != "true":
            break
        assert (root.findtext("{*}NextKeyMarker"), root.findtext("{*}NextUploadIdMarker")) == pages[-1][-1]
        params = {**params, "key-marker": pages[-1][-1][0], "upload-id-marker": pages[-1][-1][1]}
    listed = [upload for page in pages for upload in page]
    assert [len(page) for page in pages] == [2, 2, 1] and listed == sorted(set(listed))  # b.pt's two are split
    assert [name for name, _ in listed] == ["a.pt", "b.pt", "b.pt", "c/d.pt", "e.pt"]
    prefixed = ElementTree.fromstring(requests.get(base, params={"uploads": "", "prefix": "c/"}, timeout=30).content)
    assert [upload.findtext("{*}Key") for upload in prefixed.findall("{*}Upload")] == ["c/d.pt"]
    missing = requests.get(f"{gcs_front.endpoint}/cli-no-such-bucket", params={"uploads": ""}, timeout=30)
    assert missing.status_code == 404 and b"<Code>NoSuchBucket</Code>" in missing.content


def test_a_slow_completion_makes_the_object_when_it_answers_or_at_once_when_its_answer_is_lost(
    front: GCSFront, gcs_emulator: Emulator
) -> None:
    """GCS may take minutes to complete an upload: ``completion_delay`` models it, in two ways."""
    front.completion_delay = 1.0
    upload_id = initiate(front, "late.bin")
    etag = put_part(front, "late.bin", upload_id, 1, b"late").headers["ETag"]
    seen: list[list[str]] = []
    # the object is looked for while the completion runs: it appears only with the answer
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(complete, front, "late.bin", upload_id, [(1, etag)])
        time.sleep(0.5)
        seen.append(gcs_emulator.names(BUCKET))
        assert answer.result().status_code == 200
    assert "late.bin" not in seen[0] and gcs_emulator.read(BUCKET, "late.bin") == b"late"

    front.completion_answer = "lost"
    upload_id = initiate(front, "lost.bin")
    etag = put_part(front, "lost.bin", upload_id, 1, b"lost").headers["ETag"]
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        complete(front, "lost.bin", upload_id, [(1, etag)])
    assert time.monotonic() - started >= 1.0  # held, then closed without an answer
    assert gcs_emulator.read(BUCKET, "lost.bin") == b"lost" and front.open_uploads == []
    assert error_code(complete(front, "lost.bin", upload_id, [(1, etag)])) == "NoSuchUpload"


def test_completion_settings_are_checked(front: GCSFront) -> None:
    with pytest.raises(ValueError, match="completion_delay"):
        front.completion_delay = -1
    with pytest.raises(ValueError, match="completion_answer"):
        front.completion_answer = "never"  # type: ignore[assignment]


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the guard's peak memory from /proc")
def test_completion_streams_through_the_emulator_guard() -> None:
    """A completion streams the object into a filesystem-backed emulator: its name guard passes the bytes
    through unread instead of holding the whole object (as it must a multipart body, to find its parts),
    so a completion costs the rig no more than the object's bytes moving once, as uploads do."""
    parts = [os.urandom(8 * MiB) for _ in range(6)]
    with Emulator(backend="filesystem") as emulator, GCSFront(emulator.endpoint) as front:
        emulator.create_bucket(BUCKET)
        upload_id = initiate(front, "big.bin")
        etags = [put_part(front, "big.bin", upload_id, n, data).headers["ETag"] for n, data in enumerate(parts, 1)]
        assert emulator._server is not None
        guard = emulator._server.pid
        before = _peak_rss_mib(guard)
        answer = complete(front, "big.bin", upload_id, list(enumerate(etags, 1)))
        assert answer.status_code == 200, answer.text
        growth = _peak_rss_mib(guard) - before
        assert emulator.read(BUCKET, "big.bin") == b"".join(parts)
    assert growth < 16, f"the guard grew {growth:.0f} MiB for a 48 MiB object"


def test_completion_time_is_recorded_per_object(front: GCSFront) -> None:
    front.reset_counts()
    upload_id = initiate(front, "timed/a")
    etag = put_part(front, "timed/a", upload_id, 1, os.urandom(MiB)).headers["ETag"]
    refused = complete(front, "timed/a", upload_id, [(1, '"0123"')])  # a refused completion makes nothing
    assert error_code(refused) == "InvalidPart" and front.multipart_completions == []
    started = time.perf_counter()
    assert complete(front, "timed/a", upload_id, [(1, etag)]).status_code == 200
    wall = time.perf_counter() - started
    other = initiate(front, "timed/b")
    etag = put_part(front, "timed/b", other, 1, b"x").headers["ETag"]
    assert complete(front, "timed/b", other, [(1, etag)]).status_code == 200
    done = front.multipart_completions
    assert [(bucket, name) for bucket, name, _ in done] == [(BUCKET, "timed/a"), (BUCKET, "timed/b")]
    assert 0 < done[0][2] <= wall  # the object's write, within the request's time
    front.reset_counts()
    assert front.multipart_completions == []
