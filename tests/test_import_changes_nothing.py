"""Importing the package is a guest's entrance: it changes no state of the user's process (signal
handlers, warning filters, logging, start method, threads, hooks, environment, exit callbacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

MODULES = [
    "torchdata_gcs",
    "torchdata_gcs.fsspec",
    "torchdata_gcs.testing",
    "torchdata_gcs.checkpoint",
    "torchdata_gcs.dcp",
    "torchdata_gcs.lightning",
    "torchdata_gcs.datasets",
    "torchdata_gcs.nodes",
    "torchdata_gcs.datapipes",
    "torchdata_gcs.stalls",
]
OPTIONAL = {"torchdata_gcs.nodes": "torchdata >= 0.10", "torchdata_gcs.lightning": "lightning"}

PROBE = textwrap.dedent(
    """
    import atexit, faulthandler, hashlib, importlib, json, logging, multiprocessing, os, signal, socket, sys
    import threading, warnings
    import torch
    # What the user's program has imported before us: torch, torchdata, and the frameworks our front ends
    # plug into (torch's DCP, Lightning), whose own imports change warning filters and the environment.
    for framework in ["torchdata.datapipes", "torch.distributed.checkpoint", "lightning.fabric"]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torchdata 0.9 announces its deprecation
                importlib.import_module(framework)
        except ImportError:
            pass

    def native_signals():
        try:
            with open("/proc/self/status") as status:  # handlers set in C too, not only through Python
                return [line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
        except OSError:
            return None

    def threads():
        try:
            return len(os.listdir("/proc/self/task"))
        except OSError:
            return None

    def loggers():
        known = {"": logging.getLogger()} | {
            name: value
            for name, value in logging.Logger.manager.loggerDict.items()
            if isinstance(value, logging.Logger)
        }
        return {
            name: [
                logging.getLevelName(value.level), [repr(h) for h in value.handlers], value.propagate, value.disabled
            ]
            for name, value in known.items()
        }

    def state():
        return {
            "signals": {
                str(s): repr(signal.getsignal(s))
                for s in sorted(signal.valid_signals())
                if signal.getsignal(s) is not None
            },
            "native signals": native_signals(),
            "warning filters": [repr(f) for f in warnings.filters],
            "loggers": loggers(),
            "logging": [
                logging.root.manager.disable,
                repr(logging.getLoggerClass()),
                repr(logging.getLogRecordFactory()),
                repr(logging.lastResort),
            ],
            "start method": multiprocessing.get_start_method(allow_none=True),
            "python threads": sorted(t.name for t in threading.enumerate()),
            "threads": threads(),
            "hooks": [
                repr(sys.excepthook), repr(threading.excepthook), repr(sys.unraisablehook), repr(sys.displayhook)
            ],
            # digests, so that no value of the environment lands in a report
            "environment": {k: hashlib.sha256(v.encode()).hexdigest()[:12] for k, v in os.environ.items()},
            "exit callbacks": atexit._ncallbacks(),
            "faulthandler": faulthandler.is_enabled(),
            "socket timeout": socket.getdefaulttimeout(),
            "recursion limit": sys.getrecursionlimit(),
        }

    before = state()
    imported = []
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
            imported.append(name)
        except ImportError as exc:
            imported.append(f"{name}: {exc}")
    after = state()
    ours = {
        name: [logging.getLevelName(value.level), [type(h).__name__ for h in value.handlers]]
        for name, value in logging.Logger.manager.loggerDict.items()
        if name.startswith("torchdata_gcs") and isinstance(value, logging.Logger)
    }
    after["loggers"] = {name: value for name, value in after["loggers"].items() if name in before["loggers"]}
    print(json.dumps({"before": before, "after": after, "imported": imported, "ours": ours}))
    """
)


def changes(modules: list[str], path: str = "") -> tuple[list[str], dict[str, object], dict[str, object]]:
    """What importing ``modules`` (after torch and torchdata) changed, in a fresh interpreter: the names
    imported (``name: error`` where one failed), the state that changed, and our loggers' settings."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    before, after = found["before"], found["after"]
    changed = {key: {"before": before[key], "after": after[key]} for key in before if before[key] != after[key]}
    return found["imported"], changed, found["ours"]


def test_importing_every_module_changes_no_process_state() -> None:
    imported, changed, ours = changes(MODULES)
    missing = [line for line in imported if ": " in line]
    assert [line for line in missing if line.split(":")[0] not in OPTIONAL] == [], missing
    assert len(missing) <= 1, missing  # each test environment lacks at most one optional dependency
    assert changed == {}
    # Our own loggers are left to the application: no level, no handler.
    assert {name: value for name, value in ours.items() if value != ["NOTSET", []]} == {}


def test_the_probe_sees_what_an_intrusive_import_changes(tmp_path: Path) -> None:
    """The comparison above can fail: a module that sets a SIGTERM handler, configures logging and
    registers an exit callback on import is caught on each count."""
    (tmp_path / "intrusive.py").write_text(
        "import atexit, logging, signal\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: None)\n"
        "logging.basicConfig()\n"
        "atexit.register(print)\n"
    )
    imported, changed, _ = changes(["intrusive"], str(tmp_path))
    assert imported == ["intrusive"]
    expected = {"signals", "loggers", "exit callbacks"} | (
        {"native signals"} if sys.platform.startswith("linux") else set()
    )
    assert set(changed) == expected
