"""``torchdata-gcs cache ls|clear PATH``: what a ``LocalCache``'s folder holds, and emptying it."""

from __future__ import annotations

import argparse

from .._engines.local_cache import FolderReport, clear_folder, folder_report
from .sizes import human_size

__all__ = ["run_cache"]


def _describe(report: FolderReport) -> str:
    limit = "unknown" if report.limit is None else f"{human_size(report.limit)}, {report.bytes / report.limit:.0%} used"
    reads = report.hits + report.misses
    recent = report.recent_hits + report.recent_misses
    rate = (
        f"hit rate {report.recent_hits / recent:.1%} recently, {report.hits / reads:.1%} of {reads:,} reads counted"
        if reads and recent
        else f"hit rate {report.hits / reads:.1%} of {reads:,} reads counted"
        if reads
        else "no reads counted yet"
    )
    return f"{report.entries:,} entries, {human_size(report.bytes)} ({report.bytes:,} bytes); limit {limit}; {rate}"


def run_cache(args: argparse.Namespace) -> int:
    """``ls`` prints what the folder holds; ``clear`` removes every entry and the counts."""
    if args.action == "ls":
        print(f"{args.path}: {_describe(folder_report(args.path))}")
    else:
        removed = clear_folder(args.path)
        print(f"{args.path}: removed {removed.entries:,} entries, {human_size(removed.bytes)}")
    return 0
