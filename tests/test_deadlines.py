"""``RetryConfig.deadline`` bounds a whole call: every attempt, every wait and every byte, against servers
that answer one byte at a time or never read what is sent to them."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch.utils.data import DataLoader

from tests.hostile_server import HostileServer
from torchdata_gcs import (
    ClientConfig,
    DeadlineExceededError,
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    GCSMapDataset,
    RetryConfig,
    TransferConfig,
    UploadError,
    WriteConfig,
    checkpoint,
)
from torchdata_gcs._engines import upload
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

DEADLINE = 2.0
RETRY = RetryConfig(deadline=DEADLINE, initial_delay=0.01, max_delay=0.05)
BOUND = 20.0
"""How long a call may take here before it counts as one that does not end: ten times its deadline."""


def raised_in_time(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised; fails the test if it runs past :data:`BOUND`."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    elapsed = time.monotonic() - started
    assert not thread.is_alive(), f"still running {elapsed:.0f} s into a {DEADLINE:g} s deadline"
    return raised[0] if raised else None


def _filesystem(client: ClientConfig) -> GCSFileSystem:
    return GCSFileSystem(client=client, retry=RETRY, skip_instance_cache=True)


CALLS: dict[str, Callable[[ClientConfig], object]] = {
    "load": lambda client: list(GCSFileLoaderIterDataPipe(["gs://bkt/x.bin"], client=client, retry=RETRY)),
    "list": lambda client: list(GCSFileListerIterDataPipe(["gs://bkt/data/"], client=client, retry=RETRY)),
    "checkpoint.save": lambda client: checkpoint.save(
        {"w": torch.ones(4)}, "gs://bkt/c.pt", client=client, retry=RETRY
    ),
    "checkpoint.load": lambda client: checkpoint.load("gs://bkt/c.pt", client=client, retry=RETRY),
    "fsspec cat": lambda client: _filesystem(client).cat("gs://bkt/x.bin"),
    "fsspec ls": lambda client: _filesystem(client).ls("gs://bkt/data"),
    "fsspec pipe": lambda client: _filesystem(client).pipe("gs://bkt/x.bin", b"payload"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_server_that_trickles_its_answer_cannot_hold_a_call_past_its_deadline(name: str) -> None:
    """One byte every half second restarts the read timeout each time: only the deadline ends the call."""
    with HostileServer("trickle") as server:
        error = raised_in_time(lambda: CALLS[name](ClientConfig(endpoint=server.endpoint)))
    assert isinstance(error, DeadlineExceededError), repr(error)
    assert f"RetryConfig.deadline ({DEADLINE:g} s" in str(error)
    assert server.requests >= 1


def test_a_server_that_never_reads_an_upload_cannot_hang_a_composed_save() -> None:
    """Parts of a 32 MiB save go to a server that reads no body and answers nothing: the parts in
    flight, and the save, end at the deadline."""
    with HostileServer("deaf") as server:
        error = raised_in_time(
            lambda: checkpoint.save(
                {"w": torch.zeros(8 * 1024 * 1024)},
                "gs://bkt/big.pt",
                client=ClientConfig(endpoint=server.endpoint),
                retry=RETRY,
                write=WriteConfig(strategy="compose"),
            )
        )
    assert isinstance(error, UploadError), repr(error)
    assert isinstance(error.__cause__, DeadlineExceededError)
    assert "RetryConfig.deadline" in str(error)
    assert server.requests >= 1


OUTAGE = 3.0
"""A 30 s outage, scaled down tenfold with the retry delays below (long enough that a request paced with
its process's others, 10 a second at the least, still meets more 429s than ``max_attempts``)."""

SCALED_DEFAULT = RetryConfig(initial_delay=0.01, max_delay=3.0, deadline=30.0)
"""``RetryConfig()`` with every duration a tenth: 8 attempts, delays doubling from 0.01 s."""


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes:UserWarning")  # 2 cores here
def test_a_throttled_load_keeps_retrying_until_the_deadline_and_recovers(gcs_emulator: Emulator) -> None:
    """Every request is answered 429 for the length of an outage, then none: a 4-worker load waits it out
    and delivers every object once, though its requests met more 429s than ``max_attempts``."""
    longest_backoff = sum(SCALED_DEFAULT.initial_delay * SCALED_DEFAULT.multiplier**n for n in range(7))
    assert longest_backoff < OUTAGE  # counted against max_attempts, the 429s would end the load
    bucket = "throttled-load"
    objects = {f"t/{i:02d}.bin": f"object {i}".encode() for i in range(24)}
    gcs_emulator.seed(bucket, objects)
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        ds = GCSMapDataset(f"gs://{bucket}/t/", client=front.client_config, retry=SCALED_DEFAULT)  # listed now
        front.set_faults([Fault("http_429")])
        threading.Timer(OUTAGE, front.set_faults, ([],)).start()
        delivered = [item for batch in DataLoader(ds, batch_size=3, num_workers=4, collate_fn=list) for item in batch]
        reads = Counter(request.target.partition("?")[0] for request in front.recorded if request.method == "GET")
    assert sorted(url for url, _ in delivered) == sorted(f"gs://{bucket}/{name}" for name in objects)
    assert all(data == objects[url.split("/", 3)[3]] for url, data in delivered)
    assert max(reads.values()) > SCALED_DEFAULT.max_attempts


def test_the_requests_of_one_call_share_its_deadline(gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save sends three requests one after the other (does the endpoint serve multipart uploads, what
    generation does it replace, the upload), each answered in 0.8 s: each fits a 1.5 s deadline, the
    three do not, and the save ends at it."""
    # The first question is asked once per endpoint and process: a front on a port an earlier one had is asked it.
    monkeypatch.setattr(upload, "_multipart_served", {})
    gcs_emulator.create_bucket("one-deadline")
    url, state = "gs://one-deadline/c.pt", {"w": torch.ones(4)}
    with GCSFront(gcs_emulator.endpoint, latency=0.8) as front:
        with pytest.raises(DeadlineExceededError, match=r"the call did not end within RetryConfig.deadline \(1.5 s"):
            checkpoint.save(state, url, client=front.client_config, retry=RetryConfig(deadline=1.5))
        assert front.counts["upload"] == 0
    with GCSFront(gcs_emulator.endpoint, latency=0.8) as front:  # the same requests, with time for all three
        checkpoint.save(state, url, client=front.client_config, retry=RetryConfig(deadline=10))
        assert front.counts["upload"] == 1


def test_a_read_that_waits_for_the_consumer_is_not_cut_off_by_the_deadline(gcs_emulator: Emulator) -> None:
    """Reads wait for room in the byte budget while the consumer holds what it took: that wait is the
    consumer's, not the server's, and a consumer busy for longer than the deadline loses nothing."""
    objects = {f"w/{i}": bytes([i]) * 100_000 for i in range(8)}
    gcs_emulator.seed("consumer-waits", objects)
    urls = [f"gs://consumer-waits/{name}" for name in objects]
    transfer = TransferConfig(max_in_flight=4, max_buffered_bytes=150_000)
    pipe = GCSFileLoaderIterDataPipe(
        urls, client=gcs_emulator.client_config, retry=RetryConfig(deadline=1), transfer=transfer
    )
    delivered = []
    for url, stream in pipe:
        delivered.append((url, stream.read()))
        if len(delivered) == 1:
            time.sleep(2)  # the consumer is busy; reads behind it wait for room
    assert delivered == [(f"gs://consumer-waits/{name}", data) for name, data in objects.items()]
