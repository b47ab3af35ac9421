"""The scale calculator (``benchmarks/scale_calculator.py``) counts the requests the library sends: each
operation's count is checked here against a GCS front at small scale (a listing, reads, composed reads, a
multipart save, a DCP save), and docs/scale.md must hold the tables the calculator prints."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from benchmarks import scale_calculator as scale
from torchdata_gcs import GCSFileListerIterDataPipe, GCSFileLoaderIterDataPipe, TransferConfig, WriteConfig, checkpoint
from torchdata_gcs.datapipes.composing import GCSShardComposerIterDataPipe
from torchdata_gcs.dcp import GCSStorageWriter
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024


def sent(front: GCSFront) -> Counter[str]:
    """The front's request counts, a ranged GET counted as a GET (both are one Class B operation)."""
    counts = front.counts
    counts["get"] += counts.pop("range_get", 0)
    return +counts


def test_a_listing_sends_a_request_per_page_and_at_most_half_again_in_parallel(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    gcs_emulator.seed(gcs_bucket, {f"img/{i:05d}.jpg": b"x" for i in range(95)})
    pages, at_most = scale.list_requests(95, page_size=10)
    assert (pages, at_most) == (10, 15)
    with GCSFront(gcs_emulator.endpoint) as front:
        for concurrency in (1, 8):
            front.reset_counts()
            lister = GCSFileListerIterDataPipe(
                f"gs://{gcs_bucket}/img/", client=front.client_config, page_size=10, concurrency=concurrency
            )
            assert len(list(lister)) == 95
            counts = sent(front)
            assert set(counts) == {"list"}, counts
            if concurrency == 1:
                assert counts["list"] == pages
            else:
                assert pages <= counts["list"] <= at_most


def test_reads_send_a_get_per_object_and_a_ranged_get_per_part(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    transfer = TransferConfig(part_size=256 * 1024)
    objects = {"small": os.urandom(1000), "large": os.urandom(2 * transfer.part_size + 5)}
    gcs_emulator.seed(gcs_bucket, objects)
    with GCSFront(gcs_emulator.endpoint) as front:
        listed = list(GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/", client=front.client_config, with_metadata=True))
        front.reset_counts()
        loader = GCSFileLoaderIterDataPipe(listed, client=front.client_config, transfer=transfer)
        read = {url.rsplit("/", 1)[1]: stream.read() for url, stream in loader}
        counts = sent(front)
    assert read == objects
    expected = scale.read_requests(1000, transfer) + scale.read_requests(2 * transfer.part_size + 5, transfer)
    assert expected == Counter(get=1 + 3)
    assert counts == expected


def test_composed_reads_send_a_compose_a_get_and_a_delete_per_composite_and_one_probe(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    objects = {f"img/{i:03d}.jpg": os.urandom(100 + i) for i in range(70)}
    gcs_emulator.seed(gcs_bucket, objects)
    with GCSFront(gcs_emulator.endpoint) as front:
        listed = list(
            GCSFileListerIterDataPipe(f"gs://{gcs_bucket}/img/", client=front.client_config, with_metadata=True)
        )
        front.reset_counts()
        composer = GCSShardComposerIterDataPipe(listed, client=front.client_config)
        read = {url.split("/", 3)[3]: stream.read() for url, stream in composer}
        counts = sent(front)
    assert read == objects
    expected = scale.composed_read_requests(70) + scale.COMPOSE_PROBE
    assert expected == Counter(compose=3, get=3, delete=3 + 1, upload=1)
    assert counts == expected


@pytest.mark.parametrize("size", [3 * MiB, 2 * 5 * MiB + 12_345])
def test_a_multipart_save_sends_what_the_calculator_counts(gcs_emulator: Emulator, gcs_bucket: str, size: int) -> None:
    write = WriteConfig(part_size=5 * MiB)
    data = os.urandom(size)
    with GCSFront(gcs_emulator.endpoint) as front:
        with checkpoint.open_writer(f"gs://{gcs_bucket}/first", client=front.client_config, write=write) as out:
            out.write(b"the process's first save asks whether the endpoint serves multipart uploads")
        front.reset_counts()
        with checkpoint.open_writer(f"gs://{gcs_bucket}/ckpt", client=front.client_config, write=write) as out:
            out.write(data)
        counts = sent(front)
    assert gcs_emulator.read(gcs_bucket, "ckpt") == data
    expected = scale.multipart_save_requests(size, write)
    assert counts == expected
    if size > write.part_size:
        assert expected == Counter(upload=1 + 1 + 3 + 1, delete=1)  # start, marker, parts, completion


def test_parts_double_in_size_every_thousand_parts() -> None:
    write = WriteConfig(part_size=5 * MiB)
    assert scale.parts(1000 * 5 * MiB, write) == 1000
    assert scale.parts(1000 * 5 * MiB + 1, write) == 1001
    assert scale.parts(1000 * 5 * MiB + 1000 * 10 * MiB, write) == 2000


def test_the_doc_holds_the_calculators_tables_and_the_readme_links_it() -> None:
    text = (ROOT / "docs" / "scale.md").read_text()
    tables = scale.tables()
    assert tables
    for name, table in tables.items():
        found = re.search(rf"<!-- scale:{name} -->\n(.*?)\n<!-- /scale:{name} -->", text, re.DOTALL)
        assert found is not None, f"docs/scale.md has no table {name!r}"
        assert found.group(1) == table, (
            f"docs/scale.md's table {name!r} is not what benchmarks/scale_calculator.py prints"
        )
    assert "(docs/scale.md)" in (ROOT / "README.md").read_text()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp in one process, as meant
def test_a_dcp_save_sends_its_data_file_and_metadata_as_the_calculator_counts(
    gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    write = WriteConfig(part_size=5 * MiB)
    state = {"w": torch.arange(3 * MiB // 4, dtype=torch.float32) * 0.5, "step": 7}  # a 3 MiB file: one upload
    with GCSFront(gcs_emulator.endpoint) as front:
        for step in (1, 2):  # the first save of the process also asks whether the endpoint serves multipart uploads
            front.reset_counts()
            writer = GCSStorageWriter(f"gs://{gcs_bucket}/run/step-{step}", client=front.client_config, write=write)
            dcp.save(state, storage_writer=writer)
        counts = sent(front)
    size = len(gcs_emulator.read(gcs_bucket, "run/step-2/__0_0.distcp"))
    assert size < write.part_size
    assert counts == scale.multipart_save_requests(size, write) + scale.DCP_RANK + scale.DCP_COORDINATOR
