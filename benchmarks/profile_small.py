"""Where the client's CPU goes per small object (2,000 x 100 KiB, 0 ms): cProfile on the consumer
thread and on the I/O loop's thread, separately. Run: ``.venv/bin/python benchmarks/profile_small.py``."""

import cProfile
import io
import os
import pstats
import threading
import time

from torchdata_gcs import ClientConfig, GCSFileLoaderIterDataPipe
from torchdata_gcs._transport.loop import io_loop
from torchdata_gcs.testing import Emulator

with Emulator() as e:
    e.seed("prof", {f"s/{i:05d}": os.urandom(100 * 1024) for i in range(2000)})
    urls = [f"gs://prof/s/{i:05d}" for i in range(2000)]
    client = ClientConfig(endpoint=e.endpoint)
    for _ in range(2):  # warm up: session, connections
        for _url, stream in GCSFileLoaderIterDataPipe(urls, client=client):
            stream.read()
    consumer, loop_profile = cProfile.Profile(), cProfile.Profile()
    loop = io_loop()
    done = threading.Event()
    loop.call_soon_threadsafe(lambda: (loop_profile.enable(), done.set()))
    done.wait()
    cpu, wall = time.process_time(), time.perf_counter()
    consumer.enable()
    for _url, stream in GCSFileLoaderIterDataPipe(urls, client=client):
        stream.read()
    consumer.disable()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done.clear()
    loop.call_soon_threadsafe(lambda: (loop_profile.disable(), done.set()))
    done.wait()
    print(
        f"{len(urls)} objects in {wall:.2f} s wall, {cpu:.2f} s CPU in this process "
        f"({1000 * cpu / len(urls):.3f} ms per object, profiled)"
    )
    for name, profile in (("consumer thread", consumer), ("I/O loop thread", loop_profile)):
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        print(f"== {name}: {stats.total_tt:.2f} s profiled")
        stats.sort_stats("tottime").print_stats(14)
        print(
            "\n".join(
                line
                for line in out.getvalue().splitlines()
                if line.strip() and not line.startswith(("   Ordered", "   List reduced"))
            )
        )
