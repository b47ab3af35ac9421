"""The handle a front end builds once and hands down: endpoint settings, transfer settings, retry policy
and statistics, making the request context of each iteration, with the single-request verbs of
:mod:`.objects` as blocking methods (run on the process's I/O loop, like every request); and what a
reaper's task keeps to build one in the reaper."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from .._transport.context import LoadStats, RequestContext, new_context
from .._transport.http import EMULATOR_ENV
from .._transport.loop import run
from .._transport.session import Session, session_for
from ..config import ClientConfig, RetryConfig, TransferConfig
from . import objects
from .checksums import ObjectInfo

__all__ = ["Client", "ReaperTask"]

P = ParamSpec("P")
T = TypeVar("T")

_CONTROL = TransferConfig()  # single requests: the default concurrency slots and budget are never reached


class Client:
    """One front-end object's way to GCS: ``config`` (endpoint, credentials), ``transfer`` (concurrency,
    buffering, part size), ``retry`` and ``stats``. :meth:`context` makes each iteration's request context,
    which counts into ``stats``; the blocking verbs (list a page, head, read, create, compose, delete) are
    each retried under ``retry`` and not counted.

    A handle is cheap and holds only settings and counts: it finds this process's :class:`Session` on each
    call, so it pickles and may be kept across a fork. It must not be used from the I/O loop's own thread.
    """

    def __init__(
        self,
        config: ClientConfig,
        retry: RetryConfig | None = None,
        *,
        transfer: TransferConfig | None = None,
        stats: LoadStats | None = None,
    ) -> None:
        self.config = config
        self.retry = retry or RetryConfig()
        self.transfer = transfer or TransferConfig()
        self.stats = LoadStats() if stats is None else stats

    def __repr__(self) -> str:
        return f"Client({self.config!r})"

    @property
    def session(self) -> Session:
        """This process's session for the handle's configuration."""
        return session_for(self.config)

    def context(self) -> RequestContext:
        """A fresh request context for one iteration (its own byte budget and slots), counting into ``stats``."""
        return new_context(self.config, self.transfer, self.retry, self.stats)

    def replace(self, *, transfer: TransferConfig | None = None, stats: LoadStats | None = None) -> Client:
        """This handle with other ``transfer`` settings or another ``stats`` (what is not given is kept)."""
        return Client(
            self.config,
            self.retry,
            transfer=self.transfer if transfer is None else transfer,
            stats=self.stats if stats is None else stats,
        )

    @classmethod
    def reading_as(cls, context: RequestContext) -> Client:
        """A handle that reads as ``context`` does (endpoint, retry, part size), counting anew: what a stream
        pickles as, to read on in another process."""
        return cls(context.session.config, context.retry, transfer=TransferConfig(part_size=context.part_size))

    def call_context(self) -> RequestContext:
        """A request context for one single call (a verb of :mod:`.objects`): the default concurrency slots,
        not counted in ``stats``."""
        return new_context(self.config, _CONTROL, self.retry, LoadStats())

    def run(self, verb: Callable[Concatenate[RequestContext, P], Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the coroutine verb ``verb(context, *args, **kwargs)`` on the I/O loop, as a single call, and wait
        for it."""
        return run(verb(self.call_context(), *args, **kwargs))  # type: ignore[arg-type]

    def list_page(self, bucket: str, params: dict[str, Any], *, url: str) -> dict[str, Any]:
        """One page of the bucket's listing for the query ``params``."""
        return self.run(objects.list_page, bucket, params, url=url)

    def bucket(self, bucket: str, fields: str) -> dict[str, Any]:
        """The bucket's settings, trimmed to ``fields``."""
        return self.run(objects.bucket_resource, bucket, fields)

    def head(
        self, bucket: str, name: str, fields: str | None, *, generation: int | None = None, missing_ok: bool = True
    ) -> dict[str, Any] | None:
        """The object's metadata trimmed to ``fields`` (``None``: all but its ACL); ``None`` if it does not
        exist (``NotFoundError`` unless ``missing_ok``)."""
        return self.run(objects.object_resource, bucket, name, fields, generation=generation, missing_ok=missing_ok)

    def read(self, bucket: str, name: str) -> bytes | None:
        """A small object's bytes, checked; ``None`` if it does not exist."""
        return self.run(objects.read_object, bucket, name)

    def create(
        self,
        bucket: str,
        name: str,
        data: bytes,
        *,
        if_generation_match: int | None = None,
        content_type: str = "application/octet-stream",
        storage_class: str | None = None,
        fields: Mapping[str, Any] | None = None,
        kms_key_name: str | None = None,
    ) -> int:
        """Write ``data`` as ``name`` in one request (retried only with ``if_generation_match``), in
        ``storage_class`` if given, else the bucket's default, with the resource ``fields`` given, encrypted
        by ``kms_key_name`` if given; the new generation."""
        return self.run(
            objects.create_object,
            bucket,
            name,
            data,
            if_generation_match=if_generation_match,
            content_type=content_type,
            storage_class=storage_class,
            fields=fields,
            kms_key_name=kms_key_name,
        )

    def live_generation(self, bucket: str, name: str) -> int:
        """The live object's generation, 0 if there is none (what replacing it is made conditional on)."""
        return self.run(objects.live_generation, bucket, name)

    def compose(
        self, bucket: str, name: str, sources: Sequence[tuple[str, int | None]], *, if_generation_match: int | None
    ) -> ObjectInfo:
        """Concatenate ``sources`` into ``name`` in one compose call, if ``name`` is at ``if_generation_match``."""
        return self.run(objects.compose_object, bucket, name, sources, if_generation_match=if_generation_match)

    def delete(
        self, bucket: str, name: str, *, generation: int | None = None, if_generation_match: int | None = None
    ) -> bool:
        """Delete the live object or one version; ``False`` if it was already gone."""
        return self.run(
            objects.delete_object, bucket, name, generation=generation, if_generation_match=if_generation_match
        )


class ReaperTask:
    """What a reaper's task that sends requests holds: the client settings and the endpoint this process
    would use now (the emulator variable is part of that, as for its sessions)."""

    def __init__(self, config: ClientConfig, retry: RetryConfig) -> None:
        self.config = config
        self.retry = retry
        self.emulator = os.environ.get(EMULATOR_ENV)

    def client(self) -> Client:
        """A client, in the reaper, for that endpoint (the reaper's environment serves no one else)."""
        if self.emulator is None:
            os.environ.pop(EMULATOR_ENV, None)
        else:
            os.environ[EMULATOR_ENV] = self.emulator
        return Client(self.config, self.retry)
