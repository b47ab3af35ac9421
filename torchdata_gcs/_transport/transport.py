"""The seam between the wire and everything above it: a :class:`Transport` takes a request and gives back a
:class:`Response` (status, headers, a body read whole, into a caller's buffer, or as chunks).

:class:`.session.Session` adds what GCS asks of every request (credentials, billing, typed errors) on top;
media reads go out over :mod:`.wire` (bodies land in the reader's buffer), the rest over aiohttp
(:mod:`.aio`); ops and engines see no other type."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar, overload

__all__ = ["Body", "FilledBytes", "Headers", "Response", "Transport"]

T = TypeVar("T")

Body = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]
"""A request body: bytes, or pieces sent in order without being joined."""


class Headers(Protocol):
    """An answer's headers: a mapping of ``str`` whose names are case-insensitive; a header sent on several
    lines has each line in :meth:`getall`, and the first in ``[]`` and :meth:`get`. They stay valid after
    the response is done with."""

    def __getitem__(self, name: str, /) -> str: ...

    def __contains__(self, name: object, /) -> bool: ...

    @overload
    def get(self, name: str, /) -> str | None: ...

    @overload
    def get(self, name: str, /, default: T) -> str | T: ...

    def get(self, name: str, /, default: Any = None) -> Any: ...

    @overload
    def getall(self, name: str, /) -> list[str]: ...

    @overload
    def getall(self, name: str, /, default: T) -> list[str] | T: ...

    def getall(self, name: str, /, default: Any = None) -> Any: ...


class Response(Protocol):
    """One answer. Its body is read once, by any mix of :meth:`read`, :meth:`readinto` and :meth:`chunks`:
    each takes up where the last stopped. A body cut off raises the transport's network error."""

    status: int

    @property
    def headers(self) -> Headers:
        """The answer's headers."""
        ...

    async def read(self) -> bytes:
        """The rest of the body."""
        ...

    async def readinto(self, buffer: memoryview) -> int:
        """Put the next bytes of the body into ``buffer``; how many (``0`` at the end of the body)."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The rest of the body in the pieces it arrives in, none empty."""
        ...


class Transport(Protocol):
    """Sends requests to one endpoint and gives back their answers, any status (errors are the caller's)."""

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None,
        *,
        url: str,
        json: Any = None,
        data: Body | None = None,
        answer_timeout: float | None = None,
    ) -> AbstractAsyncContextManager[Response]:
        """Send ``method`` to ``target`` (a URL already percent-encoded, with its query) with ``headers`` and
        a ``json`` or ``data`` body if given; ``url`` is what errors call the request (``gs://b/o``). With
        ``answer_timeout``, the whole exchange may take that many seconds, and the read timeout does not
        apply. The response is valid inside the context."""
        ...

    async def close(self) -> None:
        """Close the connections; the transport is not used again."""
        ...


class FilledBytes:
    """One ``bytes`` object of ``size`` bytes, written in place through :attr:`view`, then taken by
    :meth:`take` without a copy: a body read whole, or a part read into place.

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
