"""``torchdata-gcs pack SRC DST``: the objects under a prefix packed into WebDataset tar shards, with a progress
line on stderr and a summary at the end."""

from __future__ import annotations

import argparse
import signal
import sys

from .._ops.urls import printable
from ..config import parse_size
from ..shards import pack
from .options import client_config

__all__ = ["run_pack", "shard_size"]


def shard_size(text: str) -> int:
    """``--shard-size``: a size such as ``512MiB`` or ``1GB``, or a number of bytes."""
    try:
        return parse_size("--shard-size", int(text) if text.isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_pack(args: argparse.Namespace) -> int:
    """Pack ``args.source`` into ``args.destination``; SIGTERM stops it as Ctrl-C does (the shard being filled
    is aborted, so a rerun resumes after the last whole one)."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        report = pack(
            args.source,
            args.destination,
            shard_size=args.shard_size,
            group_by=None if args.group_by == "none" else "stem",
            client=client_config(args),
            progress=True,
        )
    except ValueError as exc:  # a name that makes no sample, found while listing: one line, as GCS's errors
        print(printable(f"torchdata-gcs pack: {exc}".splitlines()[0]), file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"packed {args.source} into {args.destination}: {report.describe()}")
    return 0
