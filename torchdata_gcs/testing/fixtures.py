"""pytest fixtures for the embedded emulator; load with ``pytest_plugins = ["torchdata_gcs.testing.fixtures"]``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ._emulator import Emulator


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[Emulator]:
    """One running emulator for the whole test session, stopped at its end whatever happened."""
    with Emulator() as emulator:
        yield emulator


@pytest.fixture
def gcs_bucket(gcs_emulator: Emulator) -> str:
    """A new, empty bucket in the session's emulator."""
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    gcs_emulator.create_bucket(bucket)
    return bucket
