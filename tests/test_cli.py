"""The ``torchdata-gcs`` command against the emulator: what it deletes, what it says, how it exits."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from torchdata_gcs._uri import TEMPORARY_PREFIX
from torchdata_gcs.cli import main
from torchdata_gcs.testing import Emulator, Fault, GCSFront


def test_clean_deletes_only_old_temporary_objects(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    old_job = f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/000000001"
    new_job = f"{TEMPORARY_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-host-2-abcdef/000000001"
    gcs_emulator.seed("cli-clean", {old_job: b"old", new_job: b"new", "data/keep.bin": b"keep"})
    endpoint = ["--endpoint", gcs_emulator.endpoint]

    # Both were created just now: the 2020 in a name is a job's start, not the object's age.
    assert main([*endpoint, "clean", "gs://cli-clean", "--older-than", "1d"]) == 0
    assert "deleted 0 temporary object(s) older than 1d" in capsys.readouterr().out

    time.sleep(1.5)
    assert main([*endpoint, "clean", "gs://cli-clean", "--older-than", "1s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would delete gs://cli-clean/{old_job}" in out and "would delete 2 temporary" in out
    assert len(gcs_emulator.names("cli-clean")) == 3

    assert main([*endpoint, "clean", "gs://cli-clean/", "--older-than", "1s"]) == 0
    assert "deleted 2 temporary object(s)" in capsys.readouterr().out
    assert gcs_emulator.names("cli-clean") == ["data/keep.bin"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["clean", "gs://cli-bucket/some/path"], "expected a bucket"),
        (["clean", "s3://cli-bucket"], "not a GCS URL"),
        (["clean", "gs://cli-bucket", "--older-than", "5x"], "expected an age"),
        ([], "COMMAND"),
    ],
)
def test_bad_usage_exits_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_bucket_and_refusal_are_one_line(gcs_emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--endpoint", gcs_emulator.endpoint, "clean", "gs://cli-no-such-bucket"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("torchdata-gcs clean: ") and "404" in err and err.count("\n") == 1

    gcs_emulator.create_bucket("cli-denied")
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="list")]) as front:
        assert main(["--endpoint", front.endpoint, "clean", "gs://cli-denied"]) == 1
    err = capsys.readouterr().err
    assert "403" in err and err.count("\n") == 1 and "Traceback" not in err


def test_module_entry_point_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torchdata_gcs.cli", "clean", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "--older-than AGE" in done.stdout and TEMPORARY_PREFIX in done.stdout
