"""``torchdata-gcs cache ls|clear PATH`` on a cache a dataset filled."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdata_gcs import GCSMapDataset, LocalCache
from torchdata_gcs._engines.local_cache import store_of
from torchdata_gcs.cli import main
from torchdata_gcs.testing import Emulator

BUCKET = "cli-cache"


def test_ls_says_what_the_cache_holds_and_clear_empties_it(
    gcs_emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gcs_emulator.seed(BUCKET, {f"{i}.bin": bytes(1000) for i in range(8)})
    cache = LocalCache(tmp_path, limit=16_000)
    for _ in range(2):  # a miss, then a hit, of each object
        dataset = GCSMapDataset(f"gs://{BUCKET}/", client=gcs_emulator.client_config, cache=cache)
        assert [dataset[i][1] for i in range(8)] == [bytes(1000)] * 8
    store_of(cache).flush_counts()  # as when the process ends
    assert main(["cache", "ls", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (
        f"{tmp_path}: 8 entries, 7.8 KiB (8,000 bytes); limit 15.6 KiB, 50% used; "
        "hit rate 50.0% recently, 50.0% of 16 reads counted\n"
    )

    assert main(["cache", "clear", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path}: removed 8 entries, 7.8 KiB\n"
    assert main(["cache", "ls", str(tmp_path)]) == 0
    assert "0 entries, 0 B (0 bytes)" in capsys.readouterr().out


def test_a_folder_without_a_cache_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "ls", str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err == f"torchdata-gcs cache: [Errno 2] no local cache here: '{tmp_path / 'nothing'}'\n"
    assert not (tmp_path / "nothing").exists()
