"""Process lifecycle: cleanups before closings whatever the import order, hooks registered at first use,
no signal handler ever, a forked child forgets what it inherited."""

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


def test_at_exit_stops_come_first_and_the_last_closing_last_whatever_registered_first() -> None:
    done = run(
        """
        from torchdata_gcs._transport import lifecycle
        lifecycle.at_exit(lambda: print("last", flush=True), last=True)
        lifecycle.at_exit(lambda: print("close", flush=True))
        lifecycle.cleanup(lambda: print("cleanup", flush=True))
        lifecycle.stop_at_exit(lambda: print("stop", flush=True))
        """
    )
    assert done.returncode == 0 and done.stdout.split() == ["stop", "cleanup", "close", "last"], done.stderr


def test_hooks_are_registered_at_first_use_not_at_import() -> None:
    done = run(
        """
        import atexit
        from torchdata_gcs._transport import lifecycle, loop, reaper, session
        imported = atexit._ncallbacks()
        lifecycle.at_exit(lambda: print("close", flush=True))
        print(atexit._ncallbacks() - imported, flush=True)
        """
    )
    assert done.stdout.split() == ["1", "close"], done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the signal masks from /proc")
def test_no_signal_handler_is_ever_set() -> None:
    """Every hook in use (exit, worker exit, fork, a watched parent, the reaper, the I/O loop): no handler,
    neither through Python nor in C, so SIGTERM still ends the process at once."""
    done = run(
        """
        import os, signal, time
        from torchdata_gcs._transport import lifecycle, loop, reaper
        def handlers():
            caught = [line for line in open("/proc/self/status") if line.startswith("SigCgt")]
            return caught, [signal.getsignal(s) for s in signal.valid_signals()]
        before = handlers()
        lifecycle.cleanup(lambda: print("cleanup", flush=True))
        lifecycle.install()
        lifecycle.watch_parent()
        reaper.start_soon()
        loop.run(__import__("asyncio").sleep(0))
        if os.fork() == 0:
            os._exit(0)
        os.wait()
        print(handlers() == before, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        print("not reached", flush=True)
        """
    )
    assert done.returncode == -signal.SIGTERM and done.stdout.split() == ["True"], done.stderr


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
