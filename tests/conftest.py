"""Shared fixtures: the embedded emulator (from the package), a recording/corrupting HTTP proxy and a
local OAuth token endpoint."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.http_proxy import RecordingProxy
from tests.token_server import TokenServer
from torchdata_gcs import ClientConfig
from torchdata_gcs.testing import Emulator, GCSFront

pytest_plugins = ["torchdata_gcs.testing.fixtures"]

# What a user's type checker sees, read by mypy only: nothing in them runs (the nodes' needs torchdata 0.10+, which
# the first environment lacks, so importing it to look for doctests would fail there).
collect_ignore = ["typed_usage.py", "nodes/typed_usage.py"]


@pytest.fixture
def client(gcs_emulator: Emulator) -> ClientConfig:
    return gcs_emulator.client_config


@pytest.fixture
def proxy(gcs_emulator: Emulator) -> Iterator[RecordingProxy]:
    with RecordingProxy(gcs_emulator.endpoint) as running:
        yield running


@pytest.fixture
def gcs_front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    """A GCS front (GCS's rules, XML multipart upload, request counts) over the shared emulator."""
    with GCSFront(gcs_emulator.endpoint) as running:
        yield running


@pytest.fixture
def token_server() -> Iterator[TokenServer]:
    server = TokenServer()
    try:
        yield server
    finally:
        server.close()
