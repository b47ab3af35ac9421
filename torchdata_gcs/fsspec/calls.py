"""How the filesystem's calls reach GCS: a coroutine method runs on the process's I/O loop, where the sessions
live, as one call that ``RetryConfig.deadline`` bounds as a whole (or, for a call that may send any number of
requests, each request under its own), with a request context of the filesystem's handle."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from .._ops.client import Client, GCSClient, RequestContext
from .paths import Paths

__all__ = ["Calls", "in_bulk_on_io_loop", "on_io_loop"]

T = TypeVar("T")


def on_io_loop(method: Callable[..., Awaitable[T]], *, one_call: bool = True) -> Callable[..., Awaitable[T]]:
    """Run a coroutine method on the process's I/O loop, where its session lives, whatever loop awaits it;
    as one call, which ``RetryConfig.deadline`` bounds as a whole, unless it is not ``one_call``."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> T:
        return await self._gcs.call(method(self, *args, **kwargs), one_call=one_call)

    return wrapper


def in_bulk_on_io_loop(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
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
