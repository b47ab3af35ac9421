"""``torchdata-gcs doctor`` against the emulator and the test front: what each check says when GCS allows it, refuses
it or lacks it, that nothing outside the scratch folder is touched, and that nothing is left behind."""

from __future__ import annotations

import http.client
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import pytest

from torchdata_gcs._ops.uploads import UPLOAD_MARKERS
from torchdata_gcs.cli import main
from torchdata_gcs.cli.bucket_settings import bucket_settings
from torchdata_gcs.cli.doctor import SCRATCH_MARK
from torchdata_gcs.cli.doctor_report import CHECKS
from torchdata_gcs.testing import Emulator, Fault, GCSFront
from torchdata_gcs.testing._process import free_port

if TYPE_CHECKING:
    from typing_extensions import Self

_COLUMN = max(len(name) for name in CHECKS) + 2  # where the result column starts


def doctor(endpoint: str, url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["--endpoint", endpoint, "doctor", url])
    out, err = capsys.readouterr()
    return code, out, err


def results(out: str) -> dict[str, str]:
    """Each table row's result, by check."""
    rows = {}
    for line in out.splitlines():
        name = line[:_COLUMN].rstrip()
        if name in CHECKS and line[_COLUMN - 2 : _COLUMN] == "  ":
            rows[name] = line[_COLUMN:].split()[0]
    return rows


def not_ok(out: str) -> dict[str, str]:
    return {name: result for name, result in results(out).items() if result != "OK"}


def check_names_all_rows(out: str) -> None:
    assert list(results(out)) == list(CHECKS), out


# -- everything works ------------------------------------------------------------------------------


def test_every_check_passes_and_only_the_scratch_folder_is_touched(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gcs_emulator.seed(gcs_bucket, {"data/a.bin": b"a", "data/b/c.bin": b"c", "other.bin": b"o"})
    before = gcs_emulator.names(gcs_bucket)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        code, out, err = doctor(front.endpoint, f"gs://{gcs_bucket}/data/", capsys)
        assert front.open_uploads == []
        recorded, counts = front.recorded, front.counts

    assert (code, err) == (0, ""), out
    check_names_all_rows(out)
    assert not_ok(out) == {}
    assert gcs_emulator.names(gcs_bucket) == before
    lines = out.splitlines()
    assert lines[:2] == [f"endpoint  {front.endpoint}", "identity  anonymous"]
    assert re.fullmatch(
        rf"scratch   gs://{gcs_bucket}/data/{re.escape(SCRATCH_MARK)}[0-9a-f]{{8}}/ \(deleted at the end\)", lines[2]
    )
    for setting in ("location", "requester pays", "soft delete", "retention policy", "object versioning"):
        assert any(line.startswith(f"  {setting} ") for line in lines), setting
    assert "  object versioning       off" in out and "  requester pays          off" in out
    assert re.search(r"^latency +OK +median \d+ ms of 5 metadata requests", out, re.MULTILINE)
    assert re.search(r"^throughput +OK +upload [\d,.]+ MB/s, download [\d,.]+ MB/s \(4\.0 MiB", out, re.MULTILINE)
    assert "cleanup: deleted 5 scratch object(s), nothing left behind" in out
    assert lines[-1] == f"verdict: OK, everything torchdata-gcs relies on works in gs://{gcs_bucket}/data/"
    assert counts["compose"] == 1 and counts["list"] >= 3  # the prefix, the uploads, the scratch folder (twice)

    # Every write, compose and delete named an object in the scratch folder (JSON uploads name it in their
    # body), but the multipart upload's marker, which is created and deleted with it.
    writes = [request for request in recorded if request.method in ("POST", "PUT", "DELETE")]
    assert len(writes) >= 12
    outside = [
        r.target for r in writes if SCRATCH_MARK not in unquote(r.target) and SCRATCH_MARK.encode() not in r.body
    ]
    assert len(outside) == 1 and UPLOAD_MARKERS in unquote(outside[0])  # the marker's delete (its body names the URL)
    assert not [name for name in gcs_emulator.names(gcs_bucket) if name.startswith(UPLOAD_MARKERS)]


def test_bucket_settings_without_storage_buckets_get_are_unknown_not_a_failure(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with GCSFront(gcs_emulator.endpoint, object_only=True) as front:  # Storage Object Admin, say
        code, out, _ = doctor(front.endpoint, f"gs://{gcs_bucket}", capsys)
    assert code == 0, out
    assert "  soft delete             unknown (no storage.buckets.get)" in out
    assert out.count("unknown (no storage.buckets.get)") == 8
    # the storage layout, which storage.objects.list suffices for, tells the rest
    assert "  location                US-CENTRAL1" in out and "  hierarchical namespace  off" in out
    assert not_ok(out) == {} and gcs_emulator.names(gcs_bucket) == []


# -- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, expected, phrase",
    [
        (
            Fault("http_403", match="compose"),
            {"compose": "REFUSED"},
            "compose REFUSED: compose_shards_by_gcs loads objects one by one instead",
        ),
        (
            Fault("http_403", match="list"),  # the listing of objects and that of multipart uploads
            {"list": "REFUSED", "upload listing": "REFUSED"},
            (
                "list REFUSED: list_files_by_gcs, `torchdata-gcs ls`, `bench` and `clean` cannot list here "
                "(needs storage.objects.list)"
            ),
        ),
        (
            Fault("http_412", match="upload", times=1),  # the first write, of a name that does not exist
            {"write": "FAILED", "precondition": "SKIPPED", "read": "SKIPPED"},
            "write FAILED: a create of a new name was refused with 412 although its precondition",
        ),
    ],
    ids=["compose-403", "list-403", "write-412"],
)
def test_a_refusal_is_named_and_nothing_is_left(
    fault: Fault,
    expected: dict[str, str],
    phrase: str,
    gcs_emulator: Emulator,
    gcs_bucket: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gcs_emulator.seed(gcs_bucket, {"data/a.bin": b"a"})
    with GCSFront(gcs_emulator.endpoint, faults=[fault]) as front:
        code, out, err = doctor(front.endpoint, f"gs://{gcs_bucket}/data/", capsys)
        assert front.faults_injected[fault.kind] >= 1
        assert front.open_uploads == []
    assert (code, err) == (1, ""), out
    check_names_all_rows(out)
    assert not_ok(out) == expected
    assert f"problem: {phrase}" in out
    refused = ", ".join(f"{name} {result}" for name, result in expected.items() if result != "SKIPPED")
    assert out.splitlines()[-1] == f"verdict: {refused.count(',') + 1} problem(s) in gs://{gcs_bucket}/data/: {refused}"
    assert gcs_emulator.names(gcs_bucket) == ["data/a.bin"]


def test_without_the_xml_api_multipart_is_missing(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = doctor(gcs_emulator.endpoint, f"gs://{gcs_bucket}/ckpt/", capsys)  # the bare emulator
    assert code == 1
    assert not_ok(out) == {"XML multipart upload": "MISSING", "upload listing": "MISSING"}
    assert re.search(
        r"^XML multipart upload  MISSING  the endpoint serves no XML API multipart uploads \(", out, re.MULTILINE
    )
    assert 'problem: XML multipart upload MISSING: checkpoint saves with the default strategy="multipart"' in out
    assert 'missing (an emulator), they write as strategy="compose" does' in out
    assert gcs_emulator.names(gcs_bucket) == []


def test_delete_refused_names_what_was_left_behind(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="delete")]) as front:
        code, out, _ = doctor(front.endpoint, f"gs://{gcs_bucket}/", capsys)
        assert front.open_uploads == []
    assert code == 1
    assert not_ok(out) == {"delete": "REFUSED"}
    left = [name for name in gcs_emulator.names(gcs_bucket) if not name.startswith(UPLOAD_MARKERS)]
    assert len(left) == 6 and all(name.startswith(SCRATCH_MARK) for name in left)  # and the upload's marker, for clean
    for name in left:
        assert f"could not remove gs://{gcs_bucket}/{name} (GCS answered 403" in out
    assert "cleanup: deleted 0 scratch object(s); 6 item(s) left behind" in out
    assert "problem: delete REFUSED: " in out and "(needs storage.objects.delete)" in out
    assert "problem: cleanup: 6 scratch item(s) could not be removed" in out
    assert out.splitlines()[-1] == f"verdict: 2 problem(s) in gs://{gcs_bucket}/: delete REFUSED, cleanup incomplete"


class _PreconditionBlindUpstream:
    """An upstream for the front that drops ``ifGenerationMatch`` from JSON uploads: a server that ignores it."""

    def __init__(self, upstream: str) -> None:
        address = urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes | None:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    pieces = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        pieces.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    return b"".join(pieces)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _forward(self) -> None:
                body = self._body()
                path = self.path
                if path.startswith("/upload/"):
                    path = re.sub(r"([?&])ifGenerationMatch=\d+&?", r"\1", path).rstrip("&?")
                skip = {"content-length", "transfer-encoding", "connection"}
                headers = {key: value for key, value in self.headers.items() if key.lower() not in skip}
                connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
                try:
                    connection.request(self.command, path, body=body, headers=headers)
                    answer = connection.getresponse()
                    content = answer.read()
                finally:
                    connection.close()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in skip:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_a_second_create_that_is_not_refused_is_a_failed_precondition(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with _PreconditionBlindUpstream(gcs_emulator.endpoint) as blind, GCSFront(blind.endpoint) as front:
        code, out, _ = doctor(front.endpoint, f"gs://{gcs_bucket}/data/", capsys)
        assert front.open_uploads == []
    assert code == 1
    assert not_ok(out) == {"precondition": "FAILED"}
    assert (
        "precondition          FAILED   a second create of the same name with ifGenerationMatch=0 replaced the object"
        in out
    )
    assert (
        "problem: precondition FAILED: the shared listing lock (list_files_by_gcs(manifest=...)) and overwrite=False"
        in out
    )
    assert re.search(r"^read +OK", out, re.MULTILINE)  # reads what the second create wrote
    assert gcs_emulator.names(gcs_bucket) == []


# -- interrupted -----------------------------------------------------------------------------------


def test_ctrl_c_in_the_middle_cleans_up_and_exits_130(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gcs_emulator.seed(gcs_bucket, {"data/a.bin": b"a"})
    stall = Fault("stall", match="partNumber", times=1, stall_seconds=30)  # the multipart upload's first part

    with GCSFront(gcs_emulator.endpoint, faults=[stall]) as front:

        def interrupt_once_stalled() -> None:
            deadline = time.monotonic() + 30
            while not front.faults_injected["stall"] and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_stalled, daemon=True).start()
        started = time.monotonic()
        code, out, err = doctor(front.endpoint, f"gs://{gcs_bucket}/data/", capsys)
        seconds = time.monotonic() - started
        assert front.open_uploads == []  # the started upload was aborted

    assert code == 130 and err == "torchdata-gcs doctor: interrupted\n", (out, err)
    assert seconds < 15  # the stalled part was not waited for
    assert "interrupted after 5 of 10 checks: cleaning up" in out
    assert "cleanup: deleted 4 scratch object(s), nothing left behind" in out
    assert out.splitlines()[-1] == "verdict: interrupted after 5 of 10 checks"
    assert gcs_emulator.names(gcs_bucket) == ["data/a.bin"]


# -- usage and unusable endpoints ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["gs://"], "invalid bucket name ''"),
        (["gs:///data/"], "invalid bucket name ''"),
        (["s3://bucket/data/"], "not a GCS URL"),
        ([], "the following arguments are required: URL"),
    ],
)
def test_bad_usage_exits_2_with_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("torchdata-gcs doctor: error: ") and message in errors[0]


def test_a_missing_bucket_or_a_dead_endpoint_is_one_line_in_seconds(
    gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = doctor(gcs_emulator.endpoint, "gs://doctor-no-such-bucket/data/", capsys)
    assert code == 1 and err.startswith("torchdata-gcs doctor: bucket 'doctor-no-such-bucket' does not exist")
    assert err.count("\n") == 1
    assert "check " not in out  # nothing was tried, nothing written

    started = time.monotonic()
    code, _, err = doctor(f"http://127.0.0.1:{free_port()}", "gs://doctor-bucket/data/", capsys)
    assert code == 1 and err.startswith("torchdata-gcs doctor: cannot reach http://127.0.0.1:") and "refused" in err
    assert err.count("\n") == 1 and time.monotonic() - started < 10


def test_help_describes_doctor(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    phrases = [
        "--user-project PROJECT",
        "storage.buckets.get",
        "412",
        "REFUSED (403)",
        "MISSING",
        SCRATCH_MARK,
        "Ctrl-C",
    ]
    assert [phrase for phrase in phrases if phrase not in text] == []


def test_bucket_settings_say_what_they_mean_for_temporary_objects_and_checkpoints() -> None:
    # A bucket resource as GCS sends it (int64 values as strings), every setting that matters turned on.
    resource = {
        "location": "EUROPE-WEST4",
        "locationType": "region",
        "billing": {"requesterPays": True},
        "softDeletePolicy": {"retentionDurationSeconds": "604800", "effectiveTime": "2024-03-01T00:00:00Z"},
        "retentionPolicy": {"retentionPeriod": "86400", "effectiveTime": "2024-03-01T00:00:00Z", "isLocked": True},
        "versioning": {"enabled": True},
        "hierarchicalNamespace": {"enabled": True},
    }
    facts = {fact.name: (fact.value, fact.meaning) for fact in bucket_settings(resource, None)}
    assert facts["location"][0] == "EUROPE-WEST4 (region)"
    assert facts["requester pays"][0] == "on" and "pass --user-project here" in facts["requester pays"][1]
    assert facts["soft delete"][0] == "7 days" and "stays billed 7 days after deletion" in facts["soft delete"][1]
    assert facts["retention policy"][0] == "1 day, locked"
    assert "leave billed temporary objects" in facts["retention policy"][1]
    assert facts["object versioning"][0] == "on" and "noncurrent version" in facts["object versioning"][1]
    assert facts["hierarchical namespace"][0] == "on" and "stays behind empty" in facts["hierarchical namespace"][1]
    assert (
        "billed to my-project" in {f.name: f.meaning for f in bucket_settings(resource, "my-project")}["requester pays"]
    )

    assert {fact.name: fact.value for fact in bucket_settings({}, None)} == {
        "location": "?",
        "requester pays": "off",
        "soft delete": "not reported",
        "retention policy": "none",
        "object versioning": "off",
        "hierarchical namespace": "off",
        "default storage class": "not reported",
        "autoclass": "off",
        "event-based hold": "off",
        "lifecycle": "none",
    }
