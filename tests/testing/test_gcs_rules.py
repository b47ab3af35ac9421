"""The test front refuses what GCS refuses and describes objects as GCS does, over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import google_crc32c
import pytest
import requests

from torchdata_gcs._ops.checksums import crc32c_base64
from torchdata_gcs.testing import Emulator, Fault, GCSFront

MiB = 1024 * 1024


@pytest.fixture
def front(gcs_front: GCSFront) -> GCSFront:
    return gcs_front


def object_url(front: GCSFront, bucket: str, name: str) -> str:
    return f"{front.endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"


def media_upload(front: GCSFront, bucket: str, name: str, data: bytes, **params: object) -> requests.Response:
    return requests.post(
        f"{front.endpoint}/upload/storage/v1/b/{bucket}/o",
        params={"uploadType": "media", "name": name, **params},
        data=data,
        timeout=30,
    )


def resource(front: GCSFront, bucket: str, name: str) -> dict:
    answer = requests.get(object_url(front, bucket, name), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def xml_code(response: requests.Response) -> str:
    return ElementTree.fromstring(response.content).findtext("Code") or ""


def start_upload(front: GCSFront, bucket: str, name: str, headers: dict[str, str] | None = None) -> str:
    answer = requests.post(
        f"{front.endpoint}/{bucket}/{quote(name)}", params={"uploads": ""}, headers=headers, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return ElementTree.fromstring(answer.content).findtext("{*}UploadId") or ""


def put_part(front: GCSFront, bucket: str, name: str, upload_id: str, number: int, data: bytes, **headers: str):
    return requests.put(
        f"{front.endpoint}/{bucket}/{quote(name)}",
        params={"partNumber": number, "uploadId": upload_id},
        data=data,
        headers={key.replace("_", "-"): value for key, value in headers.items()},
        timeout=30,
    )


def complete(front: GCSFront, bucket: str, name: str, upload_id: str, etags: list[str]) -> requests.Response:
    parts = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1))
    return requests.post(
        f"{front.endpoint}/{bucket}/{quote(name)}",
        params={"uploadId": upload_id},
        data=f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>",
        timeout=30,
    )


def test_a_part_whose_digest_does_not_match_is_refused_and_the_earlier_one_kept(
    front: GCSFront, gcs_bucket: str
) -> None:
    data = os.urandom(1000)
    upload_id = start_upload(front, gcs_bucket, "p.bin")
    good = put_part(front, gcs_bucket, "p.bin", upload_id, 1, data, x_goog_hash=f"crc32c={crc32c_base64(data)}")
    assert good.status_code == 200
    wrong_crc = put_part(
        front, gcs_bucket, "p.bin", upload_id, 1, b"other", x_goog_hash=f"crc32c={crc32c_base64(data)}"
    )
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    wrong_md5 = put_part(front, gcs_bucket, "p.bin", upload_id, 1, b"other", Content_MD5=md5)
    wrong_hash_md5 = put_part(front, gcs_bucket, "p.bin", upload_id, 1, b"other", x_goog_hash=f"md5={md5}")
    for refused in (wrong_crc, wrong_md5, wrong_hash_md5):
        assert (refused.status_code, xml_code(refused)) == (400, "BadDigest")
    assert complete(front, gcs_bucket, "p.bin", upload_id, [good.headers["ETag"]]).status_code == 200
    assert requests.get(f"{object_url(front, gcs_bucket, 'p.bin')}?alt=media", timeout=30).content == data


def test_a_part_damaged_on_the_way_is_refused(front: GCSFront, gcs_bucket: str) -> None:
    data = os.urandom(100_000)
    upload_id = start_upload(front, gcs_bucket, "d.bin")
    front.set_faults([Fault("corrupt", match="upload", times=1)])
    damaged = put_part(front, gcs_bucket, "d.bin", upload_id, 1, data, x_goog_hash=f"crc32c={crc32c_base64(data)}")
    assert (damaged.status_code, xml_code(damaged)) == (400, "BadDigest")
    unchecked = put_part(front, gcs_bucket, "d.bin", upload_id, 1, data)  # no digest sent: nothing to check
    assert unchecked.status_code == 200 and front.faults_injected["corrupt"] == 1


def test_multipart_objects_keep_the_initiated_metadata_and_have_no_md5(front: GCSFront, gcs_bucket: str) -> None:
    headers = {"Content-Type": "application/x-checkpoint", "x-goog-meta-epoch": "7"}
    upload_id = start_upload(front, gcs_bucket, "m.bin", headers)
    first, last = os.urandom(5 * MiB), b"tail"
    etags = [
        put_part(front, gcs_bucket, "m.bin", upload_id, n, data).headers["ETag"] for n, data in ((1, first), (2, last))
    ]
    done = complete(front, gcs_bucket, "m.bin", upload_id, etags)
    assert done.status_code == 200 and "md5=" not in done.headers["x-goog-hash"]
    described = resource(front, gcs_bucket, "m.bin")
    assert (described["contentType"], described["metadata"]) == ("application/x-checkpoint", {"epoch": "7"})
    assert "md5Hash" not in described and described["componentCount"] == 2
    assert described["crc32c"] == crc32c_base64(google_crc32c.value(first + last))
    media = requests.get(f"{object_url(front, gcs_bucket, 'm.bin')}?alt=media", timeout=30)
    assert media.raw.headers.getlist("x-goog-hash") == [f"crc32c={described['crc32c']}"]


def test_composites_have_a_component_count_and_no_md5(front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"aa", "b": b"bb", "c": b"cc"})

    def compose(destination: str, sources: list[str]) -> requests.Response:
        body = {"sourceObjects": [{"name": name} for name in sources]}
        return requests.post(f"{object_url(front, gcs_bucket, destination)}/compose", json=body, timeout=30)

    first = compose("ab", ["a", "b"])
    assert first.status_code == 200 and "md5Hash" not in first.json() and first.json()["componentCount"] == 2
    assert compose("abc", ["ab", "c"]).json()["componentCount"] == 3  # a composite counts its components
    listed = requests.get(f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o", timeout=30).json()["items"]
    by_name = {item["name"]: item for item in listed}
    assert "md5Hash" not in by_name["abc"] and by_name["abc"]["componentCount"] == 3
    assert "md5Hash" in by_name["a"] and "componentCount" not in by_name["a"]
    gcs_emulator.upload(gcs_bucket, "ab", b"plain again")  # a new version is no composite
    assert "md5Hash" in resource(front, gcs_bucket, "ab")


@pytest.mark.parametrize(
    ("condition", "holds"),
    [
        ({"ifGenerationMatch": 0}, False),
        ({"ifGenerationMatch": "live"}, True),
        ({"ifGenerationMatch": 1}, False),
        ({"ifGenerationNotMatch": "live"}, False),
        ({"ifGenerationNotMatch": 1}, True),
        ({"ifGenerationNotMatch": 0}, True),
    ],
)
def test_preconditions_hold_on_deletes_media_uploads_compose_and_rewrite(
    front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str, condition: dict, holds: bool
) -> None:
    gcs_emulator.seed(gcs_bucket, {"x": b"old", "src": b"s"})

    def params() -> dict:  # "live": the generation live now (each write that goes through makes a new one)
        live = resource(front, gcs_bucket, "x")["generation"]
        return {key: (live if value == "live" else value) for key, value in condition.items()}

    answers = [
        media_upload(front, gcs_bucket, "x", b"new", **params()).status_code,
        requests.post(
            f"{object_url(front, gcs_bucket, 'x')}/compose",
            params=params(),
            json={"sourceObjects": [{"name": "src"}]},
            timeout=30,
        ).status_code,
        requests.post(
            f"{object_url(front, gcs_bucket, 'src')}/rewriteTo/b/{gcs_bucket}/o/x", params=params(), json={}, timeout=30
        ).status_code,
        requests.delete(object_url(front, gcs_bucket, "x"), params=params(), timeout=30).status_code,
    ]
    assert answers == ([200, 200, 200, 204] if holds else [412, 412, 412, 412])
    assert ("x" in gcs_emulator.names(gcs_bucket)) != holds


def test_only_promised_headers(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = os.urandom(10_000)
    gcs_emulator.seed(gcs_bucket, {"o": data})
    with GCSFront(gcs_emulator.endpoint, only_promised_headers=True) as strict:
        answer = requests.get(f"{object_url(strict, gcs_bucket, 'o')}?alt=media", timeout=30)
        ranged = requests.get(
            f"{object_url(strict, gcs_bucket, 'o')}?alt=media", headers={"Range": "bytes=0-9"}, timeout=30
        )
    assert answer.content == data and ranged.content == data[:10]
    assert not [name for name in answer.headers if name.lower().startswith("x-goog-") or name.lower() == "etag"]
    assert "Content-Length" not in answer.headers and answer.headers["Transfer-Encoding"] == "chunked"
    assert ranged.headers["Content-Range"] == f"bytes 0-9/{len(data)}"


def test_the_damaged_answer_fault_flips_one_byte(front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str) -> None:
    data = bytes(1000)
    gcs_emulator.seed(gcs_bucket, {"z": data})
    front.set_faults([Fault("corrupt", match="get", times=1)])
    damaged = requests.get(f"{object_url(front, gcs_bucket, 'z')}?alt=media", timeout=30).content
    assert len(damaged) == len(data) and sum(a != b for a, b in zip(damaged, data, strict=True)) == 1
    assert requests.get(f"{object_url(front, gcs_bucket, 'z')}?alt=media", timeout=30).content == data
    assert json.loads(json.dumps(front.faults_injected)) == {"corrupt": 1}


def test_a_conditional_upload_whose_body_is_slow_holds_up_no_other_write(front: GCSFront, gcs_bucket: str) -> None:
    # GCS writes different objects independently: one client's slow body must not stall another's write
    address = urlsplit(front.endpoint)
    first = b"a" * MiB
    slow = socket.create_connection((address.hostname, address.port), timeout=10)
    with slow:
        slow.sendall(
            f"POST /upload/storage/v1/b/{gcs_bucket}/o?uploadType=media&name=slow&ifGenerationMatch=0 HTTP/1.1\r\n"
            f"Host: {address.netloc}\r\nContent-Type: application/octet-stream\r\nContent-Length: {len(first)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + first[: MiB // 2]
        )
        other = requests.post(
            f"{front.endpoint}/upload/storage/v1/b/{gcs_bucket}/o",
            params={"uploadType": "media", "name": "other", "ifGenerationMatch": "0"},
            data=b"b" * 1000,
            timeout=5,  # a deadline: before, the second write waited on the first body, which waited on it
        )
        assert other.status_code == 200, other.text
        slow.sendall(first[MiB // 2 :])
        answer = b""
        while chunk := slow.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") or answer.startswith(b"HTTP/1.0 200"), answer[:200]
    for name, data in (("slow", first), ("other", b"b" * 1000)):
        assert requests.get(object_url(front, gcs_bucket, name), params={"alt": "media"}, timeout=30).content == data
