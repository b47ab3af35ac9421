"""Runs the scripts of :mod:`tests.script_endings` (a JSON spec on stdin) and prints how each ended as JSON.

This process imports what the scripts import, once, then forks a child per script. The child runs its
script as this ``__main__`` module's code and falls off the end of this file: its end is a script's end.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

import torch  # noqa: F401 - imported once here, inherited by every script

import torchdata_gcs  # noqa: F401
import torchdata_gcs.fsspec  # noqa: F401

if importlib.util.find_spec("torchdata.nodes") is not None:
    import torchdata.nodes  # noqa: F401

    import torchdata_gcs.nodes  # noqa: F401

READY_SECONDS = 90.0  # a script that has not reached its stop by then is killed and reported as such
POLL = 0.005


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(scripts: list[dict[str, Any]], parallel: int, workers_seconds: float) -> dict[str, Any] | None:
    """Fork a child per script, ``parallel`` at a time; in the parent, the endings once all are done
    (``None`` is never returned there); in a child, the script it is to run."""
    scratch = tempfile.mkdtemp(prefix="script-endings-")
    waiting = list(enumerate(scripts))
    running: dict[int, dict[str, Any]] = {}
    results: list[dict[str, Any] | None] = [None] * len(scripts)
    while waiting or running:
        while waiting and len(running) < parallel:
            index, script = waiting.pop(0)
            out, err = (os.path.join(scratch, f"{index}.{kind}") for kind in ("out", "err"))
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.setsid()
                for fd, path in ((1, out), (2, err)):
                    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.dup2(target, fd)
                    os.close(target)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.close(devnull)
                # As a script started in a terminal has it, even where this runner was started with SIGINT ignored.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                sys.argv = [script["name"]]
                return script
            running[pid] = {"index": index, "script": script, "out": out, "err": err, "started": time.monotonic()}
        time.sleep(POLL)
        now = time.monotonic()
        for pid, child in list(running.items()):
            ending = child["script"]["ending"]
            if "stopped" not in child:
                with contextlib.suppress(FileNotFoundError):
                    with open(child["out"]) as out:
                        if "ready" in out.read():
                            child["stopped"] = now
                            if ending == "ctrl_c":
                                os.killpg(pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
                            elif ending == "sigterm":
                                os.kill(pid, signal.SIGTERM)  # as a scheduler or torchrun stops a job
            if "status" not in child:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    child["status"] = os.waitstatus_to_exitcode(status)
                    child.setdefault("stopped", now)  # ended before its stop: its status says what went wrong
                    child["ended"] = now
            ended = "status" in child and not _group_alive(pid)
            stopped = child.get("stopped", child["started"])
            overdue = now - stopped > workers_seconds if "stopped" in child else now - stopped > READY_SECONDS
            if not ended and not overdue:
                continue
            workers_left = not ended and "status" in child  # the script ended, a process of its group did not
            if not ended:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                if "status" not in child:
                    os.waitpid(pid, 0)
            with open(child["err"], errors="replace") as err:
                stderr = err.read()
            results[child["index"]] = {
                "status": child.get("status"),
                "stderr": stderr,
                "seconds": child.get("ended", now) - stopped,
                "workers_left": workers_left,
            }
            del running[pid]
    json.dump(results, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # the runner itself used nothing that needs tidying
    return None


if __name__ == "__main__":  # not when pytest collects this file
    _spec = json.load(sys.stdin)
    _script = _watch(_spec["scripts"], _spec["parallel"], _spec["workers_seconds"])
    assert _script is not None
    del _spec
    exec(compile(_script["source"], _script["name"], "exec"))  # still this module's top level
