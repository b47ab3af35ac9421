"""Model weights from GCS: one file, a sharded model, the ranks of one machine, a DCP checkpoint.

    .bench-venv/bin/python -m benchmarks.weights [--runs 3] [--quick] [--only SETUP ...]

The bare embedded emulator (filesystem backend in RAM, no added latency); every setup runs in a process of
its own, the setups taking turns round after round, and figures are medians over the rounds. One 1 GiB
safetensors file (40 float32 tensors): ``safetensors.load_file``, Run:ai's ``SafetensorsStreamer``, gcsfs
``cat`` + ``safetensors.torch.load``, urllib3 ranges into one buffer (the raw ceiling). A model of 8 shards
of 128 MiB with a Hugging Face index: ``load_files(folder)``, Run:ai ``stream_files``, gcsfs + load per
shard. 4 gloo ranks of one machine loading the 1 GiB file with ``process_group``, without it, and one rank
alone: wall time barrier to barrier, and the sum of the ranks' PSS growth while they hold the tensors.
``dcp.load`` of a 4-rank checkpoint (256 MiB a rank) with ``GCSStorageReader`` and with torch's
``FsspecReader`` on gcsfs and on ``torchdata_gcs.fsspec``. Then where our 1 GiB load's wall time goes,
timed per stage. Every load is checked (tensor count, crc32c of the bytes). Writes
``benchmarks/results/weights.json``; ``--quick``: a sixteenth of the data, to check the rig.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import quote

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # else gcsfs first waits on a gRPC API

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MiB = 1024 * 1024
BUCKET = "bench-weights"
ONE, MODEL, CKPT = "one/model.safetensors", "model", "dcp/step-1"
INDEX = "model.safetensors.index.json"
RANKS = 4
FILE_TENSORS, SHARDS, SHARD_TENSORS = 40, 8, 8
CEILING_THREADS = 16
SPEED_GOAL, WALL_GOAL, MEMORY_GOAL = 1.0, 1.3, 1.2  # ours/Run:ai at least; shared/alone wall, PSS/file at most

SETUPS: dict[str, tuple[str, int, str]] = {  # name: (workload, ranks, what it runs)
    "file-ours": ("file", 1, "torchdata-gcs {ours}: safetensors.load_file"),
    "file-runai": ("file", 1, "Run:ai {runai}: SafetensorsStreamer.stream_file, every tensor kept"),
    "file-gcsfs": ("file", 1, "gcsfs {gcsfs}: cat, then safetensors.torch.load"),
    "file-ceiling": ("file", 1, "urllib3 {urllib3}: 16 ranges in 16 threads into one buffer, no tensors (ceiling)"),
    "model-ours": ("model", 1, "torchdata-gcs: safetensors.load_files(folder)"),
    "model-runai": ("model", 1, "Run:ai: list_safetensors(folder), then stream_files of them all"),
    "model-gcsfs": ("model", 1, "gcsfs: cat the index, then cat + safetensors.torch.load shard by shard"),
    "node-alone": ("node", 1, "one rank alone: load_file"),
    "node-shared": ("node", RANKS, "4 ranks: load_file(process_group=dist.group.WORLD)"),
    "node-each": ("node", RANKS, "4 ranks, each load_file without process_group"),
    "dcp-ours": ("dcp", RANKS, "4 ranks: dcp.load with torchdata_gcs.dcp.GCSStorageReader"),
    "dcp-gcsfs": ("dcp", RANKS, "4 ranks: dcp.load with torch's FsspecReader on gcsfs"),
    "dcp-fsspec": ("dcp", RANKS, "4 ranks: dcp.load with torch's FsspecReader on torchdata_gcs.fsspec"),
}


# --- in the measured processes ---------------------------------------------------------------------------


def _kib(path: str, field: str) -> int:
    with open(path) as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith(field + ":"))


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _client(spec: dict[str, Any]) -> Any:
    from torchdata_gcs import ClientConfig

    return ClientConfig(endpoint=spec["endpoint"], anonymous=True)


def _gcsfs(spec: dict[str, Any]) -> Any:
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=spec["endpoint"], token="anon", project="bench")


def _runai(spec: dict[str, Any]) -> Any:
    """Run:ai's package, pointed at the emulator before its import (its C++ reads and its Python listing)."""
    os.environ["CLOUD_STORAGE_EMULATOR_ENDPOINT"] = spec["endpoint"]
    os.environ["RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS"] = "true"
    os.environ["STORAGE_EMULATOR_HOST"] = spec["endpoint"]  # list_safetensors's google-cloud-storage client
    import runai_model_streamer

    return runai_model_streamer


def _fetch_ranges(spec: dict[str, Any]) -> bytearray:
    """The raw ceiling, as ``readers.ranges_into`` reads: 16 urllib3 threads, one range each, into one buffer."""
    import urllib3

    from benchmarks.readers import ranges_into

    size = spec["file_bytes"]
    url = f"{spec['endpoint']}/download/storage/v1/b/{BUCKET}/o/{quote(ONE, safe='')}?alt=media"
    pool = urllib3.PoolManager(maxsize=CEILING_THREADS, retries=False)
    buffer = bytearray(size)
    with ThreadPoolExecutor(CEILING_THREADS) as threads:
        for done in ranges_into(pool, url, memoryview(buffer), -(-size // CEILING_THREADS), threads):
            done.result()
    return buffer


def _runai_load(spec: dict[str, Any], urls: list[str] | None) -> dict[str, Any]:
    runai = _runai(spec)
    with runai.SafetensorsStreamer() as streamer:
        urls = urls or runai.list_safetensors(f"gs://{BUCKET}/{MODEL}/")
        streamer.stream_files(urls)
        return dict(streamer.get_tensors())


def _gcsfs_model(spec: dict[str, Any]) -> dict[str, Any]:
    import safetensors.torch

    fs = _gcsfs(spec)
    index = json.loads(fs.cat(f"{BUCKET}/{MODEL}/{INDEX}"))
    state: dict[str, Any] = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(safetensors.torch.load(fs.cat(f"{BUCKET}/{MODEL}/{shard}")))
    return state


def _dcp_state(spec: dict[str, Any], rank: int, fill: bool) -> dict[str, Any]:
    """Rank ``rank``'s own keys of the checkpoint: random values to save (seeded by rank), or empty to load into."""
    import torch

    generator = torch.Generator().manual_seed(rank)
    numel, count = spec["dcp_numel"], spec["dcp_tensors"]
    make = (lambda: torch.rand(numel, generator=generator)) if fill else (lambda: torch.empty(numel))
    return {f"rank{rank}.t{i:02d}": make() for i in range(count)}


def _dcp_load(setup: str, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    url = f"gs://{BUCKET}/{CKPT}"
    if setup == "dcp-ours":
        from torchdata_gcs.dcp import GCSStorageReader

        reader: Any = GCSStorageReader(url, client=_client(spec))
    else:  # TORCHDATA_GCS_FSSPEC (set before the ranks started) picks gcsfs or ours for gs://
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # torch exports it nowhere else

        reader = FsspecReader(url, endpoint_url=spec["endpoint"], token="anon", project="bench")
        wanted = "gcsfs" if setup == "dcp-gcsfs" else "torchdata_gcs"
        if not type(reader.fs.fs).__module__.startswith(wanted):
            raise RuntimeError(f"{setup}: gs:// went to {type(reader.fs.fs).__module__}, not {wanted}")
    dcp.load(state, storage_reader=reader)
    return state


def _load(setup: str, spec: dict[str, Any], rank: int, prepared: Any) -> Any:
    import safetensors.torch
    import torch.distributed as dist

    from torchdata_gcs import safetensors as ours

    url = f"gs://{BUCKET}/{ONE}"
    if setup in ("file-ours", "node-alone", "node-each"):
        return ours.load_file(url, client=_client(spec))
    if setup == "node-shared":
        return ours.load_file(url, process_group=dist.group.WORLD, client=_client(spec))
    if setup == "file-runai":
        return _runai_load(spec, [url])
    if setup == "file-gcsfs":
        return safetensors.torch.load(_gcsfs(spec).cat(f"{BUCKET}/{ONE}"))
    if setup == "file-ceiling":
        return _fetch_ranges(spec)
    if setup == "model-ours":
        return ours.load_files(f"gs://{BUCKET}/{MODEL}/", client=_client(spec))
    if setup == "model-runai":
        return _runai_load(spec, None)
    if setup == "model-gcsfs":
        return _gcsfs_model(spec)
    return _dcp_load(setup, spec, prepared)


def digest(tensors: dict[str, Any]) -> list[int]:
    """[tensor count, crc32c of their bytes in name order, byte count], read in place (no copy)."""
    import torch

    from torchdata_gcs._ops.checksums import crc32c_extend

    crc = length = 0
    for name in sorted(tensors):
        tensor = tensors[name].contiguous().reshape(-1)
        if tensor.numel():
            crc = crc32c_extend(crc, memoryview(tensor.view(torch.uint8).numpy()))
            length += tensor.numel() * tensor.element_size()
    return [len(tensors), crc, length]


def _check(setup: str, spec: dict[str, Any], rank: int, loaded: Any) -> None:
    """Raise unless ``loaded`` holds what was stored (the ceiling: the whole file's bytes)."""
    from torchdata_gcs._ops.checksums import crc32c_extend

    workload = SETUPS[setup][0]
    if isinstance(loaded, bytearray):
        got, expected = [len(loaded), crc32c_extend(0, memoryview(loaded))], spec["file_crc"]
    else:
        got = digest(loaded)
        kind = {"dcp": None, "model": "model_digest"}.get(workload, "file_digest")
        expected = spec["dcp_digests"][rank] if kind is None else spec[kind]
    if got != expected:
        raise RuntimeError(f"{setup}, rank {rank}: loaded {got}, expected {expected}")


def rank_main(setup: str, spec: dict[str, Any], rank: int, world: int, init: str | None, out: Path) -> None:
    """One rank of ``setup``: barrier, load, barrier (the wall time between), then its PSS while every rank
    still holds its tensors, then the check; its result goes to ``out``/rank-N.json."""
    try:
        import torch.distributed as dist

        if world > 1:
            assert init is not None
            dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(minutes=15))  # fmt: skip
        barrier = dist.barrier if world > 1 else (lambda: None)
        if setup == "dcp-save":
            result = _dcp_save(spec, rank, barrier)
        else:
            prepared = _dcp_state(spec, rank, fill=False) if setup.startswith("dcp") else None
            gc.collect()
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # VmHWM from now
            rss, pss, cpu = _kib("/proc/self/status", "VmRSS"), _kib("/proc/self/smaps_rollup", "Pss"), _cpu()
            barrier()
            started = time.perf_counter()
            loaded = _load(setup, spec, rank, prepared)
            barrier()
            seconds = time.perf_counter() - started
            cpu = _cpu() - cpu
            held = _kib("/proc/self/smaps_rollup", "Pss") - pss
            barrier()  # every rank sampled while all of them held their tensors
            peak = _kib("/proc/self/status", "VmHWM") - rss
            _check(setup, spec, rank, loaded)
            result = {"seconds": seconds, "cpu_seconds": cpu, "pss_growth_kib": held, "peak_rss_growth_kib": peak}
            del loaded, prepared
        if world > 1:
            barrier()
            dist.destroy_process_group()
    except BaseException as exc:  # reported by the parent
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    if world > 1 and "error" in result:
        os._exit(1)  # the parent then stops the ranks still waiting for this one


def _dcp_save(spec: dict[str, Any], rank: int, barrier: Any) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from torchdata_gcs import WriteConfig
    from torchdata_gcs.dcp import GCSStorageWriter

    state = _dcp_state(spec, rank, fill=True)
    write = WriteConfig(strategy="compose", part_size=32 * MiB)  # the emulator lacks the XML multipart API
    barrier()
    started = time.perf_counter()
    dcp.save(state, storage_writer=GCSStorageWriter(f"gs://{BUCKET}/{CKPT}", client=_client(spec), write=write))
    return {"seconds": time.perf_counter() - started, "digest": digest(state)}


def child(setup: str, spec_file: str) -> dict[str, Any]:
    """``setup`` in this process (one rank) or in ranks forked from it; every rank's result."""
    import multiprocessing

    import torch  # noqa: F401 - imported once, before the ranks fork

    import torchdata_gcs.safetensors  # noqa: F401

    spec = json.loads(Path(spec_file).read_text())
    world = RANKS if setup == "dcp-save" else SETUPS[setup][1]
    _import_first(setup, spec)
    if setup.startswith(("dcp-gcsfs", "dcp-fsspec")):
        os.environ["TORCHDATA_GCS_FSSPEC"] = "0" if setup == "dcp-gcsfs" else "1"  # who serves gs://
    with tempfile.TemporaryDirectory(prefix="torchdata-gcs-weights-") as work:
        out = Path(work)
        if world == 1:
            rank_main(setup, spec, 0, 1, None, out)
        else:
            context = multiprocessing.get_context("fork")
            init = str(out / "init")
            ranks = [context.Process(target=rank_main, args=(setup, spec, r, world, init, out)) for r in range(world)]
            for process in ranks:
                process.start()
            deadline = time.monotonic() + spec["timeout"]
            while any(p.is_alive() for p in ranks) and time.monotonic() < deadline:
                if any(p.exitcode not in (None, 0) for p in ranks):
                    break
                time.sleep(0.2)
            for process in ranks:  # what failed or hangs is stopped: only the ranks this process started
                if process.is_alive():
                    process.join(5)
                if process.is_alive():
                    process.kill()
                    process.join()
        results = []
        for rank in range(world):
            path = out / f"rank-{rank}.json"
            results.append(json.loads(path.read_text()) if path.exists() else {"error": "no result (killed?)"})
    pids = {str(process.pid) for process in ranks} if world > 1 else set()
    leftover = sorted(p.name for p in Path("/dev/shm").glob("torchdata-gcs-*") if p.name.split("-")[2] in pids)
    return {"setup": setup, "ranks": results, "shm_left": leftover}


def _import_first(setup: str, spec: dict[str, Any]) -> None:
    """What ``setup`` uses, imported before anything is timed (and before any rank forks)."""
    import safetensors.torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import urllib3  # noqa: F401

    if "runai" in setup:
        _runai(spec)
    if "gcsfs" in setup:
        import gcsfs  # noqa: F401


# --- where the time of one load goes ---------------------------------------------------------------------


def profile_child(spec_file: str, loads: int) -> dict[str, Any]:
    """``load_file`` of the 1 GiB file ``loads`` times with each stage timed on the I/O loop's thread, where
    the whole load runs: waiting in epoll, socket reads into the buffer (the asyncio transport's
    ``_read_ready__get_buffer``: ``recv_into`` and the protocol's bookkeeping; the buffer's first-touch page
    faults land here), crc32c as the bytes land, and tensor building (``torch.empty``, header parse, views)."""
    import asyncio.selector_events as selector_events

    import torch

    from torchdata_gcs import safetensors
    from torchdata_gcs._engines import tensor_files
    from torchdata_gcs._ops import reads
    from torchdata_gcs._transport.loop import io_loop

    spec = json.loads(Path(spec_file).read_text())
    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    window = [0.0]  # when the load being timed started: a call that began before counts from there

    def timed(stage: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[stage] += time.perf_counter() - max(started, window[0])
                calls[stage] += 1

        return wrapper

    transport = selector_events._SelectorSocketTransport
    transport._read_ready__get_buffer = timed("receive", transport._read_ready__get_buffer)  # type: ignore[method-assign]
    reads.crc32c_extend = timed("crc32c", reads.crc32c_extend)
    for name in ("parse_header", "tensors_of"):
        setattr(tensor_files, name, timed("tensor build", getattr(tensor_files, name)))
    torch.empty = timed("tensor build", torch.empty)
    selector = io_loop()._selector  # type: ignore[attr-defined]
    selector.select = timed("waiting (epoll)", selector.select)
    runs = []
    for _ in range(loads):
        gc.collect()
        spent.clear()
        calls.clear()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = window[0] = time.perf_counter()
        loaded = safetensors.load_file(f"gs://{BUCKET}/{ONE}", client=_client(spec))
        wall = time.perf_counter() - started
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        runs.append({"wall": wall, "stages": dict(spent), "calls": dict(calls), "page_faults": faults})
        _check("file-ours", spec, 0, loaded)
        del loaded
    return {"runs": runs}


# --- the parent: data, rounds, figures ---------------------------------------------------------------------


def run_child(args: list[str], timeout: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.weights", "--child", *args]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0 or not done.stdout.strip():
        return {"error": f"exit {done.returncode}: {done.stderr[-3000:]}"}
    result = json.loads(done.stdout.splitlines()[-1])
    errors = [r["error"] + "\n" + r.get("traceback", "") for r in result.get("ranks", []) if "error" in r]
    if errors:
        return {"error": errors[0], **result}
    return result


def make_data(scale: int) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The objects (the single file, the shards and their index) and what a load of each must give."""
    import safetensors.torch
    import torch

    from torchdata_gcs._ops.checksums import crc32c_extend

    objects: dict[str, bytes] = {}
    per_tensor = 1024 * MiB // scale // FILE_TENSORS // 4
    tensors = {f"t{i:02d}": torch.rand(per_tensor) for i in range(FILE_TENSORS)}
    objects[ONE] = safetensors.torch.save(tensors)
    expected = {"file_digest": digest(tensors), "file_bytes": len(objects[ONE])}
    expected["file_crc"] = [len(objects[ONE]), crc32c_extend(0, objects[ONE])]
    per_tensor = 1024 * MiB // scale // SHARDS // SHARD_TENSORS // 4
    model, weight_map = {}, {}
    for shard in range(SHARDS):
        part = {f"layer{shard}.w{i}": torch.rand(per_tensor) for i in range(SHARD_TENSORS)}
        name = f"model-{shard + 1:05d}-of-{SHARDS:05d}.safetensors"
        objects[f"{MODEL}/{name}"] = safetensors.torch.save(part)
        weight_map.update(dict.fromkeys(part, name))
        model.update(part)
    total = sum(t.numel() * t.element_size() for t in model.values())
    objects[f"{MODEL}/{INDEX}"] = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}).encode()
    expected["model_digest"] = digest(model)
    expected["model_bytes"] = sum(len(data) for name, data in objects.items() if name.startswith(MODEL + "/"))
    return objects, expected


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(runs: dict[str, list[dict[str, Any]]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per setup: medians over the rounds of the wall time (the slowest rank's), MB/s, CPU and memory."""
    rows = []
    for setup, results in runs.items():
        workload, world, label = SETUPS[setup]
        good = [r for r in results if "error" not in r]
        walls = [max(rank["seconds"] for rank in r["ranks"]) for r in good]
        moved = {"file": spec["file_bytes"], "node": spec["file_bytes"], "model": spec["model_bytes"]}
        data = moved.get(workload, spec["dcp_bytes"])
        row: dict[str, Any] = {
            "workload": workload,
            "setup": setup,
            "label": label.format(**spec["versions"]),
            "ranks": world,
            "seconds": median(walls),
            "all_seconds": walls,
            "mb_per_s": data / 1e6 / median(walls) if walls else None,
            "cpu_seconds": median([sum(rank["cpu_seconds"] for rank in r["ranks"]) for r in good]),
            "pss_growth_mib": median([sum(rank["pss_growth_kib"] for rank in r["ranks"]) / 1024 for r in good]),
            "peak_rss_growth_mib": median(
                [max(rank["peak_rss_growth_kib"] for rank in r["ranks"]) / 1024 for r in good]
            ),
            "bytes": data,
            "failures": [r["error"][:2000] for r in results if "error" in r],
            "shm_left": sorted({name for r in results for name in r.get("shm_left", [])}),
        }
        row["pss_vs_data"] = row["pss_growth_mib"] * MiB / data if row["pss_growth_mib"] else None
        rows.append(row)
    return rows


def goals(
    runs: dict[str, list[dict[str, Any]]], rows: list[dict[str, Any]], spec: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each goal: the ratio of the medians, and the median of each round's own ratio."""
    by = {row["setup"]: row for row in rows}

    def per_round(top: str, bottom: str) -> float | None:
        pairs = zip(runs.get(top, []), runs.get(bottom, []), strict=False)
        walls = [
            [max(x["seconds"] for x in r["ranks"]) for r in pair]
            for pair in pairs
            if all("error" not in r for r in pair)
        ]
        return median([a / b for a, b in walls])

    out = []
    for what, top, bottom, goal, at_least in (
        (f"one file: ours at least {SPEED_GOAL}x Run:ai's speed", "file-runai", "file-ours", SPEED_GOAL, True),
        (f"8 shards: ours at least {SPEED_GOAL}x Run:ai's speed", "model-runai", "model-ours", SPEED_GOAL, True),
        (
            f"4 ranks with process_group: wall at most {WALL_GOAL}x one rank alone",
            "node-shared",
            "node-alone",
            WALL_GOAL,
            False,
        ),
    ):
        if by.get(top, {}).get("seconds") and by.get(bottom, {}).get("seconds"):
            ratio = by[top]["seconds"] / by[bottom]["seconds"]
            met = ratio >= goal if at_least else ratio <= goal
            out.append({"goal": what, "ratio": ratio, "median_round_ratio": per_round(top, bottom), "met": met})
    shared = by.get("node-shared", {}).get("pss_vs_data")
    if shared:
        what = f"4 ranks with process_group: PSS growth at most {MEMORY_GOAL}x the file"
        out.append({"goal": what, "ratio": shared, "median_round_ratio": None, "met": shared <= MEMORY_GOAL})
    return out


def _f(value: float | None, spec: str = ",.2f") -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | setup | s (median) | each round | MB/s | client CPU s | peak RSS growth MiB (max rank) "
        "| PSS growth MiB (sum of ranks) | x data |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        each = ", ".join(f"{s:.2f}" for s in r["all_seconds"]) + (
            f"; {len(r['failures'])} failed" if r["failures"] else ""
        )
        lines.append(
            f"| {r['workload']} | {r['label']} | {_f(r['seconds'])} | {each} | {_f(r['mb_per_s'], ',.0f')} "
            f"| {_f(r['cpu_seconds'])} | {_f(r['peak_rss_growth_mib'], ',.0f')} | {_f(r['pss_growth_mib'], ',.0f')} "
            f"| {_f(r['pss_vs_data'])} |"
        )
    return "\n".join(lines)


def profile_summary(result: dict[str, Any], file_bytes: int) -> dict[str, Any]:
    """Stage shares of the profiled loads' total wall time; what no stage timer covers is 'other'."""
    if "error" in result:
        return result
    wall = sum(run["wall"] for run in result["runs"])
    stages: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for run in result["runs"]:
        stages.update(run["stages"])
        calls.update(run["calls"])
    stages["other (Python and asyncio on the loop, hand-offs)"] = wall - sum(stages.values())
    return {
        "loads": len(result["runs"]),
        "wall_seconds": [run["wall"] for run in result["runs"]],
        "share": {stage: seconds / wall for stage, seconds in stages.most_common()},
        "seconds_per_load": {stage: seconds / len(result["runs"]) for stage, seconds in stages.most_common()},
        "bytes_per_socket_read": file_bytes * len(result["runs"]) / calls["receive"] if calls["receive"] else None,
        "calls_per_load": {stage: n / len(result["runs"]) for stage, n in calls.items()},
        "page_faults_per_load": statistics.median(run["page_faults"] for run in result["runs"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="rounds; every figure is a median over them")
    parser.add_argument("--quick", action="store_true", help="a sixteenth of the data, to check the rig")
    parser.add_argument("--only", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    parser.add_argument("--dcp-tensors", type=int, default=8, help="tensors per rank in the DCP checkpoint")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one setup's run may take")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "weights.json")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = profile_child(args.child[1], int(args.child[2])) if args.child[0] == "profile" else child(*args.child)
        print(json.dumps(result))
        return
    scale = 16 if args.quick else 1
    if args.quick and args.json == HERE / "results" / "weights.json":
        args.json = HERE / "results" / "partial" / "weights.json"  # a check of the rig replaces no result

    from torchdata_gcs.testing import Emulator

    started = time.perf_counter()
    load_at_start = list(os.getloadavg())
    print(f"load average at start: {load_at_start}", flush=True)
    objects, expected = make_data(scale)
    work = Path(tempfile.mkdtemp(prefix="torchdata-gcs-weights-bench-"))
    runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in args.only}
    round_loads: list[list[float]] = []
    try:
        with Emulator(backend="filesystem", memory_limit="8GiB") as emulator:
            emulator.seed(BUCKET, objects, concurrency=8)
            del objects
            spec = {
                "endpoint": emulator.endpoint,
                "timeout": args.timeout,
                "dcp_tensors": args.dcp_tensors,
                "dcp_numel": 256 * MiB // scale // args.dcp_tensors // 4,
                "dcp_bytes": RANKS * (256 * MiB // scale // args.dcp_tensors // 4) * 4 * args.dcp_tensors,
                "versions": {
                    n: version(p)
                    for n, p in (
                        ("ours", "torchdata-gcs"),
                        ("runai", "runai-model-streamer"),
                        ("gcsfs", "gcsfs"),
                        ("urllib3", "urllib3"),
                    )
                },  # fmt: skip
                **expected,
            }
            spec_file = work / "spec.json"
            spec_file.write_text(json.dumps(spec))
            saved = run_child(["dcp-save", str(spec_file)], args.timeout)
            if "error" in saved:
                raise SystemExit(f"the DCP checkpoint could not be saved: {saved['error']}")
            spec["dcp_digests"] = [rank["digest"] for rank in saved["ranks"]]
            spec_file.write_text(json.dumps(spec))
            save_seconds = max(rank["seconds"] for rank in saved["ranks"])
            print(
                f"seeded and saved in {time.perf_counter() - started:.1f} s (DCP save {save_seconds:.1f} s)", flush=True
            )
            for round_ in range(args.runs):
                order = args.only[round_ % len(args.only) :] + args.only[: round_ % len(args.only)]
                order = order[::-1] if round_ % 2 else order  # each setup follows different ones
                for setup in order:
                    result = run_child([setup, str(spec_file)], args.timeout)
                    runs[setup].append(result)
                    if "error" in result:
                        print(f"  {setup} failed: {result['error'][:400]}", flush=True)
                round_loads.append(list(os.getloadavg()))
                print(f"round {round_ + 1} of {args.runs} done, load {round_loads[-1]}", flush=True)
            profile = run_child(["profile", str(spec_file), str(max(args.runs, 3))], args.timeout)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    rows = summarize(runs, spec)
    met = goals(runs, rows, spec)
    stages = profile_summary(profile, spec["file_bytes"])
    command = " ".join([".bench-venv/bin/python -m benchmarks.weights", *sys.argv[1:]])
    minutes = (time.perf_counter() - started) / 60
    print(f"\n{command}: {minutes:.1f} min on {os.cpu_count()} cores; load average {load_at_start} at start, "
          f"{list(os.getloadavg())} at end. The 4-rank rows run 4 processes on these {os.cpu_count()} cores "
          "(with the emulator and its guard): they compete for CPU.\n")  # fmt: skip
    print(table(rows))
    for goal in met:
        each = (
            ""
            if goal["median_round_ratio"] is None
            else f" (median of each round's own: {goal['median_round_ratio']:.2f}x)"
        )
        print(f"- {goal['goal']}: {goal['ratio']:.2f}x{each}, {'met' if goal['met'] else 'MISSED'}")
    if "share" in stages:
        print(f"- where our {spec['file_bytes'] / MiB:,.0f} MiB load's wall time goes ({stages['loads']} loads, "
              f"{', '.join(f'{s:.2f}' for s in stages['wall_seconds'])} s timed): "
              + ", ".join(f"{k} {v:.1%}" for k, v in stages["share"].items())
              + f"; {stages['bytes_per_socket_read'] / MiB:.2f} MiB per socket read, "
              f"{stages['page_faults_per_load']:,.0f} minor page faults per load")  # fmt: skip
    report = {
        "command": command,
        "date": datetime.date.today().isoformat(),
        "minutes": minutes,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}",
        "load_average": {"start": load_at_start, "after_each_round": round_loads},
        "file_bytes": spec["file_bytes"],
        "model_bytes": spec["model_bytes"],
        "dcp_bytes": spec["dcp_bytes"],
        "dcp_tensors_per_rank": args.dcp_tensors,
        "dcp_save_seconds": save_seconds,
        "versions": spec["versions"],
        "rows": rows,
        "goals": met,
        "profile": stages,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
