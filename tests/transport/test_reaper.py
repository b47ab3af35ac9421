"""The reaper: once the process that handed it tasks has ended (killed or not), it runs those not
released, and exits; it is small, carries no torch, and gives up at its deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")

PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, tempfile, time
    import torch  # the reaper must not carry it
    from torchdata_gcs._transport import reaper
    reaper.DEADLINE_SECONDS = float(sys.argv[1])
    def server(*command):
        process = subprocess.Popen(  # in a session of its own: only the reaper stops it
            command or ["sleep", "300"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        folder = tempfile.mkdtemp(prefix="torchdata-gcs-test-reaper-")
        return process, folder, reaper.watch(reaper.StopProcess(process.pid, folder))
    watched, folder, _ = server(*sys.argv[3:])
    released, kept, handle = server()
    reaper.release(handle)
    if sys.argv[2] == "fork" and os.fork() == 0:
        time.sleep(300)  # a forked child outlives its parent; its copy of the reaper's pipe is closed
        os._exit(0)
    print(watched.pid, folder, released.pid, kept, flush=True)
    if sys.argv[2] == "exit":
        sys.exit(0)
    time.sleep(300)
    """
)


def state(pid: int) -> str | None:
    """The process's state letter (``Z`` for a zombie), ``None`` once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return None


def running(pid: int) -> bool:
    return state(pid) not in (None, "Z")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def reaper_of(pid: int) -> int:
    """The reaper started by ``pid``: its child that runs the reaper's bootstrap."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for child in children(pid):
            if b"_transport.reaper" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no reaper")


def wait_until(condition, seconds: float, what: str) -> float:
    """Seconds until ``condition()`` held; fails after ``seconds``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, what
        time.sleep(0.02)
    return time.monotonic() - start


def end_group(parent: subprocess.Popen[str]) -> None:
    """Kill what is left of the parent's process group (a forked child holds its output open) and reap it."""
    try:
        os.killpg(parent.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    parent.communicate(timeout=30)


def start(how: str, *command: str, deadline: float = 120.0) -> tuple[subprocess.Popen[str], list[str]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(deadline), how, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert parent.stdout is not None
    line = parent.stdout.readline().split()
    assert len(line) == 4, parent.communicate()[1]
    return parent, line


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "fork"])
def test_a_killed_process_leaves_no_watched_server_and_no_folder(how: str) -> None:
    parent, (watched, folder, released, kept) = start(how)
    reaper = reaper_of(parent.pid)
    try:
        assert running(int(watched)) and os.path.isdir(folder)
        parent.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
        assert parent.wait(timeout=10) == (-signal.SIGTERM if how == "SIGTERM" else -signal.SIGKILL)
        wait_until(lambda: not running(int(watched)), 10, "the watched server outlived its starter")
        wait_until(lambda: not os.path.exists(folder), 10, "the watched folder is still there")
        wait_until(lambda: not running(reaper), 10, "the reaper did not exit")
        assert running(int(released)) and os.path.isdir(kept)  # what was released is left alone
    finally:
        for pid in (int(watched), int(released)):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        end_group(parent)
        subprocess.run(["rm", "-rf", folder, kept], check=True)


def test_a_normal_exit_that_released_everything_ends_the_reaper_and_runs_nothing() -> None:
    parent, (watched, folder, released, kept) = start("exit")
    try:
        assert parent.wait(timeout=30) == 0
        # The exit skipped the watched server's stop: the reaper stops it, and leaves the released one.
        wait_until(lambda: not running(int(watched)) and not os.path.exists(folder), 10, "the watched task did not run")
        assert running(int(released)) and os.path.isdir(kept)
    finally:
        for pid in (int(watched), int(released)):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        parent.communicate()
        subprocess.run(["rm", "-rf", folder, kept], check=True)


def test_the_reaper_carries_no_torch_and_little_memory() -> None:
    parent, (watched, folder, released, kept) = start("wait")
    reaper = reaper_of(parent.pid)
    try:
        time.sleep(1)  # started and waiting
        maps = Path(f"/proc/{reaper}/maps").read_text()
        parent_maps = Path(f"/proc/{parent.pid}/maps").read_text()
        assert "libtorch" in parent_maps and "libtorch" not in maps
        status = dict(line.split(":", 1) for line in Path(f"/proc/{reaper}/status").read_text().splitlines())
        assert int(status["VmRSS"].split()[0]) < 64 * 1024  # kB
    finally:
        parent.kill()
        parent.communicate()
        wait_until(lambda: not os.path.exists(folder) and not running(int(watched)), 10, "not cleaned up")
        if running(int(released)):
            os.kill(int(released), signal.SIGKILL)
        subprocess.run(["rm", "-rf", kept], check=True)


def test_the_reaper_gives_up_at_its_deadline() -> None:
    """A server that ignores SIGTERM holds the reaper through its grace period; the deadline comes first."""
    stubborn = ["sh", "-c", "trap '' TERM; sleep 300"]
    parent, (watched, folder, released, kept) = start("wait", *stubborn, deadline=1.0)
    reaper = reaper_of(parent.pid)
    try:
        parent.kill()
        parent.wait(timeout=10)
        took = wait_until(lambda: not running(reaper), 8, "the reaper outlived its deadline")
        assert took < 8
        assert running(int(watched))  # given up on, not killed
        _, errors = parent.communicate(timeout=10)  # the reaper wrote to the stderr it shared
        assert "gave up after 1 s" in errors
    finally:
        for pid in (int(watched), int(released)):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", folder, kept], check=True)
