"""A fast latency front: HAProxy delays every request by a fixed time before forwarding it.

A Python proxy costs more per request than the clients it should tell apart, so the latency that
benchmarks add comes from HAProxy (compiled, event-driven) with a one-line Lua action that sleeps
without blocking other requests. Faults and request counts live in the Python front
(:class:`GCSFront`); chain the two when both are wanted. With ``tls=True`` HAProxy also terminates
HTTPS, as GCS's front ends do, with a self-signed certificate made at start by ``openssl``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from ._process import EmulatorError, LocalService, ServerProcess, free_port

__all__ = ["LatencyFront"]

_CONFIG = """\
global
    lua-load {lua}
    maxconn 8192
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 600s
frontend front
    bind 127.0.0.1:{port}{tls}
    # GCS returns at most 1,000 objects per list page; the emulator returns everything at once
    # when no maxResults is given. Cap pages here so listings cost as many requests as on GCS.
    acl is_list path_reg ^/storage/v1/b/[^/]+/o$
    acl has_max_results query -m reg (^|&)maxResults=
    http-request set-query %[query]&maxResults=1000 if is_list !has_max_results
    http-request set-query %[query,regsub(maxResults=[0-9][0-9][0-9][0-9]+,maxResults=1000)] if is_list has_max_results
    # The emulator serves XML API path-style requests (/bucket/object) only for its own host name,
    # as GCS does for storage.googleapis.com: name the upstream, so clients of that API get through.
    http-request set-header Host {upstream}
    {delay_rule}
    default_backend upstream
backend upstream
    server upstream {upstream}
"""

_LUA = """\
core.register_action("delay", {{ "http-req" }}, function(txn) core.msleep({milliseconds}) end)
"""


def _find_haproxy() -> str | None:
    return shutil.which("haproxy") or next(
        (path for path in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(path, os.X_OK)), None
    )


def _missing() -> tuple[str | None, str | None]:
    """The HAProxy found here and, where it cannot serve as the front, why not (``None`` when it can)."""
    found = _find_haproxy()
    if found is None:
        return None, "HAProxy is not installed (Debian: apt-get install haproxy)"
    try:
        described = subprocess.run([found, "-vv"], capture_output=True, text=True, timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return found, f"{found} -vv failed ({error})"
    if "Built with Lua" not in described:
        return found, f"{found} is built without Lua (Debian's haproxy package has it)"
    return found, None


def _haproxy() -> str:
    found, reason = _missing()
    if found is None or reason is not None:
        raise EmulatorError(f"LatencyFront needs HAProxy with Lua: {reason}")
    return found


def _certificate(folder: str) -> Path:
    """A self-signed certificate for ``127.0.0.1`` (``certificate.pem``) and the file HAProxy serves
    (``served.pem``: that certificate and its key)."""
    certificate, key = Path(folder, "certificate.pem"), Path(folder, "key.pem")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
            *("-keyout", str(key), "-out", str(certificate), "-days", "2", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:TRUE"),
        ],
        check=True,
        capture_output=True,
    )
    served = Path(folder, "served.pem")
    served.write_bytes(certificate.read_bytes() + key.read_bytes())
    return served


class LatencyFront(LocalService):
    """HAProxy on a free loopback port that forwards to ``upstream`` after ``latency`` seconds.

    Every request waits ``latency`` seconds (whole milliseconds) before it is forwarded, so every
    response starts at least that late, as on a remote GCS; requests wait concurrently. Bodies
    stream through in both directions. List pages are capped at 1,000 objects, as GCS caps them.
    Point clients at :attr:`endpoint` or :attr:`client_config`.

    Args:
        upstream: base URL to forward to, such as an :class:`Emulator`'s ``endpoint``.
        latency: seconds added to each request; 0 forwards at once (to measure HAProxy alone).
        tls: serve HTTPS with a certificate for ``127.0.0.1`` made at start; clients trust it through
            :attr:`ca_file` (``SSL_CERT_FILE`` or ``REQUESTS_CA_BUNDLE``, or their own options).

    Examples:
        >>> from torchdata_gcs.testing import Emulator, LatencyFront
        >>> with Emulator() as emulator, LatencyFront(emulator.endpoint, latency=0.02) as front:
        ...     emulator.seed("slow-bucket", {"x": b"late"})
        ...     import requests
        ...     requests.get(f"{front.endpoint}/download/storage/v1/b/slow-bucket/o/x?alt=media").content
        b'late'
    """

    kind = "latency front"

    @staticmethod
    def available() -> bool:
        """Whether HAProxy with Lua is installed here (``LatencyFront`` needs it; ``GCSFront`` does not)."""
        return _missing()[1] is None

    @staticmethod
    def unavailable_reason() -> str | None:
        """Why ``LatencyFront`` cannot start here (no HAProxy, or one without Lua); ``None`` where it can."""
        return _missing()[1]

    def __init__(self, upstream: str, *, latency: float = 0.02, tls: bool = False) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency}")
        self.upstream = upstream
        self.latency = latency
        self.tls = tls
        self.ca_file = ""  # with ``tls``: the self-signed certificate, its own authority
        self.endpoint = ""
        self._server: ServerProcess | None = None

    def start(self) -> LatencyFront:
        if self._server is not None:
            raise EmulatorError("the latency front is already running")
        scratch = tempfile.mkdtemp(prefix="torchdata-gcs-latency-")
        port = free_port()
        milliseconds = round(self.latency * 1000)
        lua = Path(scratch, "delay.lua")
        lua.write_text(_LUA.format(milliseconds=milliseconds))
        parts = urlsplit(self.upstream)
        config = Path(scratch, "haproxy.cfg")
        config.write_text(
            _CONFIG.format(
                lua=lua,
                port=port,
                upstream=f"{parts.hostname}:{parts.port}",
                delay_rule="http-request lua.delay" if milliseconds else "",
                tls=f" ssl crt {_certificate(scratch)}" if self.tls else "",
            )
        )
        self.ca_file = str(Path(scratch, "certificate.pem")) if self.tls else ""
        self.endpoint = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        command = [_haproxy(), "-f", str(config), "-db"]
        self._server = ServerProcess(
            self, "haproxy", command, scratch, endpoint=self.endpoint, timeout=15.0, verify=self.ca_file or True
        )
        return self

    def stop(self) -> None:
        """Stop HAProxy and remove its files; safe to call more than once."""
        if self._server is not None:
            self._server.stop()
        self._server = None
