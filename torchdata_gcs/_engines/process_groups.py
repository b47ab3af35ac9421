"""What torch keeps to itself about a process group, read where it can be; and which ranks share a
machine's memory, and whether a rank's process still runs."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["SHARED_MEMORY", "alive", "machine", "timeout_of"]

SHARED_MEMORY = Path("/dev/shm")
"""Where segments shared by the ranks of a machine are made: memory every process of a machine (or
container) can map by name."""


def machine() -> tuple[str, str, int]:
    """What ranks sharing memory share: the host's name, its boot, and the shared-memory mount."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot, SHARED_MEMORY.stat().st_dev


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a process that ended but was not yet reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def timeout_of(group: Any) -> timedelta | None:
    """The timeout ``group`` was made with, read from its first backend; ``None`` where torch hides it."""
    try:
        for device in group._device_types:
            return group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        pass
    return None
