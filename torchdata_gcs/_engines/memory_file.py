"""Memory that downloaded bytes land in once, never copied again: anonymous in-memory files (Linux
``memfd``), which ``torch.load(..., mmap=True)`` maps so tensors live in the downloaded pages
themselves, and ``bytes`` objects filled in place, so a whole read is held once, not twice."""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FilledBytes", "memory_file"]


class FilledBytes:
    """One ``bytes`` object of ``size`` bytes, written in place through :attr:`view`, then taken by
    :meth:`take` without a copy.

    An ``io.BytesIO`` made over a new ``bytes(size)`` shares it, ``getbuffer()`` writes into it (being
    its only holder, nothing is copied first), and ``getvalue()`` hands back that same object once no
    view of it is left (CPython's ``BytesIO`` does so whenever it can; were a view left, the result
    would be a correct copy). ``bytes(size)`` comes zeroed from the allocator: a page counts in memory
    only once written.
    """

    def __init__(self, size: int) -> None:
        self._holder = io.BytesIO(bytes(size))
        self.view = self._holder.getbuffer()

    def take(self) -> bytes:
        """The bytes written; :attr:`view` is released (slices of it must be gone by now)."""
        self.view.release()
        return self._holder.getvalue()


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
