"""What ``doctor`` reports: the table of checks and their results, the report a run fills in (whose exit code is
0 when everything the library needs works), and how an error is worded in a line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .bucket_settings import Fact

__all__ = ["CHECKS", "FAILED", "MISSING", "OK", "REFUSED", "SKIPPED", "Check", "Report", "one_line", "table_row"]

OK, REFUSED, MISSING, FAILED, SKIPPED = "OK", "REFUSED", "MISSING", "FAILED", "SKIPPED"

CHECKS = (
    "list",
    "write",
    "precondition",
    "read",
    "compose",
    "XML multipart upload",
    "upload listing",
    "delete",
    "latency",
    "throughput",
)
"""The table's rows, in order."""

_CHECK_WIDTH = max(len(name) for name in CHECKS) + 2
_RESULT_WIDTH = max(len(result) for result in (OK, REFUSED, MISSING, FAILED, SKIPPED)) + 2


@dataclass(frozen=True)
class Check:
    """One row of the table: what was checked, how it went (OK, REFUSED, MISSING, FAILED, SKIPPED), and detail."""

    name: str
    result: str
    detail: str
    consequence: str = ""  # what a result other than OK means for the library's features


@dataclass
class Report:
    """What ``doctor`` found; ``exit_code`` is 0 when everything the library needs works."""

    url: str
    scratch: str
    endpoint: str = ""
    identity: str = ""
    facts: list[Fact] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    deleted: int = 0
    left_behind: list[str] = field(default_factory=list)
    interrupted: bool = False
    lifecycle: dict[str, Any] | None = None  # the lifecycle configuration to set, when rules for leftovers are missing

    @property
    def findings(self) -> list[str]:
        """One line per problem: each check that did not pass, then anything that could not be removed."""
        found = [
            f"{check.name} {check.result}: {check.consequence}"
            for check in self.checks
            if check.result in (REFUSED, MISSING, FAILED)
        ]
        if self.left_behind:
            found.append(f"cleanup: {len(self.left_behind)} scratch item(s) could not be removed (listed above)")
        return found

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else 1 if self.findings else 0

    def result(self, name: str) -> str | None:
        return next((check.result for check in self.checks if check.name == name), None)


def table_row(name: str, result: str, detail: str) -> str:
    """One line of the table: a check's name, its result and the detail, in columns."""
    return f"{name:<{_CHECK_WIDTH}}{result:<{_RESULT_WIDTH}}{detail}".rstrip()


def one_line(exc: BaseException) -> str:
    """The error's first line, without the URL it names (the row or line it goes in names the object)."""
    text = str(exc).strip()
    url = getattr(exc, "url", None)
    if url:
        text = text.replace(f" ({url})", "")
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
