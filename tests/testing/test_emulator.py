"""The embedded emulator: starts, serves, seeds concurrently, and always stops."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import requests

from torchdata_gcs.testing import Emulator, EmulatorError


def _answers(endpoint: str) -> bool:
    try:
        return requests.get(f"{endpoint}/storage/v1/b", timeout=2).ok
    except requests.ConnectionError:
        return False


@pytest.mark.parametrize("backend", ["memory", "filesystem"])
def test_seeds_and_reads_back(backend: str) -> None:
    objects = {f"dir/{i:04d}.bin": bytes([i % 256]) * (i + 1) for i in range(200)}
    with Emulator(backend=backend) as emulator:  # type: ignore[arg-type]
        emulator.seed("seeded", objects, concurrency=8)
        assert all(emulator.read("seeded", name) == data for name, data in objects.items())
        endpoint = emulator.endpoint
    assert not _answers(endpoint)


def test_stops_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), Emulator() as emulator:
        endpoint = emulator.endpoint
        assert _answers(endpoint)
        raise RuntimeError("boom")
    assert not _answers(endpoint)


def test_stops_when_garbage_collected() -> None:
    emulator = Emulator().start()
    endpoint = emulator.endpoint
    del emulator
    gc.collect()
    assert not _answers(endpoint)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
def test_stops_and_removes_its_data_when_the_process_gets_sigterm() -> None:
    """A test run killed by SIGTERM (a CI timeout, a Ctrl-C'd pytest-xdist worker) leaves no emulator
    running and none of its objects in memory: the process's reaper stops it once the process is gone."""
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import os, time
            from torchdata_gcs.testing import Emulator
            emulator = Emulator(backend="filesystem").start()
            emulator.seed("kept", {"x": b"1" * 1000})
            print(emulator.endpoint, emulator._server.pid, os.path.dirname(emulator._server._log), flush=True)
            time.sleep(60)
            """
        )],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:  # fmt: skip
        assert child.stdout is not None
        endpoint, pid, scratch = child.stdout.readline().split()
        assert _answers(endpoint) and os.path.isdir(scratch)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM  # it still dies of the signal
    deadline = time.monotonic() + 10  # the reaper stops the server, then removes its folder
    while (_answers(endpoint) or os.path.exists(scratch)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _answers(endpoint) and not os.path.exists(scratch)
    assert not _running(int(pid))


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: gone, or a zombie that only its new parent (whatever runs as pid 1) may
    still have to reap, it does not."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False


def test_two_emulators_run_side_by_side() -> None:
    with Emulator() as first, Emulator() as second:
        first.seed("one", {"x": b"1"})
        second.seed("one", {"x": b"2"})
        assert (first.read("one", "x"), second.read("one", "x")) == (b"1", b"2")


def test_misuse_raises_emulator_error() -> None:
    emulator = Emulator()
    with pytest.raises(EmulatorError):
        _ = emulator.client_config
    with pytest.raises(ValueError):
        Emulator(backend="disk")  # type: ignore[arg-type]
    with emulator, pytest.raises(EmulatorError):
        emulator.start()


def test_fixture_buckets_are_fresh_and_empty(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    listing = requests.get(f"{gcs_emulator.endpoint}/storage/v1/b/{gcs_bucket}/o", timeout=5).json()
    assert listing.get("items", []) == []


def test_a_data_dir_keeps_objects_for_the_next_emulator(tmp_path) -> None:
    with Emulator(data_dir=tmp_path / "data") as first:
        first.seed("kept", {"a/1.bin": b"one"})
    with Emulator(data_dir=tmp_path / "data") as second:
        second.create_bucket("kept")  # exists already: no error
        assert second.names("kept") == ["a/1.bin"] and second.read("kept", "a/1.bin") == b"one"
    assert (tmp_path / "data").is_dir()  # stopping keeps a given folder
