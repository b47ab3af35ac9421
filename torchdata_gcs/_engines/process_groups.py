"""What torch keeps to itself about a process group, read where it can be."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = ["timeout_of"]


def timeout_of(group: Any) -> timedelta | None:
    """The timeout ``group`` was made with, read from its first backend; ``None`` where torch hides it."""
    try:
        for device in group._device_types:
            return group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        pass
    return None
