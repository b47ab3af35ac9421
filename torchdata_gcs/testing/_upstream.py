"""A front's way to its upstream: the kept-alive connections its forwarded requests take turns on, and the small
requests the front makes there itself for its own checks and acts (is an object live, how large, is a bucket
empty)."""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import quote

__all__ = ["UpstreamLink", "UpstreamPool"]


class UpstreamPool:
    """Idle keep-alive connections to the upstream, reused last-in first-out."""

    def __init__(self, address: tuple[str, int], max_idle: int = 256, timeout: float = 120.0) -> None:
        self._address = address
        self._max_idle = max_idle
        self._timeout = timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False
        self._lock = threading.Lock()

    def get(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection, and whether it was used before (and so may have been closed by the peer)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return http.client.HTTPConnection(*self._address, timeout=self._timeout), False

    def put(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for connection in idle:
            connection.close()


class UpstreamLink:
    """The pool of connections to the upstream at ``address``, and the front's own requests there."""

    def __init__(self, address: tuple[str, int]) -> None:
        self._address = address
        self.pool = UpstreamPool(address)

    def reopen(self) -> None:
        """A pool of its own for a front that starts (again): the last one was closed when it stopped."""
        self.pool = UpstreamPool(self._address)

    def close(self) -> None:
        self.pool.close()

    def ask(self, path: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
        """The status and body of a request (a GET by default, with a JSON ``body`` if given) of ``path``
        upstream, for the front's own checks and acts."""
        connection, _ = self.pool.get()
        try:
            connection.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
            response = connection.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException):
            connection.close()
            raise
        self.pool.put(connection)
        return response.status, answer

    def live_generation(self, bucket: str, name: str) -> int | None:
        """The generation of ``bucket/name`` upstream, or ``None`` if it does not exist."""
        live = self.live_version(bucket, name)
        return None if live is None else live[0]

    def live_version(self, bucket: str, name: str) -> tuple[int, str | None] | None:
        """The generation and storage class of ``bucket/name`` upstream, or ``None`` if it does not exist."""
        path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?fields=generation,storageClass"
        status, answer = self.ask(path)
        if status != 200:
            return None
        resource = json.loads(answer)
        return int(resource["generation"]), resource.get("storageClass")

    def stored_size(self, bucket: str, name: str) -> str:
        """The size of ``bucket/name`` upstream (``*`` if it is gone)."""
        status, answer = self.ask(f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?fields=size")
        return str(json.loads(answer).get("size", "*")) if status == 200 else "*"

    def bucket_exists(self, bucket: str) -> bool:
        return self.ask(f"/storage/v1/b/{quote(bucket, safe='')}?fields=name")[0] == 200

    def holds_objects(self, bucket: str) -> bool:
        status, answer = self.ask(f"/storage/v1/b/{quote(bucket, safe='')}/o?maxResults=1")
        return status == 200 and bool(json.loads(answer).get("items"))
