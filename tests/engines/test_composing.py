"""compose_shards_by_gcs against the emulator, through the GCS front where GCS's semantics matter."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import google_crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from torchdata_gcs import (
    ClientConfig,
    ComposeFallbackWarning,
    GCSShardComposerIterDataPipe,
    InvalidURIError,
    MissingObjectWarning,
    NotFoundError,
    ObjectInfo,
    RetryConfig,
    TransferConfig,
)
from torchdata_gcs._engines import compose
from torchdata_gcs._ops.checksums import crc32c_of_concatenation
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.testing import Emulator, Fault, GCSFront

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"\n#+\nWARNING!\nThe 'datapipes', 'dataloader2'", category=UserWarning)
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

FAST_RETRY = RetryConfig(initial_delay=0.01, max_delay=0.05)


def seed(emulator: Emulator, bucket: str, count: int, prefix: str = "d/") -> dict[str, bytes]:
    """``count`` objects of varied sizes (some empty); returns url -> bytes."""
    objects = {f"{prefix}{i:04d}.bin": (f"object {i};".encode() * (i % 13)) for i in range(count)}
    emulator.seed(bucket, objects)
    return {f"gs://{bucket}/{name}": data for name, data in objects.items()}


def listed(bucket: str, client: ClientConfig, prefix: str = "d/"):
    return IterableWrapper([f"gs://{bucket}/{prefix}"]).list_files_by_gcs(client=client, with_metadata=True)


def read_all(pipe) -> list[tuple[str, bytes]]:
    return [(url, stream.read()) for url, stream in pipe]


def temporary(emulator: Emulator, bucket: str) -> list[str]:
    return [name for name in emulator.names(bucket) if name.startswith(TEMPORARY_PREFIX)]


def wait_until_gone(emulator: Emulator, bucket: str, seconds: float = 30) -> None:
    """The temporary composites of a process that ended are deleted by its reaper right after: poll."""
    deadline = time.monotonic() + seconds
    while temporary(emulator, bucket):
        assert time.monotonic() < deadline, f"temporary composites left: {temporary(emulator, bucket)}"
        time.sleep(0.1)


def decode(item):
    url, stream = item
    return url, stream.read()


def failing_decode(item):
    raise ValueError("a bad sample")


def test_in_order_bit_exact_with_few_requests(gcs_emulator: Emulator) -> None:
    expected = seed(gcs_emulator, "compose-basic", 200)
    with GCSFront(gcs_emulator.endpoint) as front:
        pipe = listed("compose-basic", front.client_config).compose_shards_by_gcs(client=front.client_config)
        before = dict(front.counts)
        delivered = read_all(pipe)
        counts = {kind: front.counts[kind] - before.get(kind, 0) for kind in front.counts}
    assert delivered == list(expected.items())
    groups = -(-200 // 32)
    assert pipe.stats.composes == counts["compose"] == groups
    assert counts["get"] == groups  # one read per composite, none per object
    assert counts["delete"] == groups + 1  # each composite, and the permission probe
    assert counts["upload"] == 1  # the probe
    assert pipe.stats.objects == 200
    assert temporary(gcs_emulator, "compose-basic") == []


def test_the_bucket_is_prepared_while_plain_urls_are_described(gcs_emulator: Emulator) -> None:
    """The permission probe and the reuse listing run beside the metadata requests, not before them
    on the consumer's thread: with 50 ms per request, every metadata request is on its way before the
    probe's create has been answered and its delete sent."""
    expected = seed(gcs_emulator, "compose-prepare", 40)
    with GCSFront(gcs_emulator.endpoint, latency=0.05, record=True) as front:
        pipe = IterableWrapper(list(expected)).compose_shards_by_gcs(
            client=front.client_config, reuse_prefix="cache/kept/"
        )
        assert read_all(pipe) == list(expected.items())
        kinds = [(request.method, request.target) for request in front.recorded]
    probe_delete = next(i for i, (method, target) in enumerate(kinds) if method == "DELETE" and "probe" in target)
    described = [
        i
        for i, (method, target) in enumerate(kinds)
        if method == "GET" and "/o/d%2F" in target and "alt=media" not in target
    ]
    assert len(described) == 40 and max(described) < probe_delete
    assert pipe.stats.composes == 2


def test_groups_respect_size_limit_buckets_and_large_objects(gcs_emulator: Emulator) -> None:
    small = seed(gcs_emulator, "compose-mixed-a", 6)
    large = {"gs://compose-mixed-a/big.bin": os.urandom(50_000)}
    gcs_emulator.seed("compose-mixed-a", {"big.bin": large["gs://compose-mixed-a/big.bin"]})
    other = seed(gcs_emulator, "compose-mixed-b", 5)
    items = [*small, "gs://compose-mixed-a/big.bin", *other]  # plain URLs: metadata is fetched
    expected = {**small, **large, **other}
    with GCSFront(gcs_emulator.endpoint) as front:
        pipe = GCSShardComposerIterDataPipe(
            items, max_sources=4, max_composite_bytes=20_000, client=front.client_config
        )
        delivered = read_all(pipe)
        assert front.counts["metadata"] == len(items)
    assert delivered == [(url, expected[url]) for url in items]
    # bucket a: 6 small -> 4 + 2; big.bin (over the limit) alone; bucket b: 5 -> 4 + 1 (one is read directly)
    assert pipe.stats.composes == 3
    assert temporary(gcs_emulator, "compose-mixed-a") == temporary(gcs_emulator, "compose-mixed-b") == []


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_exactly_once_through_dataloader2(gcs_emulator: Emulator, start_method: str) -> None:
    expected = seed(gcs_emulator, "compose-dl2", 500)
    client = gcs_emulator.client_config
    pipe = listed("compose-dl2", client).shuffle().sharding_filter().compose_shards_by_gcs(client=client).map(decode)
    loader = DataLoader2(
        pipe, reading_service=MultiProcessingReadingService(num_workers=2, multiprocessing_context=start_method)
    )
    try:
        for epoch in range(2):
            loader.seed(epoch)
            delivered = list(loader)
            counts = collections.Counter(url for url, _ in delivered)
            assert set(counts) == set(expected) and max(counts.values()) == 1
            assert all(data == expected[url] for url, data in delivered)
            assert [url for url, _ in delivered] != sorted(expected)  # shuffled
    finally:
        loader.shutdown()
    assert temporary(gcs_emulator, "compose-dl2") == []


def test_object_overwritten_after_listing(gcs_emulator: Emulator) -> None:
    expected = seed(gcs_emulator, "compose-changed", 40)
    with GCSFront(gcs_emulator.endpoint) as front:
        items = list(listed("compose-changed", front.client_config))
        gcs_emulator.upload("compose-changed", "d/0005.bin", b"new bytes")
        pipe = GCSShardComposerIterDataPipe(items, client=front.client_config, retry=FAST_RETRY)
        received = []
        with pytest.raises(NotFoundError, match="0005.bin generation .* no longer exists"):
            for url, stream in pipe:
                received.append((url, stream.read()))
        assert received == list(expected.items())[:5]  # never the new bytes, nothing after in order
        assert front.counts["compose"] == 2  # 32 + 8; the first refused by GCS's rules, then read directly

        skipping = GCSShardComposerIterDataPipe(items, client=front.client_config, skip_missing=True)
        with pytest.warns(MissingObjectWarning, match="0005.bin"):
            delivered = read_all(skipping)
    assert delivered == [(url, data) for url, data in expected.items() if not url.endswith("0005.bin")]
    assert temporary(gcs_emulator, "compose-changed") == []


def test_missing_plain_url(gcs_emulator: Emulator) -> None:
    expected = seed(gcs_emulator, "compose-missing", 3)
    items = [*expected, "gs://compose-missing/d/nope.bin"]
    pipe = GCSShardComposerIterDataPipe(items, client=gcs_emulator.client_config)
    with pytest.raises(NotFoundError):
        read_all(pipe)
    with pytest.warns(MissingObjectWarning):
        assert read_all(pipe.__class__(items, client=gcs_emulator.client_config, skip_missing=True)) == list(
            expected.items()
        )


def test_early_stop_and_exception_leave_nothing(gcs_emulator: Emulator) -> None:
    seed(gcs_emulator, "compose-stop", 400)
    with GCSFront(gcs_emulator.endpoint, latency=0.02) as front:
        pipe = listed("compose-stop", front.client_config).compose_shards_by_gcs(client=front.client_config)
        iterator = iter(pipe)
        for _ in range(3):
            next(iterator)
        assert pipe.stats.composes > 1
        iterator.close()  # what a `break` does to the generator
        assert temporary(gcs_emulator, "compose-stop") == []

        with pytest.raises(ValueError, match="a bad sample"):
            list(pipe.map(failing_decode))
        assert temporary(gcs_emulator, "compose-stop") == []


def test_worker_processes_stopped_mid_epoch_leave_nothing(gcs_emulator: Emulator) -> None:
    seed(gcs_emulator, "compose-shutdown", 600)
    with GCSFront(gcs_emulator.endpoint, latency=0.02) as front:
        client = front.client_config
        pipe = listed("compose-shutdown", client).sharding_filter().compose_shards_by_gcs(client=client).map(decode)
        iterator = iter(DataLoader(pipe, batch_size=None, num_workers=2))
        for _ in range(20):
            next(iterator)
        assert front.counts["compose"] > 0
        del iterator  # stops the workers mid-epoch
    assert temporary(gcs_emulator, "compose-shutdown") == []


SIGNALLED_CHILD = textwrap.dedent(
    """
    import sys, time
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata_gcs import ClientConfig
    client = ClientConfig(endpoint=sys.argv[1], anonymous=True)
    pipe = IterableWrapper([f"gs://{sys.argv[2]}/d/"]).list_files_by_gcs(client=client, with_metadata=True)
    for url, stream in pipe.compose_shards_by_gcs(client=client):
        print("got", url, flush=True)
        time.sleep(60)
    """
)


def killed(child: subprocess.Popen[str]) -> str:
    """What a child that went wrong wrote, once killed: reading its stderr alive would wait for its end."""
    child.kill()
    return child.communicate()[1]


def composites_appear(emulator: Emulator, bucket: str) -> None:
    deadline = time.monotonic() + 30
    while not temporary(emulator, bucket):
        assert time.monotonic() < deadline, "no temporary composite ever existed: the test would prove nothing"
        time.sleep(0.05)


def slow_deletes(emulator: Emulator) -> GCSFront:
    """A front whose first deletes of composites stall, so that composites are alive when a signal comes."""
    return GCSFront(
        emulator.endpoint,
        latency=0.05,
        faults=[Fault("stall", match=r"DELETE .*%2F\d{9}", stall_seconds=1.0, times=10)],
    )


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT], ids=["SIGTERM", "SIGKILL", "KeyboardInterrupt"]
)
def test_signals_leave_nothing(gcs_emulator: Emulator, signum: int) -> None:
    """SIGTERM and SIGKILL end the process at once (no handler) and its reaper deletes the composites
    right after; SIGINT raises KeyboardInterrupt in the consumer's loop, outside the DataPipe, and the
    composites are deleted at interpreter exit."""
    bucket = f"compose-signal-{signum}"
    seed(gcs_emulator, bucket, 600)
    with slow_deletes(gcs_emulator) as front:
        command = [sys.executable, "-c", SIGNALLED_CHILD, front.endpoint, bucket]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
            try:
                assert child.stdout is not None and child.stdout.readline().startswith("got "), killed(child)
                composites_appear(gcs_emulator, bucket)
                child.send_signal(signum)
                _, errors = child.communicate(timeout=60)
            finally:
                child.kill()
        assert child.returncode == -signum, errors
        wait_until_gone(gcs_emulator, bucket)


NATIVE_CHILD = textwrap.dedent(
    """
    import datetime, socket, sys, threading, time
    import torch.distributed as dist
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata_gcs import ClientConfig
    client = ClientConfig(endpoint=sys.argv[1], anonymous=True)
    pipe = IterableWrapper([f"gs://{sys.argv[2]}/d/"]).list_files_by_gcs(client=client, with_metadata=True)
    def consume():
        for url, stream in pipe.compose_shards_by_gcs(client=client):
            time.sleep(60)
    threading.Thread(target=consume, daemon=True).start()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=timeout, wait_for_workers=False)
    print("blocking", flush=True)
    # gloo waits for rank 1, which never comes, in native code that retries its wait on EINTR: a Python
    # signal handler would never run here
    dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=timeout)
    """
)


def test_sigterm_ends_a_process_blocked_in_native_code_and_its_composites_go(gcs_emulator: Emulator) -> None:
    bucket = "compose-native"
    seed(gcs_emulator, bucket, 600)
    with slow_deletes(gcs_emulator) as front:
        command = [sys.executable, "-c", NATIVE_CHILD, front.endpoint, bucket]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
            try:
                assert child.stdout is not None and child.stdout.readline() == "blocking\n", killed(child)
                composites_appear(gcs_emulator, bucket)
                time.sleep(1)  # the main thread is inside init_process_group by now
                child.send_signal(signal.SIGTERM)
                assert child.wait(timeout=5) == -signal.SIGTERM
            finally:
                child.kill()
                child.communicate()
        wait_until_gone(gcs_emulator, bucket)


HANDLER_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    def handler(signum, frame):
        print("handled", flush=True)
        sys.exit(3)
    if sys.argv[3] == "before":
        signal.signal(signal.SIGTERM, handler)
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata_gcs import ClientConfig
    if sys.argv[3] == "after":
        signal.signal(signal.SIGTERM, handler)
    client = ClientConfig(endpoint=sys.argv[1], anonymous=True)
    pipe = IterableWrapper([f"gs://{sys.argv[2]}/d/"]).list_files_by_gcs(client=client, with_metadata=True)
    for url, stream in pipe.compose_shards_by_gcs(client=client):
        print("mine" if signal.getsignal(signal.SIGTERM) is handler else "replaced", flush=True)
        time.sleep(60)
    """
)


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_users_sigterm_handler_stays_and_runs(gcs_emulator: Emulator, when: str) -> None:
    """A preemption handler set before or after importing us is still the handler while composing, runs
    on SIGTERM, and the process ends its way; the composites are deleted still."""
    bucket = f"compose-handler-{when}"
    seed(gcs_emulator, bucket, 600)
    with slow_deletes(gcs_emulator) as front:
        command = [sys.executable, "-c", HANDLER_CHILD, front.endpoint, bucket, when]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
            try:
                assert child.stdout is not None and child.stdout.readline() == "mine\n", killed(child)
                composites_appear(gcs_emulator, bucket)
                child.send_signal(signal.SIGTERM)
                output, errors = child.communicate(timeout=60)
            finally:
                child.kill()
        assert (child.returncode, output) == (3, "handled\n"), errors
        wait_until_gone(gcs_emulator, bucket)


DATALOADER2_CHILD = textwrap.dedent(
    """
    import multiprocessing, sys, time, warnings
    warnings.filterwarnings("ignore")
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService
    from torchdata_gcs import ClientConfig
    client = ClientConfig(endpoint=sys.argv[1], anonymous=True)
    pipe = (
        IterableWrapper([f"gs://{sys.argv[2]}/d/"]).list_files_by_gcs(client=client, with_metadata=True)
        .sharding_filter().compose_shards_by_gcs(client=client)
    )
    loader = DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2))  # default prefetch
    for number, (url, stream) in enumerate(loader):
        if number == 0:
            print(" ".join(str(worker.pid) for worker in multiprocessing.active_children()), flush=True)
        time.sleep(0.5)
    """
)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" not in status.read()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
@pytest.mark.parametrize("target", ["main", "workers", "group"])
def test_sigterm_to_dataloader2_leaves_nothing(gcs_emulator: Emulator, target: str) -> None:
    """The pipe runs on torchdata's prefetch thread inside each worker, not on a main thread; SIGTERM ends
    the workers at once, or, when it kills only their parent, they end themselves; either way their
    reapers delete their composites."""
    bucket = f"compose-dataloader2-{target}"
    seed(gcs_emulator, bucket, 600)
    with GCSFront(gcs_emulator.endpoint, latency=0.02) as front:
        command = [sys.executable, "-c", DATALOADER2_CHILD, front.endpoint, bucket]
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        ) as child:
            try:
                assert child.stdout is not None
                workers = [int(pid) for pid in child.stdout.readline().split()]
                assert len(workers) == 2, killed(child)
                deadline = time.monotonic() + 30
                while not temporary(gcs_emulator, bucket):
                    assert time.monotonic() < deadline, (
                        "no temporary composite ever existed: the test would prove nothing"
                    )
                    time.sleep(0.05)
                if target == "main":
                    child.send_signal(signal.SIGTERM)
                elif target == "workers":
                    for pid in workers:
                        os.kill(pid, signal.SIGTERM)
                else:
                    os.killpg(child.pid, signal.SIGTERM)
                deadline = time.monotonic() + 30
                while any(running(pid) for pid in workers):
                    assert time.monotonic() < deadline, "a worker outlived the signal"
                    time.sleep(0.1)
            finally:
                os.killpg(child.pid, signal.SIGKILL)  # torchdata 0.9's main process waits forever for killed workers
                child.communicate()
        wait_until_gone(gcs_emulator, bucket)


def test_no_permission_falls_back_with_one_warning(gcs_emulator: Emulator) -> None:
    expected = seed(gcs_emulator, "compose-denied", 70)
    with GCSFront(gcs_emulator.endpoint, faults=[Fault("http_403", match="upload")]) as front:
        pipe = listed("compose-denied", front.client_config).compose_shards_by_gcs(client=front.client_config)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            delivered = read_all(pipe)
        assert front.counts["compose"] == 0
        assert front.counts["get"] == 70
    fallbacks = [w for w in caught if issubclass(w.category, ComposeFallbackWarning)]
    assert len(fallbacks) == 1 and "compose-denied" in str(fallbacks[0].message)
    assert delivered == list(expected.items())


def test_reuse_across_epochs(gcs_emulator: Emulator) -> None:
    expected = seed(gcs_emulator, "compose-reuse", 100)
    with GCSFront(gcs_emulator.endpoint) as front:
        client = front.client_config
        pipe = listed("compose-reuse", client).compose_shards_by_gcs(client=client, reuse_prefix="cache/composites/")
        assert read_all(pipe) == list(expected.items())
        first = front.counts["compose"]
        assert first == pipe.stats.composes == 4
        kept = [name for name in gcs_emulator.names("compose-reuse") if name.startswith("cache/composites/")]
        assert len(kept) == 4

        assert read_all(pipe) == list(expected.items())  # epoch 2
        assert front.counts["compose"] == first and pipe.stats.reused == 4

        # Replaced kept composites (here by damaged bytes) are not the generations composed: composed again.
        for name in kept:
            gcs_emulator.upload("compose-reuse", name, b"x" * len(gcs_emulator.read("compose-reuse", name)))
        assert read_all(pipe) == list(expected.items())  # epoch 3
        assert front.counts["compose"] == first + 4 and pipe.stats.reused == 0

        # A changed source makes its group a new composite; the other groups are still reused.
        gcs_emulator.upload("compose-reuse", "d/0040.bin", b"changed")
        expected["gs://compose-reuse/d/0040.bin"] = b"changed"
        assert read_all(
            IterableWrapper(list(listed("compose-reuse", client))).compose_shards_by_gcs(
                client=client, reuse_prefix="cache/composites/"
            )
        ) == list(expected.items())  # epoch 4
        assert front.counts["compose"] == first + 5
        assert read_all(pipe) == list(expected.items())  # epoch 5: all kept again
        assert front.counts["compose"] == first + 5 and pipe.stats.reused == 4
    assert temporary(gcs_emulator, "compose-reuse") == []


def forged(size: int, crc32c: int) -> bytes:
    """Bytes of someone else's choosing, ``size`` of them, whose crc32c is ``crc32c``: the last four
    solve for it (a crc32c of a fixed length is affine in the bits, so that is 32 linear equations)."""
    head = (b"chosen by someone else; " * size)[: size - 4]
    base = google_crc32c.value(head + bytes(4))
    basis: dict[int, tuple[int, int]] = {}  # highest bit -> (crc difference, tail bits making it)
    for bit in range(32):
        difference, tail = google_crc32c.value(head + (1 << bit).to_bytes(4, "little")) ^ base, 1 << bit
        for top in sorted(basis, reverse=True):
            if difference >> top & 1:
                difference, tail = difference ^ basis[top][0], tail ^ basis[top][1]
        if difference:
            basis[difference.bit_length() - 1] = (difference, tail)
    wanted, tail = crc32c ^ base, 0
    for top in sorted(basis, reverse=True):
        if wanted >> top & 1:
            wanted, tail = wanted ^ basis[top][0], tail ^ basis[top][1]
    assert wanted == 0
    return head + tail.to_bytes(4, "little")


def test_a_kept_composite_replaced_with_the_same_size_and_crc32c_is_never_read(gcs_emulator: Emulator) -> None:
    """Whoever may write the reuse prefix may replace a kept composite with chosen bytes of the same size
    and crc32c: only the generation composed is read, and a replaced one is composed again in its place."""
    bucket = "compose-forged"
    expected = seed(gcs_emulator, bucket, 64)
    with GCSFront(gcs_emulator.endpoint) as front:
        client = front.client_config
        pipe = listed(bucket, client).compose_shards_by_gcs(client=client, reuse_prefix="cache/kept/")
        assert read_all(pipe) == list(expected.items())
        kept = [name for name in gcs_emulator.names(bucket) if name.startswith("cache/kept/")]
        assert len(kept) == 2
        for name in kept:
            data = gcs_emulator.read(bucket, name)
            replacement = forged(len(data), google_crc32c.value(data))
            assert replacement != data and google_crc32c.value(replacement) == google_crc32c.value(data)
            gcs_emulator.upload(bucket, name, replacement)
        composed = front.counts["compose"]

        started = time.monotonic()
        assert read_all(pipe) == list(expected.items())  # epoch 2: never the chosen bytes
        assert time.monotonic() - started < 30
        assert front.counts["compose"] == composed + 2 and pipe.stats.reused == 0
        assert all(b"chosen by someone else" not in gcs_emulator.read(bucket, name) for name in kept)
        assert read_all(pipe) == list(expected.items())  # epoch 3: the composites made again are reused
        assert front.counts["compose"] == composed + 2 and pipe.stats.reused == 2


def test_a_kept_composite_made_by_another_process_is_composed_again_before_it_is_read(
    gcs_emulator: Emulator,
) -> None:
    """A kept composite this process did not compose (an earlier job, another worker) may have been replaced
    meanwhile: it is composed again in its place, once, and reused from then on."""
    bucket = "compose-kept-elsewhere"
    expected = seed(gcs_emulator, bucket, 64)
    with GCSFront(gcs_emulator.endpoint) as front:
        client = front.client_config
        epoch = textwrap.dedent(f"""
            from torch.utils.data.datapipes.iter import IterableWrapper
            from torchdata_gcs import ClientConfig
            client = ClientConfig(endpoint={client.endpoint!r}, anonymous=True)
            pipe = IterableWrapper(["gs://{bucket}/d/"]).list_files_by_gcs(client=client, with_metadata=True)
            pipe = pipe.compose_shards_by_gcs(client=client, reuse_prefix="cache/kept/")
            assert len([stream.read() for _, stream in pipe]) == 64 and pipe.stats.composes == 2
        """)
        subprocess.run([sys.executable, "-c", epoch], check=True, timeout=120)
        assert front.counts["compose"] == 2
        pipe = listed(bucket, client).compose_shards_by_gcs(client=client, reuse_prefix="cache/kept/")
        assert read_all(pipe) == list(expected.items())
        assert front.counts["compose"] == 4 and pipe.stats.reused == 0
        assert read_all(pipe) == list(expected.items())
        assert front.counts["compose"] == 4 and pipe.stats.reused == 2


def test_reuse_with_order_changing_warns(gcs_emulator: Emulator) -> None:
    expected = seed(gcs_emulator, "compose-reuse-order", 64)
    client = gcs_emulator.client_config
    urls = list(expected)
    pipe = GCSShardComposerIterDataPipe(urls, client=client, reuse_prefix="kept/")
    read_all(pipe)
    with pytest.warns(ComposeFallbackWarning, match="same order"):
        read_all(GCSShardComposerIterDataPipe(urls[::-1], client=client, reuse_prefix="kept/"))


def test_listing_skips_temporary_objects(gcs_emulator: Emulator, client: ClientConfig) -> None:
    gcs_emulator.seed("compose-hidden", {"a.bin": b"a", f"{TEMPORARY_PREFIX}job/1": b"tmp"})
    assert list(IterableWrapper(["gs://compose-hidden/"]).list_files_by_gcs(client=client)) == [
        "gs://compose-hidden/a.bin"
    ]
    assert list(IterableWrapper([f"gs://compose-hidden/{TEMPORARY_PREFIX}"]).list_files_by_gcs(client=client)) == [
        f"gs://compose-hidden/{TEMPORARY_PREFIX}job/1"
    ]


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="max_sources"):
        GCSShardComposerIterDataPipe([], max_sources=33)
    with pytest.raises(ValueError, match="max_sources"):
        GCSShardComposerIterDataPipe([], max_sources=1)
    with pytest.raises(ValueError, match="max_composite_bytes"):
        GCSShardComposerIterDataPipe([], max_composite_bytes=0)
    with pytest.raises(InvalidURIError, match="reuse_prefix"):
        GCSShardComposerIterDataPipe([], reuse_prefix="cache")
    with pytest.raises(InvalidURIError, match="reuse_prefix"):
        GCSShardComposerIterDataPipe([], reuse_prefix=TEMPORARY_PREFIX + "x/")
    with pytest.raises(InvalidURIError):
        GCSShardComposerIterDataPipe(["gs://bucket/"])
    for storage_classes in ("STANDARD", ["standard"], [None]):
        with pytest.raises(ValueError, match="storage_classes"):
            GCSShardComposerIterDataPipe([], storage_classes=storage_classes)  # type: ignore[arg-type]


def test_small_budget_keeps_composites_whole(gcs_emulator: Emulator) -> None:
    expected = seed(gcs_emulator, "compose-budget", 64)
    pipe = listed("compose-budget", gcs_emulator.client_config).compose_shards_by_gcs(
        client=gcs_emulator.client_config, transfer=TransferConfig(max_buffered_bytes=2048, max_in_flight=4)
    )
    assert read_all(pipe) == list(expected.items())


@given(st.lists(st.binary(max_size=300), max_size=8))
def test_crc32c_of_concatenation_needs_no_bytes(pieces: list[bytes]) -> None:
    combined = crc32c_of_concatenation((google_crc32c.value(piece), len(piece)) for piece in pieces)
    assert combined == google_crc32c.value(b"".join(pieces))


TIB = 2**40


@given(
    st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 4096, 32 * 2**20, TIB, 5 * TIB])),
        min_size=3,
        max_size=3,
    )
)
def test_crc32c_of_concatenation_of_objects_as_large_as_gcs_holds(pieces: list[tuple[int, int]]) -> None:
    """Parts up to GCS's 5 TiB object size combine without passing over their length: grouping does not
    change the result, as it could not for the bytes themselves."""
    (a, a_len), (b, b_len), (c, c_len) = pieces
    left_first = crc32c_of_concatenation(
        [(crc32c_of_concatenation([(a, a_len), (b, b_len)]), a_len + b_len), (c, c_len)]
    )
    right_first = crc32c_of_concatenation(
        [(a, a_len), (crc32c_of_concatenation([(b, b_len), (c, c_len)]), b_len + c_len)]
    )
    assert left_first == right_first == crc32c_of_concatenation(pieces)


CLASS_RUNS = ("STANDARD", "NEARLINE", "COLDLINE")


def seed_class_runs(emulator: Emulator, bucket: str) -> tuple[dict[str, bytes], dict[str, str]]:
    """64 objects in runs of 8 of Standard, Nearline and Coldline in turn, as lifecycle rules or
    Autoclass leave a bucket; returns url -> bytes and url -> storage class."""
    expected: dict[str, bytes] = {}
    classes: dict[str, str] = {}
    for run in range(8):
        storage_class = CLASS_RUNS[run % 3]
        objects = {
            f"d/{i:04d}.bin": f"object {i} in {storage_class};".encode() * (i % 5) for i in range(run * 8, run * 8 + 8)
        }
        emulator.seed(bucket, objects, storage_class=storage_class)
        for name, data in objects.items():
            expected[f"gs://{bucket}/{name}"] = data
            classes[f"gs://{bucket}/{name}"] = storage_class
    return dict(sorted(expected.items())), classes


def composed_sources(front: GCSFront, bucket: str) -> list[list[str]]:
    """The source URLs of each compose the front received, in the order it received them."""
    return [
        [f"gs://{bucket}/{source['name']}" for source in json.loads(request.body)["sourceObjects"]]
        for request in front.recorded
        if request.method == "POST" and request.target.split("?")[0].endswith("/compose")
    ]


@pytest.mark.parametrize("plain_urls", [False, True])
def test_only_groups_of_standard_objects_are_composed(gcs_emulator: Emulator, plain_urls: bool) -> None:
    """GCS refuses a compose whose sources differ in storage class (400), and a composite of cold
    sources is cold itself (deleting it pays early-deletion charges): only Standard runs are composed,
    the rest is read directly, and every object arrives once with its bytes."""
    bucket = f"compose-classes-{int(plain_urls)}"
    expected, classes = seed_class_runs(gcs_emulator, bucket)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        source = IterableWrapper(list(expected)) if plain_urls else listed(bucket, front.client_config)
        pipe = source.compose_shards_by_gcs(client=front.client_config, retry=FAST_RETRY)
        delivered = read_all(pipe)
        composed = composed_sources(front, bucket)
    assert delivered == list(expected.items())
    assert len(composed) == front.counts["compose"] == pipe.stats.composes == 3  # the three Standard runs
    assert sorted(url for group in composed for url in group) == [u for u, c in classes.items() if c == "STANDARD"]
    assert temporary(gcs_emulator, bucket) == []


def test_other_storage_classes_are_composed_by_class_when_asked(gcs_emulator: Emulator) -> None:
    expected, classes = seed_class_runs(gcs_emulator, "compose-classes-asked")
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        pipe = listed("compose-classes-asked", front.client_config).compose_shards_by_gcs(
            client=front.client_config, storage_classes=CLASS_RUNS
        )
        delivered = read_all(pipe)
        composed = composed_sources(front, "compose-classes-asked")
    assert delivered == list(expected.items())
    assert len(composed) == 8 and all(len({classes[url] for url in group}) == 1 for group in composed)


def test_objects_of_unknown_class_are_read_directly_with_one_warning(gcs_emulator: Emulator) -> None:
    """An ObjectInfo without a storage class (built by hand, or by an older version) may name a cold
    object: it is read directly, never composed."""
    expected = seed(gcs_emulator, "compose-classes-unknown", 40)
    with GCSFront(gcs_emulator.endpoint) as front:
        listed_items = list(listed("compose-classes-unknown", front.client_config))
        items = [(url, ObjectInfo(info.size, info.generation, info.crc32c)) for url, info in listed_items]
        pipe = GCSShardComposerIterDataPipe(items, client=front.client_config)
        with pytest.warns(ComposeFallbackWarning, match="storage class") as caught:
            delivered = read_all(pipe)
        assert front.counts["compose"] == 0
    assert len([w for w in caught if issubclass(w.category, ComposeFallbackWarning)]) == 1
    assert delivered == list(expected.items())


def test_a_compose_refused_for_another_reason_falls_back_for_its_group_only(gcs_emulator: Emulator) -> None:
    """Any refusal of a compose (here 400, twice) means direct reads of that group, one warning for
    all of them, and the other groups composed as usual."""
    expected = seed(gcs_emulator, "compose-refused", 128)
    faults = [Fault("http_400", match="compose", times=2)]
    with GCSFront(gcs_emulator.endpoint, faults=faults) as front:
        pipe = listed("compose-refused", front.client_config).compose_shards_by_gcs(
            client=front.client_config, retry=FAST_RETRY
        )
        with pytest.warns(ComposeFallbackWarning, match="400") as caught:
            delivered = read_all(pipe)
        assert front.faults_injected["http_400"] == 2
        assert front.counts["compose"] == 4
        assert front.counts["get"] == 2 + 2 * 32  # two composites, two groups object by object
    assert len([w for w in caught if issubclass(w.category, ComposeFallbackWarning)]) == 1
    assert delivered == list(expected.items())
    assert temporary(gcs_emulator, "compose-refused") == []


def test_a_listing_read_from_its_shared_manifest_keeps_the_storage_classes(gcs_emulator: Emulator) -> None:
    """The replica that reads a shared listing's manifest composes exactly what the lister would."""
    expected, _ = seed_class_runs(gcs_emulator, "compose-classes-manifest")
    with GCSFront(gcs_emulator.endpoint) as front:
        for _ in range(2):  # the first lists and publishes the manifest, the second reads it
            pipe = (
                IterableWrapper(["gs://compose-classes-manifest/d/"])
                .list_files_by_gcs(
                    client=front.client_config, with_metadata=True, manifest="gs://compose-classes-manifest/m/"
                )
                .compose_shards_by_gcs(client=front.client_config)
            )
            assert read_all(pipe) == list(expected.items())
            assert pipe.stats.composes == 3


def test_what_a_process_remembers_of_kept_composites_is_bounded(
    gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process remembers the generation of at most ``KEPT_COMPOSITES_REMEMBERED`` kept composites: one
    forgotten is composed again when met, never read unchecked (here, with room for one of the two)."""
    bucket = "compose-remembered"
    expected = seed(gcs_emulator, bucket, 64)
    monkeypatch.setattr(compose, "KEPT_COMPOSITES_REMEMBERED", 1)
    with GCSFront(gcs_emulator.endpoint) as front:
        client = front.client_config
        pipe = listed(bucket, client).compose_shards_by_gcs(client=client, reuse_prefix="cache/kept/")
        assert read_all(pipe) == list(expected.items()) and front.counts["compose"] == 2
        assert read_all(pipe) == list(expected.items())  # with room for both, both would be reused
        assert front.counts["compose"] == 3 and pipe.stats.reused == 1  # the first was forgotten: composed again
