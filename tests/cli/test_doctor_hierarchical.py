"""``doctor`` in a bucket with a hierarchical namespace: its scratch objects leave a folder behind, which
it deletes too, whether it learns the namespace from the bucket or, with object roles only, from the
storage layout."""

from __future__ import annotations

import json
import urllib.request
from urllib.parse import quote, urlencode

import pytest

from torchdata_gcs.cli.doctor import SCRATCH_MARK
from torchdata_gcs.cli.main import main
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("object_only", [False, True], ids=["bucket-reader", "object-roles-only"])
def test_doctor_deletes_its_scratch_folder(
    gcs_emulator: Emulator, gcs_bucket: str, capsys: pytest.CaptureFixture[str], object_only: bool
) -> None:
    gcs_emulator.seed(gcs_bucket, {"data/a.bin": b"a"})
    with GCSFront(gcs_emulator.endpoint, hierarchical=[gcs_bucket], object_only=object_only, record=True) as front:
        code = main(["--endpoint", front.endpoint, "doctor", f"gs://{gcs_bucket}/data/"])
        out, err = capsys.readouterr()
        query = urlencode({"prefix": "data/", "delimiter": "/", "includeFoldersAsPrefixes": "true"})
        with urllib.request.urlopen(f"{front.endpoint}/storage/v1/b/{gcs_bucket}/o?{query}", timeout=30) as answer:
            left = json.load(answer).get("prefixes", [])
        deletes = [r.target for r in front.recorded if r.method == "DELETE" and "/folders/" in r.target]
    assert (code, err) == (0, ""), out
    assert "hierarchical namespace  on" in out and "nothing left behind" in out
    assert len(deletes) == 1 and deletes[0].startswith(
        f"/storage/v1/b/{gcs_bucket}/folders/{quote(f'data/{SCRATCH_MARK}', safe='')}"
    )
    assert deletes[0].endswith("%2F"), "a folder's name ends in /"
    assert left == [], "no empty scratch folder stays behind"
