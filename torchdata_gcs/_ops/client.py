"""The client: :class:`GCSClient`, the one public handle (settings, retry policy, transfer settings and
transport, with the endpoint resolved once), and :class:`Client`, what a front-end object makes of it (plus
its statistics), making the request context of each iteration (the :class:`RequestContext` every verb of
this layer takes), with the single-request verbs of :mod:`.objects` as blocking methods and any coroutine
as one call (run on the process's I/O loop, like every request); and what a reaper's task keeps to build
one in the reaper."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from .._transport.context import LoadStats, RequestContext, new_context
from .._transport.deadline import call_deadline
from .._transport.loop import on_io_loop, run
from .._transport.session import Destination, Session, session_for
from .._transport.transport import Transport
from ..config import ClientConfig, RetryConfig, TransferConfig
from . import objects
from .checksums import ObjectInfo

__all__ = ["Client", "GCSClient", "ReaperTask", "RequestContext"]

P = ParamSpec("P")
T = TypeVar("T")

_CONTROL = TransferConfig()  # single requests: the default concurrency slots and budget are never reached


class GCSClient:
    """The one handle to GCS that every front end takes as ``client=``: where requests go and how they
    authenticate (``config``), how long a call keeps trying (``retry``), how much is in flight and read
    ahead (``transfer``), and what carries the requests (``transport``: the library's own unless given, a
    ``torchdata_gcs._transport.transport.Transport``; say, one in memory for tests).

    The endpoint is resolved when the client is made (``config.endpoint``, else ``STORAGE_EMULATOR_HOST``,
    else GCS) and goes with the client into worker processes. A client holds settings only: it pickles
    (with its transport, if that pickles), and each process opens its own connections.

    Examples:
        >>> from torchdata_gcs import GCSClient, GCSMapDataset, RetryConfig
        >>> from torchdata_gcs.testing import Emulator
        >>> with Emulator() as emulator:
        ...     emulator.seed("demo", {"a.txt": b"hello"})
        ...     client = GCSClient(emulator.client_config, retry=RetryConfig(deadline=60))
        ...     GCSMapDataset("gs://demo/", transform=lambda stream: stream.read(), client=client)[0]
        b'hello'
    """

    __slots__ = ("destination", "retry", "transfer")

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        retry: RetryConfig | None = None,
        transfer: TransferConfig | None = None,
        transport: Transport | None = None,
    ) -> None:
        for name, value, kind in (("config", config, ClientConfig), ("retry", retry, RetryConfig)):
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
        if transfer is not None and not isinstance(transfer, TransferConfig):
            raise TypeError(f"transfer must be a TransferConfig, got {type(transfer).__name__}")
        self.destination = Destination.of(config or ClientConfig(), transport)
        self.retry = retry or RetryConfig()
        self.transfer = transfer or TransferConfig()

    @property
    def config(self) -> ClientConfig:
        return self.destination.config

    @property
    def endpoint(self) -> str:
        """The base URL requests go to, as resolved when the client was made."""
        return self.destination.endpoint

    @property
    def transport(self) -> Transport | None:
        return self.destination.transport

    def replace(self, *, retry: RetryConfig | None = None, transfer: TransferConfig | None = None) -> GCSClient:
        """This client with another ``retry`` or ``transfer`` (what is not given is kept; the endpoint too)."""
        if retry is None and transfer is None:
            return self
        return _client(self.destination, retry or self.retry, transfer or self.transfer)

    def __repr__(self) -> str:  # all of it: fsspec tells its cached filesystems apart by their arguments' text
        transport = "" if self.transport is None else f", transport={self.transport!r}"
        return f"GCSClient({self.config!r}, retry={self.retry!r}, transfer={self.transfer!r}{transport})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GCSClient) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash(self.__getstate__())

    def __getstate__(self) -> tuple[Destination, RetryConfig, TransferConfig]:
        return self.destination, self.retry, self.transfer

    def __setstate__(self, state: tuple[Destination, RetryConfig, TransferConfig]) -> None:
        self.destination, self.retry, self.transfer = state


def _client(destination: Destination, retry: RetryConfig, transfer: TransferConfig) -> GCSClient:
    """A client for a destination already resolved."""
    client = GCSClient.__new__(GCSClient)
    client.__setstate__((destination, retry, transfer))
    return client


def client_of(
    client: GCSClient | ClientConfig | None, retry: RetryConfig | None = None, transfer: TransferConfig | None = None
) -> GCSClient:
    """What a front end was given, as one client: a ``GCSClient`` (with ``retry`` or ``transfer`` in place of its
    own where given), or a ``ClientConfig`` (``None``: the default) made into one with ``retry`` and ``transfer``."""
    if isinstance(client, GCSClient):
        return client.replace(retry=retry, transfer=transfer)
    if client is None or isinstance(client, ClientConfig):
        return GCSClient(client, retry=retry, transfer=transfer)
    raise TypeError(f"client must be a GCSClient or a ClientConfig, got {type(client).__name__}")


class Client:
    """One front-end object's way to GCS: a :class:`GCSClient`'s destination, ``transfer`` settings and
    ``retry`` policy, and ``stats``. :meth:`context` makes each iteration's request context, which counts
    into ``stats``; the blocking verbs (list a page, head, read, create, compose, delete) are each retried
    under ``retry`` and not counted.

    A handle is cheap and holds only settings and counts: it finds this process's :class:`Session` on each
    call, so it pickles and may be kept across a fork. It must not be used from the I/O loop's own thread.
    """

    def __init__(
        self,
        client: GCSClient | ClientConfig | Destination | None,
        retry: RetryConfig | None = None,
        *,
        transfer: TransferConfig | None = None,
        stats: LoadStats | None = None,
    ) -> None:
        if isinstance(client, Destination):
            self.destination, self.retry, self.transfer = client, retry or RetryConfig(), transfer or TransferConfig()
        else:
            gcs = client_of(client, retry, transfer)
            self.destination, self.retry, self.transfer = gcs.destination, gcs.retry, gcs.transfer
        self.stats = LoadStats() if stats is None else stats

    def __repr__(self) -> str:
        return f"Client({self.destination.endpoint!r})"

    @property
    def config(self) -> ClientConfig:
        return self.destination.config

    @property
    def session(self) -> Session:
        """This process's session for the handle's destination."""
        return session_for(self.destination)

    def context(self) -> RequestContext:
        """A fresh request context for one iteration (its own byte budget and slots), counting into ``stats``."""
        return new_context(self.destination, self.transfer, self.retry, self.stats)

    def replace(self, *, transfer: TransferConfig | None = None, stats: LoadStats | None = None) -> Client:
        """This handle with other ``transfer`` settings or another ``stats`` (what is not given is kept)."""
        return Client(
            self.destination,
            self.retry,
            transfer=self.transfer if transfer is None else transfer,
            stats=self.stats if stats is None else stats,
        )

    @classmethod
    def reading_as(cls, context: RequestContext) -> Client:
        """A handle that reads as ``context`` does (destination, retry, part size), counting anew: what a stream
        pickles as, to read on in another process."""
        return cls(context.session.destination, context.retry, transfer=TransferConfig(part_size=context.part_size))

    def call_context(self) -> RequestContext:
        """A request context for one single call (a verb of :mod:`.objects`): the default concurrency slots,
        not counted in ``stats``."""
        return new_context(self.destination, _CONTROL, self.retry, LoadStats())

    def run(self, verb: Callable[Concatenate[RequestContext, P], Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the coroutine verb ``verb(context, *args, **kwargs)`` on the I/O loop, as a single call, and wait
        for it."""
        return run(verb(self.call_context(), *args, **kwargs))  # type: ignore[arg-type]  # a verb is a coroutine function, typed as returning an Awaitable

    async def call(self, work: Coroutine[Any, Any, T], *, one_call: bool = True) -> T:
        """Await ``work`` on the I/O loop, where this process's sessions live, from whichever event loop awaits
        this: as one call, which ``retry.deadline`` bounds as a whole, unless not ``one_call`` (a call that may
        send any number of requests, each then under its own deadline)."""
        with call_deadline(self.retry) if one_call else contextlib.nullcontext():
            return await on_io_loop(work)

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
    """What a reaper's task that sends requests holds: the destination its requests went to (over the
    library's own transport: the reaper is a process of its own) and the retry policy."""

    def __init__(self, client: Client) -> None:
        self.destination = client.destination.without_transport()
        self.retry = client.retry

    def client(self) -> Client:
        """A client, in the reaper, for that destination."""
        return Client(self.destination, self.retry)
