"""A small HTTP proxy in front of the emulator that records requests and can corrupt or refuse them.

It forwards real HTTP, so the code under test speaks to GCS's protocol end to end; it only adds
what the emulator cannot do for these tests: show which headers arrived, flip bytes in object
bodies on their way back, and answer error statuses as an overloaded GCS would.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import final

import requests


@final
class RecordingProxy:
    """Forwards to ``upstream``.

    ``corrupt_downloads`` flips the first byte of every media body; each status in ``fail_next``
    answers one request (in order) instead of forwarding it, with ``Retry-After: 0``;
    ``replace_headers`` overrides request headers on the way (as some corporate proxies do).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.corrupt_downloads = False
        self.fail_next: list[int] = []
        self.replace_headers: dict[str, str] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # method, path, lower-cased headers
        self._http = requests.Session()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                if proxy.fail_next:
                    self.send_response(proxy.fail_next.pop(0))
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                upstream = proxy._http.request(
                    self.command,
                    proxy.upstream + self.path,
                    data=body,
                    headers={
                        **{k: v for k, v in self.headers.items() if k.lower() not in ("host", "authorization")},
                        **proxy.replace_headers,
                    },
                    stream=True,
                )
                content = upstream.raw.read(decode_content=False)
                if proxy.corrupt_downloads and "alt=media" in self.path and content:
                    content = bytes([content[0] ^ 0xFF]) + content[1:]
                self.send_response(upstream.status_code)
                for key, value in upstream.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
