"""fsspec ``glob`` asks GCS for the names its pattern may select (``matchGlob``), and still yields what
fsspec's own reading of the pattern keeps, folders included."""

from __future__ import annotations

import pytest

from tests.engines.test_match_glob import match_globs_sent, seed_ten_jpgs_in_3000
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront


def test_a_glob_over_a_large_prefix_comes_back_in_one_page(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    names = seed_ten_jpgs_in_3000(gcs_emulator, gcs_bucket, "many/")
    with GCSFront(gcs_emulator.endpoint, record=True) as front:
        fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
        found = fs.glob(f"{gcs_bucket}/many/*.jpg")
        assert found == [f"{gcs_bucket}/{name}" for name in names if name.endswith(".jpg")]
        assert front.counts["list"] == 1 and match_globs_sent(front) == ["many/*.jpg**"]


@pytest.mark.parametrize("pattern", ["t/*", "t/*/", "t/d*", "t/**/*.jpg", "t/*/er", "t/deep/**", "t/[ab]*", "t/*.jpg"])
def test_a_narrowed_glob_finds_what_fsspec_alone_finds(gcs_emulator: Emulator, gcs_bucket: str, pattern: str) -> None:
    objects = ["t/a", "t/a/c.jpg", "t/a.jpg", "t/b.jpg", "t/deep/d.jpg", "t/deep/er/e.jpg", "t/deep/er/f.txt"]
    gcs_emulator.seed(gcs_bucket, {name: b"x" for name in objects})
    alone = GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True)
    with GCSFront(gcs_emulator.endpoint) as front:
        narrowed = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
        assert narrowed.glob(f"{gcs_bucket}/{pattern}") == alone.glob(f"{gcs_bucket}/{pattern}")
        # the details the listing asks for (``fields``) alike; the emulator alone sends every field
        asked = ("name", "type", "size", "generation", "crc32c")
        assert [
            [entry.get(key) for key in asked]
            for entry in narrowed.glob(f"{gcs_bucket}/{pattern}", detail=True).values()
        ] == [
            [entry.get(key) for key in asked] for entry in alone.glob(f"{gcs_bucket}/{pattern}", detail=True).values()
        ]
