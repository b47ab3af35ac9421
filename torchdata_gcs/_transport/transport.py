"""The seam between the wire and everything above it: a :class:`Transport` takes a request and gives back a
:class:`Response` (status, headers, a body read whole, into a caller's buffer, or as chunks).

:class:`.session.Session` adds what GCS asks of every request (credentials, billing, typed errors) on top;
the aiohttp transport (:mod:`.aio`) is today's only implementation, and ops and engines see no other type."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

__all__ = ["Body", "Headers", "Response", "Transport"]

Body = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]
"""A request body: bytes, or pieces sent in order without being joined."""


class Headers(Protocol):
    """An answer's headers: a mapping of ``str`` whose names are case-insensitive; a header sent on several
    lines has each line in :meth:`getall`, and the first in ``[]`` and :meth:`get`. They stay valid after
    the response is done with."""

    def __getitem__(self, name: str, /) -> str: ...

    def __contains__(self, name: object, /) -> bool: ...

    def get(self, name: str, default: Any = None, /) -> Any: ...

    def getall(self, name: str, default: Any, /) -> Any: ...


class Response(Protocol):
    """One answer. Its body is read once, by any mix of :meth:`read`, :meth:`readinto` and :meth:`chunks`:
    each takes up where the last stopped. A body cut off raises the transport's network error."""

    status: int
    headers: Headers

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
