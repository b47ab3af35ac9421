"""load_files_by_gcs against the embedded emulator (and a corrupting proxy in front of it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import pickle
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.engines.test_listing import AWKWARD_NAMES
from tests.http_proxy import RecordingProxy
from torchdata_gcs import (
    ClientConfig,
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    IntegrityError,
    InvalidURIError,
    MissingObjectWarning,
    NotFoundError,
    RetryConfig,
    TransferConfig,
    TransientError,
)
from torchdata_gcs._engines.download import as_stream, deliver_in_order, load_one
from torchdata_gcs._transport.context import ByteBudget, LoadStats, RequestContext, new_context
from torchdata_gcs._transport.loop import run
from torchdata_gcs.testing import Emulator, Fault, GCSFront

FAST_RETRY = RetryConfig(max_attempts=3, initial_delay=0.01, max_delay=0.05)


def read_all(pipe) -> list[tuple[str, bytes]]:
    return [(url, stream.read()) for url, stream in pipe]


def bytes_received_within(stats: LoadStats, expected: int, seconds: float) -> int:
    """``stats.bytes`` once it reaches ``expected``, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while stats.bytes < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return stats.bytes


def test_loads_every_object_bit_exact_in_input_order(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    objects = {f"o/{i:03d}": os.urandom(i * 997 % 50_000) for i in range(120)}
    gcs_emulator.seed(gcs_bucket, objects)
    urls = [f"gs://{gcs_bucket}/{name}" for name in sorted(objects, reverse=True)]
    loaded = read_all(GCSFileLoaderIterDataPipe(urls, client=client, transfer=TransferConfig(max_in_flight=8)))
    assert loaded == [(url, objects[url.split("/", 3)[3]]) for url in urls]


def test_chains_after_the_lister_with_metadata(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"m/a": b"alpha", "m/b": b"beta"})
    pipe = IterableWrapper([f"gs://{gcs_bucket}/m/"]).list_files_by_gcs(client=client, with_metadata=True)
    pipe = pipe.load_files_by_gcs(client=client)
    assert read_all(pipe) == [(f"gs://{gcs_bucket}/m/a", b"alpha"), (f"gs://{gcs_bucket}/m/b", b"beta")]
    streams = [stream for _, stream in GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/m/a"], client=client)]
    assert streams[0].seek(2) == 2 and streams[0].read() == b"pha"


def test_awkward_names_download(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {name: name.encode() * 3 for name in AWKWARD_NAMES})
    pipe = IterableWrapper([f"gs://{gcs_bucket}/"]).list_files_by_gcs(client=client).load_files_by_gcs(client=client)
    assert dict(read_all(pipe)) == {f"gs://{gcs_bucket}/{name}": name.encode() * 3 for name in AWKWARD_NAMES}


def test_missing_object_raises_naming_the_url(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"present": b"here"})
    missing = f"gs://{gcs_bucket}/absent #1"
    with pytest.raises(NotFoundError) as info:
        read_all(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/present", missing], client=client))
    assert info.value.url == missing and missing in str(info.value)


def test_missing_object_is_skipped_with_a_warning_when_asked(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    gcs_emulator.seed(gcs_bucket, {"a": b"1", "c": b"3"})
    urls = [f"gs://{gcs_bucket}/{name}" for name in "abc"]
    with pytest.warns(MissingObjectWarning, match=f"gs://{gcs_bucket}/b"):
        loaded = read_all(GCSFileLoaderIterDataPipe(urls, client=client, skip_missing=True))
    assert loaded == [(urls[0], b"1"), (urls[2], b"3")]


def test_object_overwritten_after_listing_fails_loudly(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    gcs_emulator.seed(gcs_bucket, {"v": b"version one"})
    listed = list(IterableWrapper([f"gs://{gcs_bucket}/v"]).list_files_by_gcs(client=client, with_metadata=True))
    gcs_emulator.upload(gcs_bucket, "v", b"version two!")
    with pytest.raises(NotFoundError, match=r"generation \d+ no longer exists") as info:
        read_all(GCSFileLoaderIterDataPipe(listed, client=client))
    assert info.value.url == f"gs://{gcs_bucket}/v"
    assert read_all(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/v"], client=client))[0][1] == b"version two!"


def test_corrupted_download_raises_integrity_error(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"payload": b"precious bytes" * 100})
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        proxy.corrupt_downloads = True
        pipe = GCSFileLoaderIterDataPipe(
            [f"gs://{gcs_bucket}/payload"], client=ClientConfig(endpoint=proxy.endpoint), retry=FAST_RETRY
        )
        with pytest.raises(IntegrityError, match="crc32c"):
            read_all(pipe)
        media_gets = [path for method, path, _ in proxy.requests if "alt=media" in path]
        assert len(media_gets) == FAST_RETRY.max_attempts  # retried, then refused to deliver bad bytes
        proxy.corrupt_downloads = False
        assert read_all(pipe) == [(f"gs://{gcs_bucket}/payload", b"precious bytes" * 100)]


def test_throttling_and_server_errors_are_retried_over_http(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"r/a": b"first", "r/b": b"second"})
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        client = ClientConfig(endpoint=proxy.endpoint)
        proxy.fail_next = [429, 503]  # the list request, then its retry
        listed = list(IterableWrapper([f"gs://{gcs_bucket}/r/"]).list_files_by_gcs(client=client, retry=FAST_RETRY))
        proxy.fail_next = [500, 429]
        pipe = GCSFileLoaderIterDataPipe(
            listed, client=client, retry=FAST_RETRY, transfer=TransferConfig(max_in_flight=1)
        )
        assert read_all(pipe) == [(f"gs://{gcs_bucket}/r/a", b"first"), (f"gs://{gcs_bucket}/r/b", b"second")]
        assert len(proxy.requests) == 3 + 4  # list: 2 refused + 1; media: 2 refused + 2
        proxy.fail_next = [503] * 10_000  # until the deadline, however many attempts that takes
        with pytest.raises(TransientError) as info:
            read_all(GCSFileLoaderIterDataPipe(listed[:1], client=client, retry=replace(FAST_RETRY, deadline=0.5)))
        assert info.value.status == 503 and info.value.url == f"gs://{gcs_bucket}/r/a"


def test_objects_larger_than_the_buffer_still_load(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    objects = {f"big/{i}": os.urandom(300_000) for i in range(6)}
    gcs_emulator.seed(gcs_bucket, objects)
    transfer = TransferConfig(max_in_flight=4, max_buffered_bytes=100_000)
    pipe = GCSFileLoaderIterDataPipe(
        [f"gs://{gcs_bucket}/{n}" for n in sorted(objects)], client=client, transfer=transfer
    )
    assert [data for _, data in read_all(pipe)] == [objects[n] for n in sorted(objects)]


def test_the_next_object_downloads_while_the_consumer_holds_the_last(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    """Budget freed by a delivery reaches the I/O loop at once: the consumer working on one object
    (and asking for nothing) does not hold up the download of the next one."""
    objects = {f"held/{i}": os.urandom(600_000) for i in range(3)}
    gcs_emulator.seed(gcs_bucket, objects)
    transfer = TransferConfig(max_in_flight=4, max_buffered_bytes=500_000)  # room for the oldest object alone
    pipe = GCSFileLoaderIterDataPipe(
        [f"gs://{gcs_bucket}/held/{i}" for i in range(3)], client=client, transfer=transfer
    )
    iterator = iter(pipe)
    _, stream = next(iterator)
    received = bytes_received_within(pipe.stats, 1_200_000, seconds=10)  # the consumer is busy with the first
    assert received >= 1_200_000, "the second object waited for the consumer to ask for it"
    assert [stream.read(), *(s.read() for _, s in iterator)] == [objects[f"held/{i}"] for i in range(3)]


def test_the_window_downloads_while_the_consumer_holds_an_object_that_finished_early(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    """The first object can finish before the consumer has handed the rest of the window to the I/O loop
    (on a busy machine the consumer's thread waits for a core; here the source is slow to give the next
    URL): the consumer still hands the window over before it gives out the object, so the rest of the
    window downloads while the object is held."""
    objects = {f"early/{i}": os.urandom(100_000) for i in range(4)}
    gcs_emulator.seed(gcs_bucket, objects)
    urls = [f"gs://{gcs_bucket}/{name}" for name in objects]

    def slow_source() -> Iterator[str]:
        yield urls[0]
        bytes_received_within(pipe.stats, 100_000, seconds=10)
        run(asyncio.sleep(0))  # the I/O loop has settled the first object's result too
        yield from urls[1:]

    source = IterableWrapper(slow_source(), deepcopy=False)
    pipe = GCSFileLoaderIterDataPipe(source, client=client, transfer=TransferConfig(max_in_flight=4))
    iterator = iter(pipe)
    _, stream = next(iterator)
    received = bytes_received_within(pipe.stats, 400_000, seconds=5)  # the consumer is busy with the first
    assert received == 400_000, "objects within the window waited for the consumer to ask for them"
    assert [stream.read(), *(s.read() for _, s in iterator)] == list(objects.values())


def test_budget_given_back_reaches_a_read_that_starts_waiting_while_the_consumer_holds_an_object(
    gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig
) -> None:
    """The consumer gives an object's budget back as it takes the object; a read that finds no room
    only afterwards, while the consumer works on that object, gets the room without waiting for the
    consumer to come back."""
    small, large = os.urandom(100_000), os.urandom(950_000)  # the large one fits once the small one is out
    gcs_emulator.seed(gcs_bucket, {"given/small": small, "given/large": large})
    context = new_context(client, TransferConfig(max_buffered_bytes=1_000_000), RetryConfig(), LoadStats())
    holding: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def large_once_the_small_is_held(context: RequestContext, seq: int) -> tuple[list[Any], int]:
        await asyncio.wrap_future(holding)
        return await load_one(f"gs://{gcs_bucket}/given/large", None, context, seq)

    units = [functools.partial(load_one, f"gs://{gcs_bucket}/given/small", None), large_once_the_small_is_held]
    delivered = deliver_in_order(units, context, window_size=2, skip_missing=False)  # the large one is on the loop
    try:
        small_stream = as_stream(*next(delivered))
        holding.set_result(None)  # the consumer holds the small object; the large one's read starts
        received = bytes_received_within(context.stats, 1_050_000, seconds=5)
        assert received == 1_050_000, "the large object waited for budget the consumer had given back"
        assert [small_stream.read(), as_stream(*next(delivered)).read()] == [small, large]
    finally:
        delivered.close()


def test_byte_budget_bounds_what_waits_ahead_of_the_consumer() -> None:
    async def scenario() -> None:
        budget = ByteBudget(limit=100)
        await budget.acquire(30, seq=1)  # answers come out of order: the oldest (0) has not asked yet
        await budget.acquire(30, seq=2)
        fourth = asyncio.ensure_future(budget.acquire(30, seq=3))
        await asyncio.sleep(0.05)
        assert not fourth.done()  # 90 bytes would fit, but not with room for the oldest as large as those
        await asyncio.wait_for(budget.acquire(30, seq=0), 5)  # the oldest takes that room: 90, within the limit
        assert budget.give_back(60, delivered=2)  # the fourth waits: the consumer wakes it
        budget.wake()
        await asyncio.wait_for(fourth, 5)
        await asyncio.wait_for(budget.acquire(500, seq=2), 5)  # the oldest never waits, even past the limit
        assert not budget.give_back(560, delivered=4)  # no read waits: no wake...
        # ...the next read that needs room counts it; a share over the limit keeps no room: 70 + 30 kept
        await asyncio.wait_for(budget.acquire(70, seq=5), 5)

    asyncio.run(scenario())


def test_early_stop_stops_downloading(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {f"s/{i}": os.urandom(20_000) for i in range(40)})
    with GCSFront(gcs_emulator.endpoint, latency=0.05) as front:
        transfer = TransferConfig(max_in_flight=4, max_buffered_bytes=30_000)
        urls = [f"gs://{gcs_bucket}/s/{i}" for i in range(40)]
        iterator = iter(GCSFileLoaderIterDataPipe(urls, client=front.client_config, transfer=transfer))
        next(iterator)
        iterator.close()
        time.sleep(0.2)  # requests already sent may finish
        sent = front.counts["get"]
        time.sleep(0.3)
        assert front.counts["get"] == sent < 20


def test_bad_items_raise_typed_errors(client: ClientConfig) -> None:
    with pytest.raises(InvalidURIError):
        GCSFileLoaderIterDataPipe(["gs://bucket-ok/"], client=client)  # a prefix, not an object
    with pytest.raises(InvalidURIError):
        GCSFileLoaderIterDataPipe([("gs://bucket-ok/x", {"size": 1})], client=client)  # type: ignore[list-item]
    with pytest.raises(InvalidURIError):
        read_all(IterableWrapper(["http://example.com/x"]).load_files_by_gcs(client=client))


def test_pickles_and_reports_length(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    gcs_emulator.seed(gcs_bucket, {"p": b"pickled"})
    pipe = GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/p"], client=client)
    assert len(pipe) == 1
    assert read_all(pickle.loads(pickle.dumps(pipe))) == [(f"gs://{gcs_bucket}/p", b"pickled")]
    with pytest.raises(TypeError):
        len(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/p"], client=client, skip_missing=True))


def test_large_objects_are_read_as_ranges_and_reassembled(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {f"large/{i}": os.urandom(700_000 + i * 99_991) for i in range(3)}
    gcs_emulator.seed(gcs_bucket, objects)
    transfer = TransferConfig(part_size=256 * 1024)
    with GCSFront(gcs_emulator.endpoint) as front:
        for with_metadata in (False, True):  # size unknown (learnt from the first answer), or listed
            front.reset_counts()
            listed = GCSFileListerIterDataPipe(
                f"gs://{gcs_bucket}/large/", client=front.client_config, with_metadata=with_metadata
            )
            pipe = GCSFileLoaderIterDataPipe(listed, client=front.client_config, transfer=transfer)
            assert [data for _, data in read_all(pipe)] == [objects[name] for name in sorted(objects)]
            assert (
                front.counts["range_get"] >= sum(-(-len(data) // transfer.part_size) for data in objects.values()) - 3
            )


def test_an_object_larger_than_the_buffer_streams_and_is_checked_at_its_end(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    gcs_emulator.seed(gcs_bucket, {"huge": data, "after": b"next"})
    transfer = TransferConfig(part_size=256 * 1024, max_buffered_bytes=1024 * 1024)
    urls = [f"gs://{gcs_bucket}/huge", f"gs://{gcs_bucket}/after"]
    pipe = GCSFileLoaderIterDataPipe(urls, client=gcs_emulator.client_config, transfer=transfer)
    (_, stream), (_, next_stream) = list(pipe)  # the stream reads on; the next object is loaded
    assert [stream.read(1000) for _ in range(2)] == [data[:1000], data[1000:2000]]
    assert stream.read() == data[2000:] and next_stream.read() == b"next"
    with RecordingProxy(gcs_emulator.endpoint) as proxy:
        proxy.corrupt_downloads = True
        pipe = GCSFileLoaderIterDataPipe(
            urls[:1], client=ClientConfig(endpoint=proxy.endpoint), transfer=transfer, retry=FAST_RETRY
        )
        ((_, corrupted),) = list(pipe)
        with pytest.raises(IntegrityError, match="crc32c"):
            corrupted.read()


def test_an_object_overwritten_during_a_ranged_read_fails_loudly(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    gcs_emulator.seed(gcs_bucket, {"moving": os.urandom(1_000_000)})
    listed = list(
        GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/moving", client=gcs_emulator.client_config, with_metadata=True)
    )
    gcs_emulator.upload(gcs_bucket, "moving", os.urandom(1_000_000))
    pipe = GCSFileLoaderIterDataPipe(
        listed, client=gcs_emulator.client_config, transfer=TransferConfig(part_size=256 * 1024)
    )
    with pytest.raises(NotFoundError, match="no longer exists"):
        read_all(pipe)


def test_stats_count_requests_and_bytes(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    objects = {f"st/{i}": os.urandom(1000 + i) for i in range(10)}
    gcs_emulator.seed(gcs_bucket, objects)
    pipe = GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/{name}" for name in sorted(objects)], client=client)
    read_all(pipe)
    stats = pipe.stats
    assert (stats.requests, stats.objects, stats.bytes, stats.retries) == (10, 10, sum(map(len, objects.values())), 0)
    assert stats.wait_seconds > 0


def test_loads_from_inside_a_running_event_loop(gcs_emulator: Emulator, gcs_bucket: str, client: ClientConfig) -> None:
    """As in a notebook, whose kernel runs an asyncio loop: ours runs on its own thread."""
    gcs_emulator.seed(gcs_bucket, {"nb": b"notebook"})

    async def cell() -> list[tuple[str, bytes]]:
        return read_all(GCSFileLoaderIterDataPipe([f"gs://{gcs_bucket}/nb"], client=client))

    assert asyncio.run(cell()) == [(f"gs://{gcs_bucket}/nb", b"notebook")]


def test_a_stream_stays_readable_once_its_pair_is_dropped(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    """``next(it)[1].read()`` binds the read of the stream inside torch's StreamWrapper and drops the
    pair and the wrapper before calling it: the stream must not be closed by then, whatever its kind."""
    objects = {"small": b"tiny", "parts": os.urandom(700_000), "streamed": os.urandom(1_500_000)}
    gcs_emulator.seed(gcs_bucket, objects)
    transfer = TransferConfig(part_size=256 * 1024, max_buffered_bytes=1024 * 1024)
    for name, data in objects.items():
        pipe = GCSFileLoaderIterDataPipe(
            [f"gs://{gcs_bucket}/{name}"], client=gcs_emulator.client_config, transfer=transfer
        )
        got = next(iter(pipe))[1].read()  # outside assert, whose rewriting would keep the pair alive
        assert got == data, name


def test_hold_until_verified_hands_out_no_byte_before_the_whole_object_checks_out(
    gcs_emulator: Emulator, gcs_bucket: str, gcs_front: GCSFront
) -> None:
    """An object four times the byte budget, its first range damaged: streamed (the default), damaged
    bytes are handed out before the IntegrityError; held until verified, the damage is read again and
    only the right bytes come out, and damage that persists raises before any byte is handed out."""
    data = os.urandom(4 * 1024 * 1024)
    gcs_emulator.seed(gcs_bucket, {"big": data})
    listed = list(
        GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/big", client=gcs_front.client_config, with_metadata=True)
    )
    streamed = TransferConfig(part_size=256 * 1024, max_buffered_bytes=1024 * 1024)
    held = TransferConfig(part_size=256 * 1024, max_buffered_bytes=1024 * 1024, hold_until_verified=True)

    gcs_front.set_faults([Fault("corrupt", match="range_get", times=1)])
    ((_, stream),) = list(GCSFileLoaderIterDataPipe(listed, client=gcs_front.client_config, transfer=streamed))
    handed_out = b""
    with pytest.raises(IntegrityError, match="crc32c"):
        while piece := stream.read(256 * 1024):
            handed_out += piece
    assert len(handed_out) == len(data) and handed_out != data  # every byte out, damaged ones among them

    gcs_front.set_faults([Fault("corrupt", match="range_get", times=1)])
    pipe = GCSFileLoaderIterDataPipe(listed, client=gcs_front.client_config, transfer=held, retry=FAST_RETRY)
    ((_, stream),) = list(pipe)
    assert stream.read() == data and pipe.stats.retries == 1  # read again whole, then handed out

    gcs_front.set_faults([Fault("corrupt", match="range_get")])
    with pytest.raises(IntegrityError, match="crc32c"):
        next(iter(GCSFileLoaderIterDataPipe(listed, client=gcs_front.client_config, transfer=held, retry=FAST_RETRY)))
