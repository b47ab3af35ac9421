"""The README's main job: the quickstart example runs end to end on the embedded emulator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "quickstart.py"


def test_quickstart_reads_every_sample_once() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--samples", "150", "--workers", "2", "--batch-size", "16"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "read 150 samples (150 distinct) with 2 workers" in result.stdout
    assert "per class: cat=50, dog=50, bird=50" in result.stdout
    assert "every sample exactly once: True" in result.stdout
