"""``RetryConfig.deadline`` bounds a whole call: every attempt, every wait and every byte, against servers
that answer one byte at a time or never read what is sent to them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from tests.hostile_server import HostileServer
from torchdata_gcs import (
    ClientConfig,
    DeadlineExceededError,
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    RetryConfig,
    UploadError,
    WriteConfig,
    checkpoint,
)
from torchdata_gcs.fsspec import GCSFileSystem

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
