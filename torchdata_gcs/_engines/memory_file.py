"""Memory that downloaded bytes land in once, never copied again: anonymous in-memory files (Linux
``memfd``), which ``torch.load(..., mmap=True)`` maps so tensors live in the downloaded pages
themselves, so a whole read is held once, not twice."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["memory_file"]


@contextmanager
def memory_file(size: int) -> Iterator[tuple[str, mmap.mmap] | None]:
    """A new anonymous file of ``size`` bytes, as its path (valid in this process) and a writable
    mapping of it; ``None`` where the system has none (not Linux, no ``/proc``, an empty file). The
    file lives until it is closed here and no mapping of it is left."""
    if size == 0 or not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        yield None
        return
    descriptor = os.memfd_create("torchdata-gcs", os.MFD_CLOEXEC)
    try:
        os.ftruncate(descriptor, size)
        mapping = mmap.mmap(descriptor, size)
        try:
            yield f"/proc/self/fd/{descriptor}", mapping
        finally:
            try:
                mapping.close()
            except BufferError:  # views kept alive by an exception's traceback: unmapped when they go
                pass
    finally:
        os.close(descriptor)
