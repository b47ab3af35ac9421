"""A helper server process (the emulator, HAProxy): logged, ready once it answers, always stopped, even
when the process that started it is killed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import requests

from .._transport import lifecycle, reaper
from ..config import ClientConfig

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["EmulatorError", "LocalService", "ServerProcess", "free_port"]


class EmulatorError(RuntimeError):
    """The emulator or a front could not be started or did not answer as expected."""


class LocalService(ABC):
    """A local server (the emulator, a front) that a ``with`` block starts and stops whatever happens."""

    kind = "server"  # names the service in errors
    endpoint: str
    _server: Any  # what runs it; None while stopped

    @abstractmethod
    def start(self) -> Self:
        """Start serving (if not already); returns ``self``."""

    @abstractmethod
    def stop(self) -> None:
        """Stop serving; safe to call more than once."""

    @property
    def client_config(self) -> ClientConfig:
        """Settings that send torchdata-gcs's requests here, anonymously."""
        self._require_running()
        return ClientConfig(endpoint=self.endpoint, anonymous=True)

    def _require_running(self) -> None:
        if self._server is None:
            raise EmulatorError(f"the {self.kind} is not running: call start() or use it in a with block")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _terminate(process: subprocess.Popen[bytes], scratch: str, starter: int, watched: reaper.Watch | None) -> None:
    if os.getpid() != starter:  # a forked child's copy: the server belongs to its parent
        return
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(scratch, ignore_errors=True)
    reaper.release(watched)


class ServerProcess:
    """Runs ``args`` (output in ``scratch/NAME.log``) and waits until ``endpoint`` answers.

    The process is stopped, and ``scratch`` removed, by :meth:`stop`, when it fails to answer within
    ``timeout`` seconds, when ``owner`` is garbage collected, at interpreter or worker exit, or, by this
    process's reaper, when this process is killed (SIGTERM, SIGKILL), so a failing or killed test run
    never leaves a server (and the objects it holds in memory) behind.
    """

    def __init__(
        self,
        owner: object,
        name: str,
        args: Sequence[str],
        scratch: str,
        *,
        endpoint: str,
        timeout: float,
        env: Mapping[str, str] | None = None,
        verify: str | bool = True,
    ) -> None:
        self.name = name
        self._verify = verify  # the CA file that ``endpoint``'s certificate is checked against, if HTTPS
        self._log = os.path.join(scratch, f"{name}.log")
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                list(args), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        watched = reaper.watch(reaper.StopProcess(self._process.pid, scratch))
        self._finalizer = weakref.finalize(owner, _terminate, self._process, scratch, os.getpid(), watched)
        lifecycle.cleanup(self._finalizer)  # a multiprocessing worker's exit skips interpreter exit
        try:
            self._wait_until_answering(endpoint, timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_until_answering(self, endpoint: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                with open(self._log, errors="replace") as log:
                    tail = log.read()[-2000:]
                raise EmulatorError(f"{self.name} exited with {self._process.returncode}: {tail}")
            try:
                # a bucket listing, with the project GCS requires of one (a GCSFront behind refuses it without)
                params = {"project": "readiness"}
                if requests.get(f"{endpoint}/storage/v1/b", params=params, timeout=1, verify=self._verify).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise EmulatorError(f"{self.name} did not answer within {timeout} s")

    @property
    def pid(self) -> int:
        return self._process.pid

    def stop(self) -> None:
        """Stop the process and remove its scratch folder; safe to call more than once."""
        self._finalizer()
