"""Peak memory while loading 2 GiB of mixed sizes stays under the byte budget plus a documented constant."""

from __future__ import annotations

import random
import textwrap

import google_crc32c

from tests.children import run_child
from torchdata_gcs.testing import Emulator

MiB = 1024 * 1024
BUDGET = 128 * MiB
PART = 16 * MiB
IN_FLIGHT = 128  # TransferConfig's default
OVERHEAD = 32 * MiB + IN_FLIGHT * MiB // 2  # README: beyond the budget, 32 MiB and 0.5 MiB per request in flight
SIZES = [320 * MiB] * 4 + [40 * MiB] * 10 + [5 * MiB // 2] * 100 + [100 * 1024] * 1000  # 2.03 GB

CHILD = textwrap.dedent(
    """
    import json, sys
    import google_crc32c
    from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe, TransferConfig

    spec = json.load(sys.stdin)
    client = ClientConfig(endpoint=spec["endpoint"], anonymous=True)
    transfer = TransferConfig(
        max_buffered_bytes=spec["budget"], part_size=spec["part"], max_in_flight=spec["in_flight"]
    )

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

    warm_up = GCSFileLoaderIterDataPipe(spec["urls"][-1:], client=client, transfer=transfer)
    [stream.read() for _, stream in warm_up]  # the I/O thread, the session, the imports
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset the peak
    baseline = status("VmRSS")
    checks = {}
    for url, stream in GCSFileLoaderIterDataPipe(spec["urls"], client=client, transfer=transfer):
        crc, size = 0, 0
        while chunk := stream.read(1 << 20):
            crc, size = google_crc32c.extend(crc, chunk), size + len(chunk)
        stream.close()
        checks[url] = [size, crc]
    print(json.dumps({"growth": status("VmHWM") - baseline, "checks": checks}))
    """
)


def content(index: int, size: int, block: bytes) -> bytes:
    return (index.to_bytes(8, "big") + block * (size // len(block) + 1))[:size]


def test_peak_memory_stays_under_the_budget_plus_a_constant() -> None:
    block = random.Random(0).randbytes(MiB - 8)
    sizes = SIZES[:]
    random.Random(1).shuffle(sizes)
    names = [f"m/{i:05d}" for i in range(len(sizes))]
    with Emulator(backend="memory") as emulator:
        expected = {}
        for start in range(0, len(names), 50):  # seeded in slices: the test process holds little at a time
            batch = {name: content(i, sizes[i], block) for i, name in enumerate(names) if start <= i < start + 50}
            emulator.seed("memory-test", batch, concurrency=8)
            expected.update({f"gs://memory-test/{n}": [len(d), google_crc32c.value(d)] for n, d in batch.items()})
            del batch
        spec = {
            "endpoint": emulator.endpoint,
            "budget": BUDGET,
            "part": PART,
            "in_flight": IN_FLIGHT,
            "urls": sorted(expected),
        }
        result = run_child(CHILD, spec, timeout=600)
    assert result["checks"] == expected  # every object, bit-exact
    assert sum(sizes) > 2 * 1024**3 * 0.94
    assert result["growth"] < BUDGET + OVERHEAD, f"peak RSS grew {result['growth'] / MiB:.0f} MiB"
