"""The base of every writer that publishes an object: publish on a clean ``close()``, never otherwise."""

from __future__ import annotations

import io

__all__ = ["PublishingWriter"]


class PublishingWriter(io.RawIOBase):
    """A writer that publishes on a clean ``close()`` and never otherwise: leaving a ``with`` block by an
    exception aborts it, and so does being dropped unclosed (``IOBase`` would close, so publish, when collected)."""

    def readable(self) -> bool:
        return False

    def readinto(self, buffer: object) -> int:
        """Refused, as Python's own files opened for writing refuse it (``read``, ``readline`` come here)."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        raise io.UnsupportedOperation(f"{type(self).__name__} is opened for writing: it cannot be read")

    def _unpublished(self) -> bool:
        """Whether the writer is still open, neither published nor aborted."""
        raise NotImplementedError

    def abort(self) -> None:
        """Publish nothing."""
        raise NotImplementedError

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if self._unpublished():
            self.abort()
