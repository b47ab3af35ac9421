"""``cat`` of many paths, as fsspec users read a list of small files: the reads take turns for the
filesystem's request slots instead of each opening a connection of its own at once."""

from __future__ import annotations

import os

from torchdata_gcs import TransferConfig
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront


def test_cat_of_many_paths_holds_at_most_max_in_flight_requests(gcs_emulator: Emulator, gcs_bucket: str) -> None:
    objects = {f"many/{i:02d}": os.urandom(1000 + i) for i in range(24)}
    gcs_emulator.seed(gcs_bucket, objects)
    with GCSFront(gcs_emulator.endpoint, latency=0.05) as front:  # answers overlap, as over a real network
        fs = GCSFileSystem(
            client=front.client_config, transfer=TransferConfig(max_in_flight=4), skip_instance_cache=True
        )
        front.reset_counts()
        got = fs.cat([f"gs://{gcs_bucket}/{name}" for name in objects])
        assert got == {f"{gcs_bucket}/{name}": data for name, data in objects.items()}
        assert front.counts["get"] + front.counts["range_get"] == len(objects)
        assert front.peak_connections <= 4
        # one path alone is read as before; a missing one among many raises as fsspec's cat does
        assert fs.cat(f"gs://{gcs_bucket}/many/00") == objects["many/00"]
        assert fs.cat([f"gs://{gcs_bucket}/many/00", f"gs://{gcs_bucket}/gone"], on_error="omit") == {
            f"{gcs_bucket}/many/00": objects["many/00"]
        }
