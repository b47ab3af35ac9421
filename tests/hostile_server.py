"""HTTP servers for faults no forwarding front can make: one that never lets a request end, one that
gives every request the same raw answer.

``"trickle"`` reads each request whole, answers ``200`` with headers that promise a 100,000-byte body,
then sends one byte every ``interval`` seconds, so a read timeout (which restarts on every byte) never
fires. ``"deaf"`` reads a request's headers and nothing else, never its body, and never answers, so a
client's upload blocks once the socket buffers are full. Either holds a connection until the client
closes it or the server stops.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Literal, final

Mode = Literal["trickle", "deaf"]

PROMISED = 100_000
"""The body length a trickled answer announces; at one byte per ``interval`` it would take hours."""


@final
class HostileServer:
    """Serves on a free loopback port in ``mode`` until stopped; :attr:`endpoint` is its base URL and
    :attr:`requests` counts the requests whose headers arrived."""

    def __init__(self, mode: Mode, interval: float = 0.5) -> None:
        self.mode, self.interval = mode, interval
        self.requests = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # a deaf server fills up soon
        self._listener.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._connections: list[socket.socket] = []
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._connections.append(connection)
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        connection.settimeout(0.2)
        received = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in received:
                    received += self._receive(connection)
                head, _, received = received.partition(b"\r\n\r\n")
                self.requests += 1
                if self.mode == "deaf":
                    self._stop.wait()
                    return
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(received) < length:
                    received += self._receive(connection)
                received = received[length:]
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {PROMISED}\r\n\r\n".encode()
                )
                for _ in range(PROMISED):
                    connection.sendall(b" ")
                    if self._stop.wait(self.interval):
                        return
        except (OSError, ConnectionError):
            return  # the client gave up: what the server is for
        finally:
            connection.close()

    def _receive(self, connection: socket.socket) -> bytes:
        while not self._stop.is_set():
            try:
                data = connection.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("closed by the client")
            return data
        raise ConnectionError("the server stops")

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextmanager
def one_answer_server(answer: bytes, *, then_close: bool) -> Iterator[str]:
    """An endpoint that answers every request with the raw bytes ``answer``, then closes the connection or
    holds it until the server stops."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(connection)
            try:
                connection.recv(65536)
                connection.sendall(answer)
            except OSError:
                pass
            if then_close:
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()
