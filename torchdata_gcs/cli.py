"""The ``torchdata-gcs`` command.

Exit codes: 0 done, 1 GCS refused or failed (one line on stderr; ``--verbose`` for the traceback),
2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ._client import transport_for
from ._compose import leftovers
from ._objects import delete_object
from ._uri import TEMPORARY_PREFIX, format_url, parse_url
from .config import ClientConfig, RetryConfig
from .errors import GCSError, InvalidURIError

__all__ = ["main"]

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _age(text: str) -> str:
    """Accept ``90s``, ``30m``, ``6h`` or ``2d``."""
    if _AGE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"expected an age such as 30m, 6h or 2d, got {text!r}")
    return text


def _seconds(age: str) -> float:
    number, unit = _AGE.fullmatch(age).groups()  # type: ignore[union-attr]
    return float(number) * _SECONDS[unit]


def _bucket(text: str) -> str:
    try:
        bucket, name = parse_url(text)
    except InvalidURIError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if name:
        raise argparse.ArgumentTypeError(f"expected a bucket (gs://bucket), got {text!r}")
    return bucket


def _clean(args: argparse.Namespace) -> int:
    transport = transport_for(ClientConfig(endpoint=args.endpoint))
    retry = RetryConfig()
    found = leftovers(transport, args.bucket, _seconds(args.older_than), retry)
    verb = "would delete" if args.dry_run else "deleted"
    if not args.dry_run:
        with ThreadPoolExecutor(16) as pool:
            deleted = list(
                pool.map(
                    lambda item: delete_object(transport, args.bucket, item[0], retry, if_generation_match=item[1]),
                    found,
                )
            )
        found = [item for item, done in zip(found, deleted) if done]
    for name, _ in found:
        print(f"{verb} {format_url(args.bucket, name)}")
    print(
        f"{verb} {len(found)} temporary object(s) older than {args.older_than} in gs://{args.bucket}/{TEMPORARY_PREFIX}"
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchdata-gcs",
        description="Tools for torchdata-gcs datasets on Google Cloud Storage.",
        epilog="Credentials: Application Default Credentials, or STORAGE_EMULATOR_HOST for an emulator.",
    )
    parser.add_argument("--verbose", action="store_true", help="log requests and show tracebacks")
    parser.add_argument("--endpoint", help="JSON API endpoint (default: STORAGE_EMULATOR_HOST, else GCS)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    clean = commands.add_parser(
        "clean",
        help="delete temporary composites that killed jobs left behind",
        description=(
            f"Delete objects under gs://BUCKET/{TEMPORARY_PREFIX} (compose_shards_by_gcs's temporary composites) "
            "created longer ago than --older-than. Running jobs delete their own; a killed one may leave some. "
            "A running job whose composite is deleted loads those objects directly instead."
        ),
    )
    clean.add_argument("bucket", type=_bucket, help="the bucket, as gs://BUCKET")
    clean.add_argument(
        "--older-than", type=_age, default="1d", metavar="AGE", help="minimum age, such as 30m, 6h or 2d (default: 1d)"
    )
    clean.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    clean.set_defaults(run=_clean)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.run(args))
    except (GCSError, OSError) as exc:
        if args.verbose:
            raise
        print(f"torchdata-gcs {args.command}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"torchdata-gcs {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
