"""fsspec's own abstract test suite (the classes gcsfs and s3fs run) against GCSFileSystem on the emulator."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fsspec.tests import abstract

from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator

pytestmark = pytest.mark.timeout(120)


class GCSFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, gcs_emulator: Emulator) -> GCSFileSystem:
        return GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)

    @pytest.fixture
    def fs_path(self, gcs_bucket: str) -> str:
        return gcs_bucket

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False  # a directory is a prefix with objects under it


class TestCopy(abstract.AbstractCopyTests, GCSFixtures):  # type: ignore[misc]
    pass


class TestGet(abstract.AbstractGetTests, GCSFixtures):  # type: ignore[misc]
    pass


class TestPut(abstract.AbstractPutTests, GCSFixtures):  # type: ignore[misc]
    pass


class TestOpen(abstract.AbstractOpenTests, GCSFixtures):  # type: ignore[misc]
    pass


class TestPipe(abstract.AbstractPipeTests, GCSFixtures):  # type: ignore[misc]
    pass
