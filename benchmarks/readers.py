"""One benchmark measurement in its own process: a reader (ours or a peer) on one workload.

Run by ``benchmarks/run.py`` as ``python -m benchmarks.readers`` with a JSON spec on stdin; prints
one JSON line with the median seconds, the bytes and objects moved, and the peak memory growth of
this process. Every object of every run is checked (size and crc32c) as it arrives.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import http.client
import io
import json
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # else gcsfs calls a gRPC API first

import google_crc32c

T = TypeVar("T")


@dataclass(frozen=True)
class Spec:
    """What to measure: passed from the runner as JSON."""

    workload: str  # small | large | listing | checkpoint | compression
    reader: str
    endpoint: str
    bucket: str
    prefix: str
    manifest: dict[str, list[int]]  # name -> [size, crc32c]; empty for checkpoints
    runs: int
    threads: int = 16
    checkpoint_mib: int = 512
    real_weights: str = ""  # a saved trained state (compression workload)
    budget_seconds: float = 30.0  # no further runs once the runs so far took this long
    heap_objects: int = 0  # live Python objects held before reading, as a training process holds them
    source: str = ""  # a source tree to import torchdata_gcs from (another version's rows), else the installed one


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (a reader's worker processes)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _reset_peak_rss() -> int:
    """Reset this process's peak RSS (Linux ``clear_refs`` 5) and return the current RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return _status_kib("VmRSS")


def _gcs_client(spec: Spec) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="bench", credentials=AnonymousCredentials(), client_options={"api_endpoint": spec.endpoint}
    )


def _gcs_bucket(spec: Spec) -> Any:
    return _gcs_client(spec).bucket(spec.bucket)


def _gcsfs(spec: Spec) -> Any:
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=spec.endpoint, token="anon", project="bench")


def _names(spec: Spec) -> list[str]:
    return sorted(spec.manifest)


# --- readers of a known list of objects: return {name: bytes} -------------------------------


def read_gcs_loop(spec: Spec) -> Iterator[tuple[str, bytes]]:
    bucket = _gcs_bucket(spec)
    return ((name, bucket.blob(name).download_as_bytes()) for name in _names(spec))


def read_gcs_threads(spec: Spec) -> Iterator[tuple[str, bytes]]:
    bucket = _gcs_bucket(spec)
    names = _names(spec)
    with ThreadPoolExecutor(spec.threads) as pool:
        yield from zip(names, pool.map(lambda name: bucket.blob(name).download_as_bytes(), names), strict=True)


def read_gcsfs_cat(spec: Spec) -> Iterator[tuple[str, bytes]]:
    return _fsspec_cat(_gcsfs(spec), spec)


def _our_fsspec(spec: Spec) -> Any:
    """Our fsspec filesystem, made from the same storage options as gcsfs's (as a drop-in would be)."""
    from torchdata_gcs.fsspec import GCSFileSystem

    return GCSFileSystem(endpoint_url=spec.endpoint, token="anon", project="bench")


def _fsspec_cat(fs: Any, spec: Spec) -> Iterator[tuple[str, bytes]]:
    result = fs.cat([f"{spec.bucket}/{name}" for name in _names(spec)])  # everything, at once
    return ((path.split("/", 1)[1], data) for path, data in result.items())


def _fsspec_open_read(fs: Any, spec: Spec) -> Iterator[tuple[str, bytes]]:
    """Each object by ``open(path, "rb").read()``, one after the other, as a script reading files would."""
    for name in _names(spec):
        with fs.open(f"{spec.bucket}/{name}", "rb") as file:
            yield name, file.read()


def read_fsspec_cat(spec: Spec) -> Iterator[tuple[str, bytes]]:
    return _fsspec_cat(_our_fsspec(spec), spec)


def read_gcsfs_open_read(spec: Spec) -> Iterator[tuple[str, bytes]]:
    return _fsspec_open_read(_gcsfs(spec), spec)


def read_fsspec_open_read(spec: Spec) -> Iterator[tuple[str, bytes]]:
    return _fsspec_open_read(_our_fsspec(spec), spec)


def read_torchdata_fsspec(spec: Spec) -> Iterator[tuple[str, bytes]]:
    from torchdata.datapipes.iter import IterableWrapper

    options = {"endpoint_url": spec.endpoint, "token": "anon", "project": "bench"}
    pipe = IterableWrapper([f"gs://{spec.bucket}/{spec.prefix}"]).list_files_by_fsspec(**options)
    pipe = pipe.open_files_by_fsspec(mode="rb", **options)
    return ((url.split("/", 3)[3], stream.read()) for url, stream in pipe)


def read_obstore(spec: Spec) -> Iterator[tuple[str, bytes]]:
    """Rust obstore (object_store's GCS store, unsigned requests to the emulator): every GET started at
    once with ``get_async``, at most 64 in flight."""
    import obstore
    from obstore.store import GCSStore

    store = GCSStore(spec.bucket, base_url=spec.endpoint, skip_signature=True, client_options={"allow_http": True})
    names = _names(spec)

    async def main() -> list[bytes]:
        slots = asyncio.Semaphore(64)

        async def fetch(name: str) -> bytes:
            async with slots:
                result = await obstore.get_async(store, name)
                return bytes(await result.bytes_async())

        return await asyncio.gather(*(fetch(name) for name in names))

    return zip(names, asyncio.run(main()), strict=True)


def _our_client(spec: Spec) -> Any:
    from torchdata_gcs import ClientConfig

    return ClientConfig(endpoint=spec.endpoint, anonymous=True)


def read_ours(spec: Spec) -> Iterator[tuple[str, bytes]]:
    """load_files_by_gcs (default settings) on the known URLs, like the peers that are given the names."""
    from torchdata_gcs import GCSFileLoaderIterDataPipe

    urls = [f"gs://{spec.bucket}/{name}" for name in _names(spec)]
    pipe = GCSFileLoaderIterDataPipe(urls, client=_our_client(spec))
    return ((url.split("/", 3)[3], stream.read()) for url, stream in pipe)


def read_ours_pipeline(spec: Spec) -> Iterator[tuple[str, bytes]]:
    """list_files_by_gcs -> load_files_by_gcs from the prefix, like torchdata's fsspec pipeline."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    client = _our_client(spec)
    pipe = IterableWrapper([f"gs://{spec.bucket}/{spec.prefix}"]).list_files_by_gcs(client=client, with_metadata=True)
    pipe = pipe.load_files_by_gcs(client=client)
    return ((url.split("/", 3)[3], stream.read()) for url, stream in pipe)


def read_ours_compose(spec: Spec) -> Iterator[tuple[str, bytes]]:
    """list_files_by_gcs -> compose_shards_by_gcs: groups of 32 objects composed, read once, split."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    client = _our_client(spec)
    pipe = IterableWrapper([f"gs://{spec.bucket}/{spec.prefix}"]).list_files_by_gcs(client=client, with_metadata=True)
    pipe = pipe.compose_shards_by_gcs(client=client)
    return ((url.split("/", 3)[3], stream.read()) for url, stream in pipe)


def read_ceiling(spec: Spec) -> Iterable[tuple[str, bytes]]:
    """The fastest raw parallel GET loop we could write, with no per-object work.

    Small objects: aiohttp on one session, every request started at once over up to 128 connections
    (the best of 8 to 256 at 0 and 20 ms here).
    Large objects: one urllib3 GET per object in a thread each (on loopback, splitting an object
    into ranges was slower than one stream).
    """
    large = max(size for size, _ in spec.manifest.values()) > 16 * 1024 * 1024
    return read_raw_urllib3(spec) if large else read_raw_aiohttp(spec)


def read_raw_urllib3(spec: Spec) -> list[tuple[str, bytes]]:
    """One urllib3 GET per object, up to 64 threads; certificates as ``SSL_CERT_FILE`` says."""
    import urllib3

    base = f"{spec.endpoint}/download/storage/v1/b/{spec.bucket}/o/"
    names = _names(spec)
    pool = urllib3.PoolManager(maxsize=min(len(names), 64), retries=False)
    with ThreadPoolExecutor(min(len(names), 64)) as threads:
        bodies = threads.map(lambda name: pool.request("GET", base + quote(name, safe="") + "?alt=media").data, names)
        return list(zip(names, bodies, strict=True))


RANGE_THREADS = 32
"""Threads of the ranged urllib3 reader: every 32 MiB range of the three 256 MiB objects at once."""

RANGE_SIZE = 32 * 1024 * 1024
"""The ranged urllib3 reader's ranges: our ``part_size``, so both send the same requests."""


def read_range(answer: Any, view: memoryview, start: int, end: int, url: str) -> None:
    """Read ``answer``'s body (bytes ``start`` to ``end`` of the object at ``url``) into its place in ``view``."""
    position = start
    while position < end:
        got = answer.readinto(view[position:end])
        if not got:
            raise SystemExit(f"range {start}-{end} of {url} stopped at {position}")
        position += got


def ranges_into(pool: Any, url: str, view: memoryview, step: int, threads: ThreadPoolExecutor) -> list[Any]:
    """Start one urllib3 GET per ``step`` bytes of ``view``'s object at ``url``, each range read into its
    place in ``view``; the futures of the ranges."""

    def fetch(start: int) -> None:
        end = min(start + step, len(view))
        answer = pool.request("GET", url, headers={"Range": f"bytes={start}-{end - 1}"}, preload_content=False)
        read_range(answer, view, start, end, url)
        answer.release_conn()

    return [threads.submit(fetch, start) for start in range(0, len(view), step)]


def read_raw_urllib3_ranges(spec: Spec) -> Iterator[tuple[str, bytes]]:
    """Every object as 32 MiB ranged GETs into one ``bytes`` of its size (written in place through a
    ``BytesIO`` that shares it, taken back without a copy), all ranges of all objects in
    :data:`RANGE_THREADS` urllib3 threads; objects handed over in order as their ranges finish."""
    import urllib3

    base = f"{spec.endpoint}/download/storage/v1/b/{spec.bucket}/o/"
    pool = urllib3.PoolManager(maxsize=RANGE_THREADS, retries=False)
    with ThreadPoolExecutor(RANGE_THREADS) as threads:
        started = []
        for name in _names(spec):
            holder = io.BytesIO(bytes(spec.manifest[name][0]))
            url = base + quote(name, safe="") + "?alt=media"
            view = holder.getbuffer()
            started.append((name, holder, view, ranges_into(pool, url, view, RANGE_SIZE, threads)))
        for name, holder, view, ranges in started:
            for done in ranges:
                done.result()
            view.release()
            yield name, holder.getvalue()


def read_raw_aiohttp(spec: Spec) -> list[tuple[str, bytes]]:
    """Every GET started at once on one aiohttp session, up to 128 connections."""
    import aiohttp

    base = f"{spec.endpoint}/download/storage/v1/b/{spec.bucket}/o/"
    names = _names(spec)

    async def main() -> list[tuple[str, bytes]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=128)) as session:

            async def fetch(name: str) -> bytes:
                async with session.get(base + quote(name, safe="") + "?alt=media") as response:
                    return await response.read()

            return list(zip(names, await asyncio.gather(*(fetch(name) for name in names)), strict=True))

    return asyncio.run(main())


def _dataflux_mapstyle(spec: Spec, compose: bool) -> Iterator[tuple[str, bytes]]:
    """Dataflux's map-style dataset in a DataLoader with 2 workers (its fastest setup here).

    Workers build their own clients from STORAGE_EMULATOR_HOST (a client shared across the fork
    intermittently corrupted composite downloads). fake-gcs-server has no testIamPermissions, so
    the compose path needs Dataflux's permission probe skipped.
    """
    from dataflux_pytorch import dataflux_mapstyle_dataset as mapstyle
    from torch.utils.data import DataLoader

    os.environ["STORAGE_EMULATOR_HOST"] = spec.endpoint
    mapstyle._get_missing_permissions = lambda **kwargs: []
    config = mapstyle.Config(prefix=spec.prefix, num_processes=os.cpu_count() or 2, disable_compose=not compose)
    dataset = mapstyle.DataFluxMapStyleDataset("bench", spec.bucket, config=config, storage_client=None)
    names = [name for name, _ in dataset.objects]
    loader = DataLoader(dataset, batch_size=32, num_workers=2, collate_fn=list)
    return zip(names, (data for batch in loader for data in batch), strict=True)


def read_dataflux_compose(spec: Spec) -> Iterator[tuple[str, bytes]]:
    return _dataflux_mapstyle(spec, compose=True)


def read_dataflux_direct(spec: Spec) -> Iterator[tuple[str, bytes]]:
    return _dataflux_mapstyle(spec, compose=False)


def _read_pair(url: str, stream: Any) -> tuple[str, bytes]:
    return url.split("/", 3)[3], stream.read()


def read_ours_map_dataset(spec: Spec) -> Iterator[tuple[str, bytes]]:
    """GCSMapDataset in a DataLoader with 2 workers and batches of 32, set up as Dataflux's is."""
    from torch.utils.data import DataLoader

    from torchdata_gcs import GCSMapDataset

    dataset = GCSMapDataset(f"gs://{spec.bucket}/{spec.prefix}", transform=_read_pair, client=_our_client(spec))
    return (item for batch in DataLoader(dataset, batch_size=32, num_workers=2, collate_fn=list) for item in batch)


class _OneRequestPerItem:
    """A map-style dataset that reads each item with one blocking GET when it is asked for, as
    s3torchconnector's map-style dataset does (here through google-cloud-storage, a client per worker)."""

    def __init__(self, spec: Spec) -> None:
        self.spec, self.names, self.bucket = spec, _names(spec), None

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[str, bytes]:
        if self.bucket is None:
            self.bucket = _gcs_bucket(self.spec)
        return self.names[index], self.bucket.blob(self.names[index]).download_as_bytes()


def read_per_item_dataset(spec: Spec) -> Iterator[tuple[str, bytes]]:
    from torch.utils.data import DataLoader

    loader = DataLoader(_OneRequestPerItem(spec), batch_size=32, num_workers=2, collate_fn=list)  # type: ignore[arg-type]
    return (item for batch in loader for item in batch)


READERS: dict[str, Callable[[Spec], Iterable[tuple[str, bytes]]]] = {
    "gcs_loop": read_gcs_loop,
    "gcs_threads": read_gcs_threads,
    "gcsfs_cat": read_gcsfs_cat,
    "gcsfs_open_read": read_gcsfs_open_read,
    "fsspec_cat": read_fsspec_cat,
    "fsspec_open_read": read_fsspec_open_read,
    "obstore": read_obstore,
    "torchdata_fsspec": read_torchdata_fsspec,
    "dataflux_compose": read_dataflux_compose,
    "dataflux_direct": read_dataflux_direct,
    "ours": read_ours,
    "ours_pipeline": read_ours_pipeline,
    "ours_compose": read_ours_compose,
    "ours_map_dataset": read_ours_map_dataset,
    "per_item_dataset": read_per_item_dataset,
    "ceiling": read_ceiling,
    "raw_urllib3": read_raw_urllib3,
    "raw_urllib3_ranges": read_raw_urllib3_ranges,
    "raw_aiohttp": read_raw_aiohttp,
}


# --- listers: return the sorted object names ----------------------------------------------------


def list_gcs(spec: Spec) -> Iterable[str]:
    return (blob.name for blob in _gcs_client(spec).list_blobs(spec.bucket, prefix=spec.prefix))


def list_gcsfs(spec: Spec) -> Iterable[str]:
    return sorted(path.split("/", 1)[1] for path in _gcsfs(spec).find(f"{spec.bucket}/{spec.prefix}"))


def _list_ours(spec: Spec, concurrency: int) -> Iterable[str]:
    from torchdata_gcs import GCSFileListerIterDataPipe

    url = f"gs://{spec.bucket}/{spec.prefix}"
    lister = GCSFileListerIterDataPipe(url, client=_our_client(spec), concurrency=concurrency)
    return (url.split("/", 3)[3] for url in lister)


def list_ours(spec: Spec) -> Iterable[str]:
    return _list_ours(spec, spec.threads)


def list_ours_sequential(spec: Spec) -> Iterable[str]:
    return _list_ours(spec, 1)


def list_dataflux(spec: Spec) -> Iterable[str]:
    from dataflux_core.fast_list import ListingController

    os.environ["STORAGE_EMULATOR_HOST"] = spec.endpoint
    controller = ListingController(spec.threads, "bench", spec.bucket, prefix=spec.prefix, sort_results=True)
    return [name for name, _ in controller.run()]


LISTERS: dict[str, Callable[[Spec], Iterable[str]]] = {
    "gcs_loop": list_gcs,
    "gcsfs_find": list_gcsfs,
    "dataflux_list": list_dataflux,
    "ours_sequential": list_ours_sequential,
    "ours": list_ours,
}


# --- checkpoints: save then load a state dict -----------------------------------------------------


def _state_dict(spec: Spec) -> Any:
    import torch

    if spec.real_weights:  # the compression workload: a trained model and its optimizer state
        return torch.load(spec.real_weights, weights_only=True)
    generator = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(2048, 2048, generator=generator) for i in range(spec.checkpoint_mib // 16)}


class Checkpointer:
    """Saves a state dict as one object and loads it back, one library's way."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def prepare(self, state: Any) -> None:
        """Work done once before the timed saves (nothing, but for the raw ceiling)."""

    def notes(self) -> dict[str, Any]:
        """Figures of its own for the results (the raw ceiling's seconds of ``torch.save``)."""
        return {}

    def save(self, state: Any, name: str) -> None:
        raise NotImplementedError

    def load(self, name: str) -> Any:
        raise NotImplementedError

    def same(self, loaded: Any, state: Any) -> bool:
        """Whether a load gave back what was saved."""
        return _same(loaded, state)


class Ours(Checkpointer):
    """checkpoint.save / checkpoint.load with the defaults, or a given strategy or compression."""

    def _settings(self) -> Any:
        from torchdata_gcs import WriteConfig, Zstd

        reader = self.spec.reader
        if reader == "ours_compose":
            return WriteConfig(strategy="compose")
        if reader == "ours_16":
            return WriteConfig(max_parts_in_flight=16)
        if reader.startswith("zstd"):  # zstd-LEVEL, zstd-LEVEL-plain
            _, level, *plain = reader.split("-")
            return WriteConfig(compression=Zstd(level=int(level), byte_grouping=not plain))
        return WriteConfig()

    def save(self, state: Any, name: str) -> None:
        from torchdata_gcs import ClientConfig, checkpoint

        url = f"gs://{self.spec.bucket}/{name}"
        checkpoint.save(state, url, client=ClientConfig(endpoint=self.spec.endpoint), write=self._settings())

    def load(self, name: str) -> Any:
        from torchdata_gcs import ClientConfig, checkpoint

        return checkpoint.load(f"gs://{self.spec.bucket}/{name}", client=ClientConfig(endpoint=self.spec.endpoint))


class Dcp(Checkpointer):
    """torch.distributed.checkpoint through GCSStorageWriter/GCSStorageReader (one process): a folder of
    ``.metadata`` and one data file. DCP loads into existing tensors, so the load first allocates them
    from the metadata, as a training script's model would have (their memory counts, as a load's result
    does in the other rows)."""

    def save(self, state: Any, name: str) -> None:
        import torch.distributed.checkpoint as dcp

        from torchdata_gcs import ClientConfig
        from torchdata_gcs.dcp import GCSStorageWriter

        url = f"gs://{self.spec.bucket}/{name}"
        dcp.save(state, storage_writer=GCSStorageWriter(url, client=ClientConfig(endpoint=self.spec.endpoint)))

    def load(self, name: str) -> Any:
        import torch
        import torch.distributed.checkpoint as dcp

        from torchdata_gcs import ClientConfig
        from torchdata_gcs.dcp import GCSStorageReader

        reader = GCSStorageReader(f"gs://{self.spec.bucket}/{name}", client=ClientConfig(endpoint=self.spec.endpoint))
        tensors = reader.read_metadata().state_dict_metadata
        state = {key: torch.empty(meta.size, dtype=meta.properties.dtype) for key, meta in tensors.items()}
        dcp.load(state, storage_reader=reader)
        return state


class UploadFromFile(Checkpointer):
    """torch.save into memory, then ``blob.upload_from_file`` (one resumable stream); load with
    ``blob.download_as_bytes`` (one stream)."""

    def save(self, state: Any, name: str) -> None:
        import torch

        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        _gcs_bucket(self.spec).blob(name, chunk_size=32 * 1024 * 1024).upload_from_file(buffer)

    def load(self, name: str) -> Any:
        import torch

        return torch.load(io.BytesIO(_gcs_bucket(self.spec).blob(name).download_as_bytes()), weights_only=True)


class Gcsfs(Checkpointer):
    def save(self, state: Any, name: str) -> None:
        import torch

        with _gcsfs(self.spec).open(f"{self.spec.bucket}/{name}", "wb") as file:
            torch.save(state, file)

    def load(self, name: str) -> Any:
        import torch

        with _gcsfs(self.spec).open(f"{self.spec.bucket}/{name}", "rb") as file:
            return torch.load(file, weights_only=True)


class Dataflux(Checkpointer):
    def _checkpoint(self) -> Any:
        from dataflux_pytorch.dataflux_checkpoint import DatafluxCheckpoint

        os.environ["STORAGE_EMULATOR_HOST"] = self.spec.endpoint
        return DatafluxCheckpoint(project_name="bench", bucket_name=self.spec.bucket)

    def save(self, state: Any, name: str) -> None:
        import torch

        with self._checkpoint().writer(name) as file:
            torch.save(state, file)

    def load(self, name: str) -> Any:
        import torch

        with self._checkpoint().reader(name) as file:
            return torch.load(file, weights_only=True)


RAW_STREAMS = 16
"""Parts uploaded, and ranges read, at once by the raw checkpoint ceiling."""


class RawCheckpoint(Checkpointer):
    """The raw ceiling of a checkpoint through the same front: ``torch.save`` into memory, then the bytes sent
    as :data:`RAW_STREAMS` parts at once (XML API multipart upload, or part objects composed and then deleted
    for ``raw_compose``); read back as as many ranged GETs at once, each read by the socket straight into its
    place in one buffer. ``http.client`` on a kept-alive connection per thread; no checksum, no retry, no
    decoding (the load returns the bytes). The seconds of each ``torch.save`` are kept apart, so the
    transfer's own ceiling can be told too."""

    def prepare(self, state: Any) -> None:
        self.threads = ThreadPoolExecutor(RAW_STREAMS)
        self.local = threading.local()
        self.address = urlsplit(self.spec.endpoint).netloc
        self.serialize_seconds: list[float] = []

    def _send(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """The answer to one request on this thread's connection, its body unread; exits on an error status."""
        if not hasattr(self.local, "connection"):
            self.local.connection = http.client.HTTPConnection(self.address, timeout=300)
        self.local.connection.request(method, path, body=body, headers=headers or {})
        answer = self.local.connection.getresponse()
        if answer.status >= 300:
            raise SystemExit(f"{method} {path}: {answer.status} {answer.read()[:200]!r}")
        return answer

    def _ask(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        answer = self._send(method, path, body, headers)
        return answer.getheaders(), answer.read()

    def save(self, state: Any, name: str) -> None:
        import torch

        started = time.perf_counter()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.data = buffer.getbuffer()
        self.serialize_seconds.append(time.perf_counter() - started)
        self.step = -(-len(self.data) // RAW_STREAMS)
        pieces = [self.data[start : start + self.step] for start in range(0, len(self.data), self.step)]
        if self.spec.reader == "raw_compose":
            self._compose(name, pieces)
        else:
            self._multipart(name, pieces)

    def _multipart(self, name: str, pieces: list[memoryview]) -> None:
        path = f"/{self.spec.bucket}/{quote(name, safe='')}"
        _, started = self._ask("POST", path + "?uploads")
        upload_id = re.search(r"<UploadId>([^<]+)</UploadId>", started.decode()).group(1)  # type: ignore[union-attr]

        def put(number: int) -> str:
            headers, _ = self._ask("PUT", f"{path}?partNumber={number}&uploadId={upload_id}", pieces[number - 1])
            return next(value for key, value in headers if key.lower() == "etag")

        etags = list(self.threads.map(put, range(1, len(pieces) + 1)))
        listed = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1))
        self._ask(
            "POST", f"{path}?uploadId={upload_id}", f"<CompleteMultipartUpload>{listed}</CompleteMultipartUpload>"
        )

    def _compose(self, name: str, pieces: list[memoryview]) -> None:
        objects = f"/storage/v1/b/{self.spec.bucket}/o"
        parts = [f"{name}.part{number}" for number in range(len(pieces))]

        def upload(number: int) -> None:
            query = f"uploadType=media&name={quote(parts[number], safe='')}"
            self._ask("POST", f"/upload{objects}?{query}", pieces[number])

        list(self.threads.map(upload, range(len(pieces))))
        document = json.dumps({"sourceObjects": [{"name": part} for part in parts], "destination": {}})
        headers = {"Content-Type": "application/json"}
        self._ask("POST", f"{objects}/{quote(name, safe='')}/compose", document, headers)
        list(self.threads.map(lambda part: self._ask("DELETE", f"{objects}/{quote(part, safe='')}"), parts))

    def load(self, name: str) -> Any:
        path = f"/download/storage/v1/b/{self.spec.bucket}/o/{quote(name, safe='')}?alt=media"
        buffer = bytearray(len(self.data))
        view = memoryview(buffer)

        def fetch(start: int) -> None:
            end = min(start + self.step, len(buffer))
            answer = self._send("GET", path, headers={"Range": f"bytes={start}-{end - 1}"})
            read_range(answer, view, start, end, path)

        list(self.threads.map(fetch, range(0, len(buffer), self.step)))
        return buffer

    def same(self, loaded: Any, state: Any) -> bool:
        return memoryview(loaded) == self.data

    def notes(self) -> dict[str, Any]:
        return {"serialize_seconds": statistics.median(self.serialize_seconds)}


CHECKPOINTERS: dict[str, type[Checkpointer]] = {
    "ours": Ours,
    "ours_compose": Ours,
    "ours_16": Ours,
    "ours_dcp": Dcp,
    "gcs_upload_from_file": UploadFromFile,
    "gcsfs": Gcsfs,
    "dataflux_checkpoint": Dataflux,
    "raw_multipart": RawCheckpoint,
    "raw_compose": RawCheckpoint,
    **{name: Ours for name in ("none", "zstd-1-plain", "zstd-1", "zstd-3")},
}


def _same(loaded: Any, expected: Any) -> bool:
    """Whether two (nested) state dicts hold equal tensors and values."""
    import torch

    if isinstance(expected, torch.Tensor):
        return isinstance(loaded, torch.Tensor) and loaded.dtype == expected.dtype and torch.equal(loaded, expected)
    if isinstance(expected, dict):
        return (
            isinstance(loaded, dict)
            and loaded.keys() == expected.keys()
            and all(_same(loaded[key], value) for key, value in expected.items())
        )
    if isinstance(expected, (list, tuple)):
        return len(loaded) == len(expected) and all(_same(a, b) for a, b in zip(loaded, expected, strict=True))
    return bool(loaded == expected)


def _phase(work: Callable[[], Any]) -> tuple[Any, float, float, float]:
    """Run ``work``; its result, seconds, CPU seconds and peak RSS growth in MiB."""
    baseline = _reset_peak_rss()
    cpu, started = _cpu_seconds(), time.perf_counter()
    result = work()
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    return result, seconds, cpu, max(0, _status_kib("VmHWM") - baseline) / 1024


def measure_checkpoint(spec: Spec) -> dict[str, Any]:
    """Save and load ``spec.runs`` times (within the time budget), checking every load; medians."""
    state = _state_dict(spec)
    checkpointer = CHECKPOINTERS[spec.reader](spec)
    checkpointer.prepare(state)
    phases: dict[str, list[tuple[float, float, float]]] = {"save": [], "load": []}
    names: list[str] = []
    stored = 0
    while (
        len(phases["save"]) < spec.runs and sum(s for s, _, _ in phases["save"] + phases["load"]) < spec.budget_seconds
    ):
        name = f"ckpt/{spec.reader}-{len(phases['save'])}.pt"
        names.append(name)
        _, *save = _phase(functools.partial(checkpointer.save, state, name))
        loaded, *load = _phase(functools.partial(checkpointer.load, name))
        if not checkpointer.same(loaded, state):
            raise SystemExit(f"{spec.reader} loaded a different state dict")
        del loaded
        phases["save"].append(tuple(save))  # type: ignore[arg-type]
        phases["load"].append(tuple(load))  # type: ignore[arg-type]
        blobs = list(_gcs_bucket(spec).list_blobs(prefix=name))  # a DCP checkpoint is a folder
        stored = sum(blob.size for blob in blobs)
        for blob in blobs:  # checked: make room (the emulator's copies of 2 GiB saves filled the machine's memory)
            blob.delete()
    moved = sum(t.numel() * t.element_size() for t in _tensors(state))

    def median(phase: str, field: int) -> float:
        return statistics.median(run[field] for run in phases[phase])

    return {
        "seconds": median("save", 0),
        "all_seconds": [run[0] for run in phases["save"]],
        "saved_names": names,  # per save, in order: the runner matches the front's multipart completions to them
        "load_seconds": median("load", 0),
        "save_cpu_seconds": median("save", 1),
        "load_cpu_seconds": median("load", 1),
        "peak_rss_growth_mib": median("save", 2),
        "load_peak_rss_growth_mib": median("load", 2),
        "bytes": moved,
        "stored_bytes": stored,
        "objects": 1,
        **checkpointer.notes(),
    }


SAFETENSORS_TENSORS = 40
"""Tensors in the safetensors file of the fsspec memory workload."""
SAFETENSORS_FILESYSTEMS: dict[str, Callable[[Spec], Any]] = {"gcsfs_cat_load": _gcsfs, "fsspec_cat_load": _our_fsspec}


def measure_cat_load(spec: Spec) -> dict[str, Any]:
    """``fs.cat`` of one safetensors file, then ``safetensors.torch.load`` of the bytes: seconds, and the
    process's peak RSS growth over its RSS before the ``cat`` (after the ``cat`` alone, and after both).

    Before each run the last run's bytes and tensors are dropped and the C heap trimmed, so every run
    starts from the same memory; the largest growth of the runs is reported."""
    import ctypes
    import gc

    import safetensors.torch

    fs = SAFETENSORS_FILESYSTEMS[spec.reader](spec)
    ((name, (size, crc)),) = spec.manifest.items()
    trim = ctypes.CDLL("libc.so.6").malloc_trim
    timings: list[float] = []
    cat_timings, cat_growths, growths, cpu = [], [], [], []
    while len(timings) < spec.runs and sum(timings) < spec.budget_seconds:
        gc.collect()
        trim(0)
        cpu_before = _cpu_seconds()
        baseline = _reset_peak_rss()
        started = time.perf_counter()
        data = fs.cat(f"{spec.bucket}/{name}")
        cat_timings.append(time.perf_counter() - started)
        cat_growths.append((_status_kib("VmHWM") - baseline) / 1024)
        tensors = safetensors.torch.load(data)
        timings.append(time.perf_counter() - started)
        growths.append((_status_kib("VmHWM") - baseline) / 1024)
        cpu.append(_cpu_seconds() - cpu_before)
        if len(data) != size or google_crc32c.value(data) != crc or len(tensors) != SAFETENSORS_TENSORS:
            raise SystemExit(f"{spec.reader} returned wrong bytes or tensors for {name}")
        del data, tensors
    return {
        "seconds": statistics.median(timings),
        "all_seconds": timings,
        "cat_seconds": statistics.median(cat_timings),
        "bytes": size,
        "objects": 1,
        "first_seconds": statistics.median(cat_timings),
        "cpu_seconds": statistics.median(cpu),
        "cat_peak_rss_growth_mib": max(cat_growths),
        "peak_rss_growth_mib": max(growths),
    }


# --- the safetensors workload: one file from gs:// to tensors -----------------------------------


def _url_of_file(spec: Spec) -> str:
    ((name, _),) = spec.manifest.items()
    return f"gs://{spec.bucket}/{name}"


def _load_gcs_download(spec: Spec) -> Any:
    import safetensors.torch

    ((name, _),) = spec.manifest.items()
    return safetensors.torch.load(_gcs_bucket(spec).blob(name).download_as_bytes())


def _load_cat(spec: Spec) -> Any:
    import safetensors.torch

    ((name, _),) = spec.manifest.items()
    fs = SAFETENSORS_FILESYSTEMS[spec.reader](spec)
    return safetensors.torch.load(fs.cat(f"{spec.bucket}/{name}"))


def _fetch_ranges(spec: Spec) -> Any:
    """The raw ceiling: ``spec.threads`` urllib3 threads reading 64 MiB ranges into one buffer, no load."""
    import urllib3

    ((name, (size, _)),) = spec.manifest.items()
    url = f"{spec.endpoint}/download/storage/v1/b/{spec.bucket}/o/{quote(name, safe='')}?alt=media"
    pool = urllib3.PoolManager(maxsize=spec.threads, retries=False)
    buffer = bytearray(size)
    with ThreadPoolExecutor(spec.threads) as threads:
        for done in ranges_into(pool, url, memoryview(buffer), 64 * 1024 * 1024, threads):
            done.result()
    return buffer


def _load_runai(spec: Spec) -> Any:
    """Run:ai Model Streamer: C++ reads, found the emulator through ``CLOUD_STORAGE_EMULATOR_ENDPOINT``."""
    os.environ["CLOUD_STORAGE_EMULATOR_ENDPOINT"] = spec.endpoint
    os.environ["RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS"] = "true"
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_file(_url_of_file(spec))
        return dict(streamer.get_tensors())


def _load_ours(spec: Spec) -> Any:
    from torchdata_gcs import safetensors

    return safetensors.load_file(_url_of_file(spec), client=_our_client(spec))


SAFETENSORS_LOADERS: dict[str, Callable[[Spec], Any]] = {
    "gcs_download_load": _load_gcs_download,
    "gcsfs_cat_load": _load_cat,
    "fsspec_cat_load": _load_cat,
    "urllib3_ranges": _fetch_ranges,
    "runai_streamer": _load_runai,
    "ours_safetensors": _load_ours,
}


def _data_crc32c(spec: Spec) -> tuple[int, int]:
    """The crc32c and length of the file's data region (its tensors' bytes in file order), from the file's
    crc32c and a read of its header alone."""
    import struct

    import urllib3

    from torchdata_gcs._ops.checksums import crc32c_of_concatenation

    ((name, (size, crc)),) = spec.manifest.items()
    url = f"{spec.endpoint}/download/storage/v1/b/{spec.bucket}/o/{quote(name, safe='')}?alt=media"
    (length,) = struct.unpack("<Q", urllib3.request("GET", url, headers={"Range": "bytes=0-7"}).data)
    head = urllib3.request("GET", url, headers={"Range": f"bytes=0-{length + 7}"}).data
    data = size - len(head)
    return crc ^ crc32c_of_concatenation([(google_crc32c.value(head), len(head)), (0, data)]), data


def _check_loaded(spec: Spec, loaded: Any, expected: tuple[int, int]) -> None:
    """Bytes: the whole file's size and crc32c; tensors: 40 of them, whose bytes in name order (the
    file's order) have the data region's crc32c."""
    import torch

    ((name, (size, crc)),) = spec.manifest.items()
    if isinstance(loaded, (bytes, bytearray)):
        ok = len(loaded) == size and google_crc32c.value(bytes(loaded)) == crc
    else:
        value, length = 0, 0
        for key in sorted(loaded):
            raw = loaded[key].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            value, length = google_crc32c.extend(value, raw), length + len(raw)
        ok = len(loaded) == SAFETENSORS_TENSORS and (value, length) == expected
    if not ok:
        raise SystemExit(f"{spec.reader} returned wrong bytes or tensors for {name}")


def measure_safetensors(spec: Spec) -> dict[str, Any]:
    """One safetensors file from gs:// to tensors (or, for the raw ceiling, to bytes): seconds, client CPU and
    peak RSS growth over the RSS before the load. Each run's result is checked (outside the timing) and
    dropped, and the C heap trimmed, before the next; the largest growth of the runs is reported."""
    import ctypes
    import gc

    load = SAFETENSORS_LOADERS[spec.reader]
    expected = _data_crc32c(spec)
    trim = ctypes.CDLL("libc.so.6").malloc_trim
    timings: list[float] = []
    growths, cpu = [], []
    while len(timings) < spec.runs and sum(timings) < spec.budget_seconds:
        gc.collect()
        trim(0)
        cpu_before = _cpu_seconds()
        baseline = _reset_peak_rss()
        started = time.perf_counter()
        loaded = load(spec)
        timings.append(time.perf_counter() - started)
        cpu.append(_cpu_seconds() - cpu_before)
        growths.append((_status_kib("VmHWM") - baseline) / 1024)
        _check_loaded(spec, loaded, expected)
        del loaded
    ((_, (size, _)),) = spec.manifest.items()
    return {
        "seconds": statistics.median(timings),
        "all_seconds": timings,
        "bytes": size,
        "objects": 1,
        "first_seconds": statistics.median(timings),
        "cpu_seconds": statistics.median(cpu),
        "peak_rss_growth_mib": max(growths),
    }


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


class Collections:
    """What the garbage collector did while it was watched (:meth:`watch`): collections per generation, the seconds
    they took, and the allocations it counted: container objects (those it tracks) made and not freed before a
    collection came, which is what sets off each young collection (one per 700 of them)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self.allocations = 0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            self.allocations += gc.get_count()[0]  # the count that set the collection off, zeroed by it
        else:
            self.seconds += time.perf_counter() - self._started
            self.counts[info["generation"]] += 1

    def watch(self, work: Callable[[], T]) -> T:
        """``work()``, its collections counted."""
        before = gc.get_count()[0]
        gc.callbacks.append(self._callback)
        try:
            return work()
        finally:
            gc.callbacks.remove(self._callback)
            self.allocations += gc.get_count()[0] - before


def _check_as_they_arrive(spec: Spec, results: Iterable[tuple[str, bytes]], started: float) -> tuple[set[str], float]:
    """Check each object's size and crc32c as the reader hands it over, keeping none of the bytes;
    return the names and the seconds from ``started`` until the first object arrived.

    The check runs inside the timed region for every reader alike (crc32c is a few microseconds per
    100 KiB); keeping nothing means the memory column shows what the reader itself holds.
    """
    seen: set[str] = set()
    first = 0.0
    for name, data in results:
        if not seen:
            first = time.perf_counter() - started
        size, crc = spec.manifest[name]
        if name in seen or len(data) != size or google_crc32c.value(data) != crc:
            raise SystemExit(f"{spec.reader} returned wrong bytes or a duplicate for {name}")
        seen.add(name)
    return seen, first


def measure(spec: Spec) -> dict[str, Any]:
    """Run the reader ``spec.runs`` times, verifying each result; return medians and memory."""
    if spec.workload in ("checkpoint", "compression"):
        return measure_checkpoint(spec)
    if spec.workload == "safetensors":
        return measure_safetensors(spec)
    if spec.reader in SAFETENSORS_FILESYSTEMS:
        return measure_cat_load(spec)
    baseline = _reset_peak_rss()
    timings: list[float] = []
    extra: dict[str, Any] = {}
    if spec.workload == "listing":
        expected = _names(spec)
        firsts: list[float] = []
        cpu = []
        while len(timings) < spec.runs and sum(timings) < spec.budget_seconds:
            cpu_before = _cpu_seconds()
            started = time.perf_counter()
            listed = []
            for name in LISTERS[spec.reader](spec):
                if not listed:
                    firsts.append(time.perf_counter() - started)
                listed.append(name)
            timings.append(time.perf_counter() - started)
            cpu.append(_cpu_seconds() - cpu_before)
            if listed != expected:
                raise SystemExit(f"{spec.reader} listed {len(listed)} names, expected {len(expected)}")
        extra["first_seconds"] = statistics.median(firsts)
        extra["cpu_seconds"] = statistics.median(cpu)
        moved, objects = 0, len(expected)
    else:
        firsts, cpu, collections = [], [], []
        while len(timings) < spec.runs and sum(timings) < spec.budget_seconds:
            collected = Collections()
            cpu_before = _cpu_seconds()
            started = time.perf_counter()
            seen, first = collected.watch(
                lambda started=started: _check_as_they_arrive(spec, READERS[spec.reader](spec), started)
            )
            timings.append(time.perf_counter() - started)
            cpu.append(_cpu_seconds() - cpu_before)
            firsts.append(first)
            collections.append(collected)
            if seen != spec.manifest.keys():
                raise SystemExit(f"{spec.reader} returned {len(seen)} of {len(spec.manifest)} objects")
        extra["first_seconds"] = statistics.median(firsts)
        extra["cpu_seconds"] = statistics.median(cpu)
        extra["gc_collections"] = [statistics.median(c.counts[g] for c in collections) for g in range(3)]
        extra["gc_seconds"] = statistics.median(c.seconds for c in collections)
        extra["gc_allocations"] = statistics.median(c.allocations for c in collections)
        moved, objects = sum(size for size, _ in spec.manifest.values()), len(spec.manifest)
    peak_kib = _status_kib("VmHWM")
    return {
        "seconds": statistics.median(timings),
        "all_seconds": timings,
        "bytes": moved,
        "objects": objects,
        "peak_rss_growth_mib": max(0, peak_kib - baseline) / 1024,
        **extra,
    }


def _import_common() -> None:
    """Import what any reader may use first, so the memory baseline is the same for all of them."""
    import importlib

    for module in ("torch", "google.cloud.storage", "torchdata_gcs", "gcsfs", "aiohttp", "dataflux_pytorch", "obstore"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def training_heap(objects: int) -> list[tuple[str, int, list[int]]]:
    """About ``objects`` live Python objects, as a training process holds them: a dataset index, one
    tuple per sample of its path, its label and a list (box coordinates), each tuple and list tracked by
    the garbage collector. Built with the collector paused (as fast as a process that loads its index
    whole), then one full collection, as one would come in a process that built its index and then trained."""
    gc.disable()
    try:
        index = [(f"train/{i:08d}.jpg", i % 1000, [i, i + 1]) for i in range(objects // 6)]
    finally:
        gc.enable()
    gc.collect()
    return index


def _use_source(tree: str) -> None:
    """Import torchdata_gcs from ``tree`` (another version of it), and check that it did."""
    sys.path.insert(0, tree)
    import torchdata_gcs

    where = os.path.realpath(torchdata_gcs.__file__)
    if not where.startswith(os.path.realpath(tree) + os.sep):
        raise SystemExit(f"torchdata_gcs came from {where}, not from {tree}")


if __name__ == "__main__":
    spec = Spec(**json.loads(sys.stdin.read()))
    if spec.source:
        _use_source(spec.source)
    _import_common()
    held = training_heap(spec.heap_objects) if spec.heap_objects else []
    print(json.dumps(measure(spec)))
