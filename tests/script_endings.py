"""Scripts that stop reading early, each run to its real end in a process of its own.

A script ends in six ways (:data:`ENDINGS`): it leaves an iterator half-read at module level and reaches
the end of the file, breaks out of its loop in a function, raises its own exception, calls ``sys.exit``,
or is stopped by Ctrl-C or SIGTERM in its loop. :func:`run_scripts` runs each script's source as the
``__main__`` module of a child process and reports how it ended: its exit status, its stderr, how long it
took to end, and whether every process it started (its workers) was gone by then.

Each child is forked from one runner process that imported torch and this package once (importing costs
more than a second a process; a fork, a few milliseconds), then calls ``os.setsid`` (so Ctrl-C reaches
it and its workers, as a terminal's does) and runs the script at module level: what happens after
the script is the interpreter's own end, atexit, garbage collection and module teardown included.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchdata_gcs.testing import Emulator

ENDINGS = ("module", "break", "exception", "exit", "ctrl_c", "sigterm")
"""How a script stops reading: see the module docstring."""

END_SECONDS = 8.0
"""How long a script may take from where it stops reading to its end: the interpreter's own end (torch's
teardown, a traceback printed) takes up to 2 s on a loaded 2-core machine; a script that hangs never ends."""

WORKERS_SECONDS = 10.0
"""How long its worker processes may outlive it: a DataLoader worker whose parent was killed looks for it
every 5 s (torch's ``MP_STATUS_CHECK_INTERVAL``) and then ends."""

USER_ERROR = "the user's own error"
"""The message of the exception the ``exception`` scripts raise."""

_ENDING_CODE = {
    # The prelude defines make(): a new iterable over the objects, as the script's loop would read them.
    "module": """
        items = iter(make())
        taken = [next(items) for _ in range(10)]
        ready()
    """,
    "break": """
        def train():
            for step, item in enumerate(make()):
                if step == 10:
                    break
            ready()

        train()
    """,
    "exception": f"""
        def train():
            for step, item in enumerate(make()):
                if step == 10:
                    ready()
                    raise RuntimeError({USER_ERROR!r})

        train()
    """,
    "exit": """
        def train():
            for step, item in enumerate(make()):
                if step == 10:
                    ready()
                    sys.exit(3)

        train()
    """,
    # Read epoch after epoch until the signal comes: it lands in the loop, wherever the loop waits.
    "ctrl_c": """
        def train():
            step = 0
            while True:
                for item in make():
                    step += 1
                    if step == 10:
                        ready()
                    time.sleep(0.001)

        train()
    """,
}
_ENDING_CODE["sigterm"] = _ENDING_CODE["ctrl_c"]

EXPECTED_STATUS = {"module": 0, "break": 0, "exception": 1, "exit": 3, "ctrl_c": -2, "sigterm": -15}
"""Each ending's exit status: a Ctrl-C that ends a Python script ends it by SIGINT, as the shell expects."""

_RUNNER = Path(__file__).with_name("script_endings_runner.py")

OBJECTS = 2_500  # more than a list page holds: a listing stopped after ten objects has pages still to come
BIG = 3  # objects of 8 MiB under big/
BUCKET = "endings"

COMMON = """
import os, sys, time
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
URL, BIG, SHARDS, WORKERS = {url!r}, {big!r}, {shards!r}, {workers}

def ready():
    sys.stdout.write("ready\\n")
    sys.stdout.flush()

def mine(paths):
    info = get_worker_info()
    return paths if info is None else paths[info.id :: info.num_workers]
"""
"""What every script starts with: the URLs of :func:`seeded_emulator`'s objects and shards, the number of workers,
``ready()`` (the script's stop is near) and ``mine(paths)`` (a DataLoader worker's share of ``paths``)."""


@contextmanager
def seeded_emulator() -> Iterator[Emulator]:
    """An emulator of its own (the shared one scans every object at each request) holding :data:`BUCKET`:
    :data:`OBJECTS` small objects under ``d/``, :data:`BIG` large ones under ``big/`` and 4 tar shards
    under ``shards/``."""
    with Emulator(backend="filesystem") as emulator:
        objects = {f"d/{i:05d}.bin": b"%d" % i for i in range(OBJECTS)}
        objects.update({f"big/{i}.bin": bytes(8 << 20) for i in range(BIG)})
        objects.update({f"shards/{i}.tar": _shard(i) for i in range(4)})
        emulator.seed(BUCKET, objects, concurrency=32)
        yield emulator


def _shard(number: int) -> bytes:
    """A tar shard of 200 samples of 10 KiB (``{number}-{key}.bin``)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for key in range(200):
            info = tarfile.TarInfo(f"{number}-{key:03d}.bin")
            info.size = 10 << 10
            tar.addfile(info, io.BytesIO(bytes(info.size)))
    return out.getvalue()


def scripts_of(front: str, prelude: str) -> list[Script]:
    """Every ending of ``prelude``'s ``make()``, with no worker and with two."""
    return [
        Script(
            f"{front}-{ending}-{workers}-workers.py",
            COMMON.format(
                url=f"gs://{BUCKET}/d/", big=f"gs://{BUCKET}/big/", shards=f"gs://{BUCKET}/shards/", workers=workers
            )
            + prelude,
            ending,
        )
        for workers in (0, 2)
        for ending in ENDINGS
    ]


@dataclass(frozen=True)
class Script:
    """One script: ``prelude`` (imports and ``make()``) followed by the code of ``ending``."""

    name: str
    prelude: str
    ending: str

    def source(self) -> str:
        return textwrap.dedent(self.prelude) + "\n" + textwrap.dedent(_ENDING_CODE[self.ending])


@dataclass(frozen=True)
class Ending:
    """How one script ended."""

    script: Script
    status: int | None  # None: still running at the deadline (then killed)
    stderr: str
    seconds: float  # from the stop (ready, or the signal) to the script's end
    workers_left: bool  # a process of the script's group was still running WORKERS_SECONDS after the stop

    def problems(self) -> list[str]:
        """What is wrong with this ending; empty when it ended as a script should."""
        ending = self.script.ending
        problems = []
        if self.status is None:
            return [f"still running after {self.seconds:.1f} s"]
        if self.status != EXPECTED_STATUS[ending]:
            problems.append(f"exit status {self.status}, expected {EXPECTED_STATUS[ending]}")
        if self.seconds > END_SECONDS:
            problems.append(f"took {self.seconds:.1f} s to end")
        if self.workers_left:
            problems.append(f"a worker process was still running {WORKERS_SECONDS:g} s after the stop")
        tracebacks = self.stderr.count("Traceback (most recent call last)")
        lines = self.stderr.strip().splitlines()
        if ending == "exception":
            if tracebacks != 1 or not lines or lines[-1] != f"RuntimeError: {USER_ERROR}":
                problems.append("stderr is not the user's traceback alone")
        elif ending == "ctrl_c":
            if tracebacks != 1 or not lines or lines[-1] != "KeyboardInterrupt":
                problems.append("stderr is not one KeyboardInterrupt traceback")
        elif self.stderr.strip():
            problems.append("stderr is not empty")
        return problems

    def __str__(self) -> str:
        return f"{self.script.name}: {'; '.join(self.problems()) or 'ended well'}\n{self.stderr[-2000:]}"


def run_scripts(scripts: list[Script], env: dict[str, str], *, parallel: int = 3, timeout: float = 600) -> list[Ending]:
    """Run every script to its end (``parallel`` at a time) in children of one runner; how each ended."""
    spec = {
        "scripts": [{"name": s.name, "source": s.source(), "ending": s.ending} for s in scripts],
        "parallel": parallel,
        "workers_seconds": WORKERS_SECONDS,
    }
    runner = subprocess.run(
        [sys.executable, str(_RUNNER)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        check=False,
    )
    assert runner.returncode == 0, runner.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(runner.stdout)
    return [
        Ending(script, r["status"], r["stderr"], r["seconds"], r["workers_left"])
        for script, r in zip(scripts, results, strict=True)
    ]
