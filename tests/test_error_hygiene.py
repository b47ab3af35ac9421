"""Every error that leaves the library, on every path we can provoke, is a picklable ``GCSError`` that
carries no credentials: not in its text, its repr, its pickle, nor anywhere in its printed traceback."""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.token_server import ACCESS_TOKEN, TokenServer, private_key_pem
from torchdata_gcs import (
    ClientConfig,
    GCSError,
    GCSFileListerIterDataPipe,
    GCSFileLoaderIterDataPipe,
    RetryConfig,
    TransferConfig,
    WriteConfig,
    checkpoint,
)
from torchdata_gcs._engines.upload import MIN_PART_SIZE
from torchdata_gcs.testing import Emulator, Fault, GCSFront

BUCKET = "error-hygiene"
RETRY = RetryConfig(max_attempts=2, initial_delay=0.01, max_delay=0.02, deadline=3)  # a 503 lasts until it
Operation = Callable[[ClientConfig], object]


def list_prefix(client: ClientConfig) -> object:
    return list(GCSFileListerIterDataPipe(f"gs://{BUCKET}/small/", client=client, retry=RETRY))


def load_objects(client: ClientConfig) -> object:
    urls = [f"gs://{BUCKET}/small/{i}.bin" for i in range(3)] + [f"gs://{BUCKET}/large.bin"]
    loaded = GCSFileLoaderIterDataPipe(urls, client=client, retry=RETRY, transfer=TransferConfig(part_size=256 * 1024))
    return [stream.read() for _, stream in loaded]


def compose_objects(client: ClientConfig) -> object:
    listed = GCSFileListerIterDataPipe(f"gs://{BUCKET}/small/", client=client, with_metadata=True)
    return [stream.read() for _, stream in listed.compose_shards_by_gcs(client=client, retry=RETRY)]


def save(strategy: str) -> Operation:
    def run(client: ClientConfig) -> object:
        state = {"weights": torch.zeros(2 * 1024 * 1024)}  # 8 MiB: two parts
        return checkpoint.save(state, f"gs://{BUCKET}/ckpt-{strategy}.pt", client=client, retry=RETRY,
                               write=WriteConfig(part_size=MIN_PART_SIZE, strategy=strategy))  # fmt: skip

    return run


def load_checkpoint(client: ClientConfig) -> object:
    return checkpoint.load(
        f"gs://{BUCKET}/kept.pt", client=client, retry=RETRY, transfer=TransferConfig(part_size=256 * 1024)
    )


OPERATIONS: dict[str, tuple[Operation, str | None]] = {
    # name: (operation, the request kind its faults hit: the one that only this operation's path sends)
    "list": (list_prefix, "list"),
    "load": (load_objects, None),
    "compose": (compose_objects, "compose"),
    "save-multipart": (save("multipart"), r"^(PUT|POST) /error-hygiene/"),
    "save-compose": (save("compose"), "upload"),
    "load-checkpoint": (load_checkpoint, None),
}
FAULTS = ["html_200", "http_403", "http_503", "reset", "truncate", "corrupt", "stall"]


@pytest.fixture(scope="module")
def seeded(gcs_emulator: Emulator) -> Emulator:
    gcs_emulator.seed(BUCKET, {f"small/{i}.bin": os.urandom(1000) for i in range(3)})
    gcs_emulator.seed(BUCKET, {"large.bin": os.urandom(600 * 1024)})
    return gcs_emulator


@pytest.fixture
def signed_front(
    seeded: Emulator, token_server: TokenServer, tmp_path: Path
) -> Iterator[tuple[GCSFront, ClientConfig]]:
    key_file = token_server.write_key_file(tmp_path / "service-account.json", private_key_pem())
    with GCSFront(seeded.endpoint) as front:
        client = ClientConfig(
            endpoint=front.endpoint, anonymous=False, credentials_file=key_file, connect_timeout=2, read_timeout=0.5
        )
        checkpoint.save({"step": torch.tensor(1)}, f"gs://{BUCKET}/kept.pt", client=client)
        yield front, client


def assert_clean(error: BaseException) -> None:
    assert isinstance(error, GCSError), f"{type(error).__module__}.{type(error).__name__} escaped: {error!r}"
    printed = "".join(traceback.format_exception(error))
    for text in (str(error), repr(error), printed):
        assert ACCESS_TOKEN not in text and "Bearer" not in text, text
    blob = pickle.dumps(error)
    assert ACCESS_TOKEN.encode() not in blob
    copy = pickle.loads(blob)
    assert type(copy) is type(error) and str(copy) == str(error)


# a compose that fails for good, whatever the answer, falls back to direct loads for its group
SURVIVED_BY_DESIGN = {("compose", "http_403"), ("compose", "http_503"), ("compose", "html_200")}


@pytest.mark.filterwarnings("ignore::torchdata_gcs.ComposeFallbackWarning")
@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("name", list(OPERATIONS))
def test_errors_are_typed_picklable_and_carry_no_credentials(
    signed_front: tuple[GCSFront, ClientConfig], name: str, kind: str
) -> None:
    front, client = signed_front
    operation, match = OPERATIONS[name]
    front.set_faults([Fault(kind, match=match, stall_seconds=1.0)])
    try:
        operation(client)
    except BaseException as error:  # noqa: BLE001 - whatever escapes is what is checked
        assert_clean(error)
    else:
        survivable = kind in ("reset", "truncate", "corrupt", "stall") or (name, kind) in SURVIVED_BY_DESIGN
        assert survivable and front.faults_injected[kind] >= 1, (
            f"{name} succeeded although every matching request got {kind}"
        )
