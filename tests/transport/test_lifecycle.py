"""Process lifecycle: cleanups before closings whatever the import order, SIGTERM runs the cleanups from
any thread's work and still dies of SIGTERM, a forked child forgets what it inherited."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )


def test_cleanups_run_before_closings_whatever_registered_first() -> None:
    done = run(
        """
        from torchdata_gcs._transport import lifecycle
        lifecycle.at_exit(lambda: print("close", flush=True))       # registered first
        lifecycle.cleanup(lambda: print("cleanup", flush=True))
        """
    )
    assert done.returncode == 0 and done.stdout.split() == ["cleanup", "close"], done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM and fork are POSIX")
def test_sigterm_runs_the_cleanups_for_work_on_another_thread_and_still_kills() -> None:
    done = run(
        """
        import os, signal, threading, time
        import torchdata_gcs
        from torchdata_gcs._transport import lifecycle
        lifecycle.cleanup(lambda: print("cleanup", flush=True))
        worker = threading.Thread(target=lambda: os.kill(os.getpid(), signal.SIGTERM))
        worker.start()
        time.sleep(30)
        print("not reached", flush=True)
        """
    )
    assert done.returncode == -signal.SIGTERM and done.stdout.split() == ["cleanup"], done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")
def test_a_forked_child_forgets_what_it_inherited() -> None:
    done = run(
        """
        import os
        from torchdata_gcs._transport import lifecycle
        inherited = ["parent-owned"]
        lifecycle.after_fork(inherited.clear)
        pid = os.fork()
        if pid == 0:
            print("child", inherited, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("parent", inherited, flush=True)
        """
    )
    assert done.stdout.splitlines() == ["child []", "parent ['parent-owned']"], done.stderr
