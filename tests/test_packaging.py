"""What installing the package brings, and what it leaves alone."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement


def test_torchdata_is_only_an_extra() -> None:
    """pip never replaces a user's torchdata (0.10 and later drop DataLoader2): only ``[dataloader2]`` pins it."""
    wanted = [Requirement(text) for text in requires("torchdata-gcs") or []]
    torchdata = [r for r in wanted if r.name == "torchdata"]
    assert torchdata, "the [dataloader2] extra names torchdata"
    assert all(r.marker is not None and r.marker.evaluate({"extra": "dataloader2"}) for r in torchdata)
    assert not any(r.marker is None or r.marker.evaluate({"extra": ""}) for r in torchdata)


def test_the_datapipes_need_no_torchdata(gcs_emulator, gcs_bucket) -> None:
    """With torchdata impossible to import, the package imports and its DataPipes list and load."""
    gcs_emulator.seed(gcs_bucket, {"a.txt": b"alpha", "b.txt": b"beta"})
    program = f"""
import sys
sys.modules["torchdata"] = None  # any import of torchdata now fails
import torchdata_gcs
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper
from torchdata_gcs import ClientConfig
client = ClientConfig(endpoint={gcs_emulator.endpoint!r})
pipe = IterableWrapper(["gs://{gcs_bucket}/"]).list_files_by_gcs(client=client).sharding_filter()
pipe = pipe.load_files_by_gcs(client=client).map(lambda item: (item[0], item[1].read()))
print(sorted(tuple(item) for item in DataLoader(pipe, batch_size=None, num_workers=2)))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([(f"gs://{gcs_bucket}/a.txt", b"alpha"), (f"gs://{gcs_bucket}/b.txt", b"beta")])
