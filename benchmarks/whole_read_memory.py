"""Peak memory of reading one large object whole, each way the library offers: ``load_files_by_gcs``
then ``stream.read()`` (the object within the byte budget; larger than it, streamed or held until
verified), a
``GCSMapDataset`` default item (``(url, bytes)``), fsspec ``cat`` and ``open().read()``.

Each reader runs in a process of its own. Its figure is the growth of the process's peak RSS
(``VmHWM``, reset through ``/proc/self/clear_refs``) over its RSS just before the read, in MiB and as
a multiple of the object's size; the bytes read are checked by length and crc32c. The object (random
bytes) is written once into the embedded emulator. Linux only.

Run: ``.venv/bin/python benchmarks/whole_read_memory.py [--size-mib 1024]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import google_crc32c

MiB = 1024 * 1024
READERS = ("loader-in-budget", "loader-streamed", "loader-held", "dataset-item", "fsspec-cat", "fsspec-open-read")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def read_whole(reader: str, endpoint: str, url: str, size: int) -> bytes:
    """The object's bytes, read whole the way ``reader`` names."""
    from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe, GCSMapDataset, TransferConfig
    from torchdata_gcs.fsspec import GCSFileSystem

    client = ClientConfig(endpoint=endpoint)
    if reader.startswith("loader"):
        budget = 2 * size if reader == "loader-in-budget" else TransferConfig().max_buffered_bytes
        transfer = TransferConfig(max_buffered_bytes=budget, hold_until_verified=reader == "loader-held")
        pipe = GCSFileLoaderIterDataPipe([url], client=client, transfer=transfer)
        ((_, stream),) = list(pipe)
        return stream.read()
    if reader == "dataset-item":
        return GCSMapDataset([url], client=client)[0][1]
    fs = GCSFileSystem(client=client, skip_instance_cache=True)
    if reader == "fsspec-cat":
        return fs.cat(url)
    with fs.open(url, "rb") as file:
        return file.read()


def child(reader: str, endpoint: str, url: str, size: int, crc: int) -> None:
    """Measure one reader in this process and print ``reader growth_mib seconds``."""
    import torchdata_gcs.fsspec  # noqa: F401 - imported before the baseline, as a job would have it

    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS
    started = time.perf_counter()
    data = read_whole(reader, endpoint, url, size)
    seconds = time.perf_counter() - started
    growth = (_status_kib("VmHWM") - before) / 1024
    if len(data) != size or google_crc32c.value(data) != crc:
        raise SystemExit(f"{reader}: wrong bytes ({len(data)} of {size})")
    print(reader, f"{growth:.0f}", f"{seconds:.2f}")


def seed(endpoint: str, url: str, size: int) -> int:
    """Write ``size`` random bytes to ``url`` in pieces (never held whole here); their crc32c."""
    from torchdata_gcs import ClientConfig, WriteConfig, checkpoint

    crc = 0
    write = WriteConfig(strategy="compose", part_size=32 * MiB)
    with checkpoint.open_writer(url, client=ClientConfig(endpoint=endpoint), write=write) as out:
        for offset in range(0, size, 8 * MiB):
            piece = os.urandom(min(8 * MiB, size - offset))
            crc = google_crc32c.extend(crc, piece)
            out.write(piece)
    return crc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024, help="the object's size")
    parser.add_argument("--readers", nargs="*", default=list(READERS), choices=READERS)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        reader, endpoint, url, size, crc = args.child
        child(reader, endpoint, url, int(size), int(crc))
        return
    from torchdata_gcs.testing import Emulator

    size = args.size_mib * MiB
    with Emulator(backend="filesystem", memory_limit="8GiB") as emulator:
        emulator.create_bucket("whole-read")
        url = "gs://whole-read/object.bin"
        crc = seed(emulator.endpoint, url, size)
        print(f"one object of {args.size_mib} MiB; peak RSS growth of a process over its RSS before the read")
        print(f"{'reader':<18} {'MiB':>7} {'x size':>7} {'seconds':>8}")
        for reader in args.readers:
            command = [sys.executable, __file__, "--child", reader, emulator.endpoint, url, str(size), str(crc)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()
            growth, seconds = float(output[1]), float(output[2])
            print(f"{reader:<18} {growth:>7.0f} {growth * MiB / size:>7.2f} {seconds:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
