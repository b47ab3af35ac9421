"""How the filesystem's calls reach GCS: a coroutine method runs on the process's I/O loop, where the sessions
live, as one call that ``RetryConfig.deadline`` bounds as a whole (or, for a call that may send any number of
requests, each request under its own), with a request context of the filesystem's handle."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar, cast

from .._ops.client import Client, GCSClient, RequestContext
from .paths import Paths

__all__ = ["Calls", "in_bulk_on_io_loop", "on_io_loop"]

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


def on_io_loop(method: F, *, one_call: bool = True) -> F:
    """Run a coroutine method on the process's I/O loop, where its session lives, whatever loop awaits it;
    as one call, which ``RetryConfig.deadline`` bounds as a whole, unless it is not ``one_call``."""

    @functools.wraps(method)
    async def wrapper(self: Calls, *args: Any, **kwargs: Any) -> Any:
        return await self._gcs.call(method(self, *args, **kwargs), one_call=one_call)

    return cast(F, wrapper)  # the method's own signature: wrapper takes and passes on exactly its arguments


def in_bulk_on_io_loop(method: F) -> F:
    """:func:`on_io_loop` for a method that may send any number of requests (an ``rm`` of a whole prefix),
    each under its own deadline."""
    return on_io_loop(method, one_call=False)


class Calls(Paths):
    """What every call of the filesystem goes through: its client, the handle made of it, and a request
    context per call."""

    client: GCSClient
    _gcs: Client

    def _context(self, budget: int | None = None) -> RequestContext:
        """A request context for one call (``budget``: bytes it may hold ahead, if not the transfer's)."""
        if budget is None:
            return self._gcs.context()
        return self._gcs.replace(transfer=replace(self.client.transfer, max_buffered_bytes=budget)).context()
