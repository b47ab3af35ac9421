"""Measuring in a fresh process: a script that reads a JSON spec on stdin and prints a JSON result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_child(script: str, spec: dict[str, Any], timeout: float = 120) -> Any:
    """Run ``script`` in a new interpreter with ``spec`` on its stdin; what it printed, as JSON. A child that
    fails fails the test with the end of its stderr."""
    child = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout)
