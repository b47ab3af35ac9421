"""Fixtures of the filesystem's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from torchdata_gcs.testing import Emulator, GCSFront


@pytest.fixture
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    """A front over the emulator that records every request it passes on."""
    with GCSFront(gcs_emulator.endpoint, record=True) as running:
        yield running
