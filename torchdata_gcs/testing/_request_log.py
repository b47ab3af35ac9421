"""What a front counts and keeps of the requests it serves, and the faults it picks for them: counts by kind,
faults injected, requests recorded, writes sent again that GCS does not make safe to repeat, answers their client
left, connections open. ``GCSFront`` reports them; its request handlers write them."""

from __future__ import annotations

import random
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ._faults import Fault
from ._request_kinds import is_write, repeatable

__all__ = ["RecordedRequest", "RequestLog"]


@dataclass(frozen=True)
class RecordedRequest:
    """A request as the front received it: method, ``/path?query``, headers in order, and body."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        """Every value of header ``name`` (case-insensitive)."""
        return [value for key, value in self.headers if key.lower() == name.lower()]


class RequestLog:
    """The counts, records and fault picks of one front (see :class:`GCSFront` for what each means)."""

    def __init__(self, seed: int | None, *, keep_requests: bool, lose_write_answers: bool) -> None:
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._faults: tuple[Fault, ...] = ()
        self._fired: list[int] = []
        self._counts: Counter[str] = Counter()
        self._injected: Counter[str] = Counter()
        self._connections: set[socket.socket] = set()
        self._peak_connections = 0
        self.keeps_requests = keep_requests
        self._recorded: list[RecordedRequest] = []
        self._lose_write_answers = lose_write_answers
        self._writes_seen: set[str] = set()
        self._unconditional_resends: list[str] = []
        self._abandoned = 0

    @property
    def faults(self) -> tuple[Fault, ...]:
        return self._faults

    def set_faults(self, faults: tuple[Fault, ...]) -> None:
        """Replace the faults; their ``times`` allowances start afresh."""
        with self._lock:
            self._faults, self._fired = faults, [0] * len(faults)

    def record(self, kind: str, request_line: str) -> Fault | None:
        """Count one request and pick the fault to inject into it, if any."""
        with self._lock:
            self._counts[kind] += 1
            for index, fault in enumerate(self._faults):
                if fault.times is not None and self._fired[index] >= fault.times:
                    continue
                if not fault.applies_to(kind, request_line):
                    continue
                if fault.rate < 1.0 and self._random.random() >= fault.rate:
                    continue
                self._fired[index] += 1
                self._injected[fault.kind] += 1
                return fault
        return None

    def loses_answer(self, method: str, target: str, headers: Any) -> bool:
        """Whether to answer this write 503 after carrying it out: its first attempt, with
        ``lose_write_answers``; a write seen before and not :func:`repeatable` is noted."""
        if not self._lose_write_answers or not is_write(method, target):
            return False
        with self._lock:
            if target not in self._writes_seen:
                self._writes_seen.add(target)
                self._injected["lost_answer"] += 1
                return True
            if not repeatable(method, target, headers):
                self._unconditional_resends.append(f"{method} {target}")
        return False

    def keep(self, request: RecordedRequest) -> None:
        with self._lock:
            self._recorded.append(request)

    def note_abandoned(self) -> None:
        """Count an answer whose client closed the connection before its end."""
        with self._lock:
            self._abandoned += 1

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(connection)
                self._peak_connections = max(self._peak_connections, len(self._connections))
            else:
                self._connections.discard(connection)

    def reset(self) -> None:
        """Zero the counts and faults injected, and start the peak over from the connections open now."""
        with self._lock:
            self._counts.clear()
            self._injected.clear()
            self._peak_connections = len(self._connections)

    @property
    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)

    @property
    def faults_injected(self) -> Counter[str]:
        with self._lock:
            return Counter(self._injected)

    @property
    def recorded(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._recorded)

    @property
    def unconditional_resends(self) -> list[str]:
        with self._lock:
            return list(self._unconditional_resends)

    @property
    def peak_connections(self) -> int:
        with self._lock:
            return self._peak_connections

    @property
    def abandoned_answers(self) -> int:
        with self._lock:
            return self._abandoned

    @property
    def connections(self) -> list[socket.socket]:
        with self._lock:
            return list(self._connections)
