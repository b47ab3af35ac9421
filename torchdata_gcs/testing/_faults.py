"""The faults a front injects into the requests they match: what each kind does, and the answer it is given
where it is one (a GCS-style error, a sign-in page)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from ._request_kinds import REQUEST_KINDS
from ._stuck_pages import continues_listing

__all__ = ["FAULT_KINDS", "HTML_PAGE", "HTTP_FAULTS", "Fault"]

FaultKind = Literal[
    "http_400",
    "http_403",
    "http_404",
    "http_412",
    "http_429",
    "http_503",
    "reset",
    "truncate",
    "stall",
    "corrupt",
    "html_200",
    "repeat_token",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
HTML_PAGE = b"<html><body><h1>Sign in to continue</h1></body></html>"
"""What ``"html_200"`` answers: a captive portal's sign-in page."""
HTTP_FAULTS = {
    "http_400": (400, "Bad Request", "injected by the test front: Invalid argument."),
    "http_403": (403, "Forbidden", "injected by the test front: the caller does not have permission"),
    "http_404": (404, "Not Found", "injected by the test front: No such object"),
    "http_412": (
        412,
        "Precondition Failed",
        "injected by the test front: At least one of the pre-conditions you specified did not hold.",
    ),
    "http_429": (429, "Too Many Requests", "injected by the test front: Too Many Requests"),
    "http_503": (503, "Service Unavailable", "injected by the test front: Service Unavailable"),
}
"""What each HTTP fault kind answers: its status, reason and message, in a GCS-style JSON error."""


@dataclass(frozen=True)
class Fault:
    """A failure to inject into matching requests.

    Args:
        kind: ``"http_400"`` (a request GCS deems invalid), ``"http_403"`` (permission denied), ``"http_429"`` or
            ``"http_503"`` answers that status with a GCS-style JSON error instead of forwarding; ``"reset"`` resets the
            connection (the client gets ECONNRESET) instead of answering; ``"truncate"`` forwards the request and sends
            the real status and headers (full ``Content-Length``) but only half the body, then closes; ``"stall"``
            answers nothing for ``stall_seconds``, then closes; ``"corrupt"`` flips one bit of the request body (a
            request that has one) or of the answer's body, as damage in transit would. Only ``"truncate"`` and
            ``"corrupt"`` reach upstream. ``"http_404"`` and ``"http_412"`` answer as a missing object and a failed
            precondition do; ``"html_200"`` answers 200 with an HTML page, as a captive portal or a misconfigured proxy
            would; ``"repeat_token"`` answers a list request for a page after the first (it carries a ``pageToken``, or
            multipart uploads' markers) with a page that names that same token (or those markers) as the next one, as a
            server that never lets a listing end would (other requests are not matched).
        rate: probability that a matching request is hit, drawn from the front's seeded generator.
        match: a request kind from :data:`REQUEST_KINDS` (``"get"``, ``"list"``, ...), or a regular
            expression searched in ``"METHOD /path?query"`` as the client sent it; ``None``: all.
        times: inject at most this many times (``None``: no limit).
        retry_after: seconds to send in ``Retry-After`` with an HTTP fault; ``None`` sends none.
        stall_seconds: how long a ``"stall"`` holds the request; longer than the client's timeout.
    """

    kind: FaultKind
    rate: float = 1.0
    match: str | None = None
    times: int | None = None
    retry_after: float | None = None
    stall_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(FAULT_KINDS)}; got {self.kind!r}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], got {self.rate}")
        if self.times is not None and self.times < 1:
            raise ValueError(f"times must be >= 1 or None, got {self.times}")
        if self.retry_after is not None and (self.kind not in ("http_429", "http_503") or self.retry_after < 0):
            raise ValueError(f"retry_after must be >= 0 and only set for http_429/http_503, got {self.retry_after}")
        if self.stall_seconds <= 0:
            raise ValueError(f"stall_seconds must be > 0, got {self.stall_seconds}")
        if self.match is not None and self.match not in REQUEST_KINDS:
            try:
                re.compile(self.match)
            except re.error as exc:
                raise ValueError(f"match is neither a request kind nor a valid regex: {exc}") from None

    def applies_to(self, kind: str, request_line: str) -> bool:
        """Whether a request of ``kind`` with ``request_line`` (``"METHOD /path?query"``) matches."""
        if self.kind == "repeat_token" and not continues_listing(request_line.partition(" ")[2]):
            return False
        if self.match is None:
            return True
        if self.match in REQUEST_KINDS:
            return self.match == kind
        return re.search(self.match, request_line) is not None
