"""What installing the package brings, and what it leaves alone."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement


def test_torchdata_is_only_an_extra() -> None:
    """pip never replaces a user's torchdata: ``[dataloader2]`` pins 0.9 (DataLoader2), ``[nodes]`` asks for 0.10+."""
    torchdata = [Requirement(text) for text in requires("torchdata-gcs") or [] if Requirement(text).name == "torchdata"]
    assert torchdata and not any(r.marker is None or r.marker.evaluate({"extra": ""}) for r in torchdata)
    pinned = {
        extra: [r.specifier for r in torchdata if r.marker is not None and r.marker.evaluate({"extra": extra})]
        for extra in ("dataloader2", "nodes")
    }
    assert pinned["dataloader2"] and all(
        s.contains("0.9.0") and not s.contains("0.10.0") for s in pinned["dataloader2"]
    )
    assert pinned["nodes"] and all(s.contains("0.11.0") and not s.contains("0.9.0") for s in pinned["nodes"])


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
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([(f"gs://{gcs_bucket}/a.txt", b"alpha"), (f"gs://{gcs_bucket}/b.txt", b"beta")])
