"""The ``torchdata-gcs`` command: list, measure, pack and clean datasets on GCS, check a bucket, manage a local cache
and run a local emulator.

Exit codes: 0 done, 1 GCS refused or failed (one line on stderr; ``--verbose`` for the traceback),
2 bad usage.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import cast

from .._ops.checksums import ObjectInfo
from .._ops.uploads import UPLOAD_MARKERS
from .._ops.urls import TEMPORARY_PREFIX, parse_url, printable, validate_bucket
from .._transport.http import EMULATOR_ENV
from ..config import ClientConfig, TransferConfig
from ..errors import GCSError, InvalidURIError
from ..testing import Emulator, EmulatorError
from .bench import MAX_IN_FLIGHT
from .bench import bench as run_bench
from .cache import run_cache
from .clean import checked_age
from .clean import clean as run_clean
from .doctor import SCRATCH_MARK, doctor
from .listing import listed_with_stats
from .options import client_config
from .pack import run_pack, shard_size
from .sizes import human_size

__all__ = ["main"]


_SEED_BATCH = 256  # objects held in memory at once while seeding the emulator


# -- argument types --------------------------------------------------------------------------------


def _url(text: str) -> str:
    """Accept ``gs://bucket`` or ``gs://bucket/prefix``."""
    try:
        parse_url(text)
    except InvalidURIError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _endpoint(text: str) -> str:
    """Accept what ``ClientConfig(endpoint=...)`` accepts."""
    try:
        ClientConfig(endpoint=text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _bucket(text: str) -> str:
    bucket, name = parse_url(_url(text))
    if name:
        raise argparse.ArgumentTypeError(f"expected a bucket (gs://bucket), got {text!r}")
    return bucket


def _bucket_name(text: str) -> str:
    try:
        return validate_bucket(text)
    except InvalidURIError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _integer(low: int, high: int) -> Callable[[str], int]:
    """A type accepting integers from ``low`` to ``high``."""

    def parse(text: str) -> int:
        value = int(text) if re.fullmatch(r"\d+", text) else low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {text!r}")
        return value

    return parse


def _duration(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text!r}")
    return path


# -- ls --------------------------------------------------------------------------------------------


def _ls(args: argparse.Namespace) -> int:
    lister, listed = listed_with_stats(args.url, client_config(args), args.concurrency)
    count = total = 0
    started = time.perf_counter()
    for url, info in cast("Iterator[tuple[str, ObjectInfo]]", listed):
        count += 1
        total += info.size
        if args.long:
            print(f"{info.size:>14}  {printable(url)}")
    seconds = time.perf_counter() - started
    print(
        f"{count:,} objects, {human_size(total)} ({total:,} bytes) in {seconds:.2f} s: "
        f"{count / seconds:,.0f} objects/s ({lister.stats.requests:,} list request(s), concurrency {args.concurrency})"
    )
    return 0


# -- doctor ----------------------------------------------------------------------------------------


def _doctor(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM cleans up as Ctrl-C does
    try:
        report = doctor(args.url, client=client_config(args), say=lambda line: print(line, flush=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    if report.interrupted:
        raise KeyboardInterrupt
    return report.exit_code


# -- emulator --------------------------------------------------------------------------------------


def _seed(emulator: Emulator, bucket: str, objects: Iterator[tuple[str, bytes]]) -> int:
    """Upload ``objects`` a batch at a time, so a large seed is never held whole; how many there were."""
    count = 0
    while batch := list(itertools.islice(objects, _SEED_BATCH)):
        emulator.seed(bucket, batch)
        count += len(batch)
    return count


def _fill(emulator: Emulator, args: argparse.Namespace) -> None:
    """Create ``--bucket`` and upload ``--seed-dir``'s files and ``--objects`` random objects into it."""
    bucket = args.bucket
    emulator.create_bucket(bucket)
    if args.seed_dir:
        folder: Path = args.seed_dir
        files = (path for path in sorted(folder.rglob("*")) if path.is_file())
        count = _seed(emulator, bucket, ((path.relative_to(folder).as_posix(), path.read_bytes()) for path in files))
        print(f"gs://{bucket}/: {count:,} files from {folder}", flush=True)
    if args.objects:
        size = args.object_size
        count = _seed(emulator, bucket, ((f"objects/{i:07d}.bin", os.urandom(size)) for i in range(args.objects)))
        print(f"gs://{bucket}/objects/: {count:,} random objects of {size:,} bytes", flush=True)
    print(f"gs://{bucket}/ is ready", flush=True)


def _emulator(args: argparse.Namespace) -> int:
    if (args.seed_dir or args.objects) and not args.bucket:
        args.parser.error("--seed-dir and --objects need --bucket")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    try:
        with Emulator(backend=args.backend, data_dir=args.data_dir, port=args.port) as emulator:
            kept = f", objects kept in {args.data_dir}" if args.data_dir else ""
            print(f"fake-gcs-server ({emulator.backend} backend) at {emulator.endpoint}{kept}", flush=True)
            if args.bucket:
                _fill(emulator, args)
            try:  # a SIGTERM sent as soon as the address is out must find the loop below, not these prints
                print(f"export {EMULATOR_ENV}={emulator.endpoint}", flush=True)
                print("serving until Ctrl-C or SIGTERM", flush=True)
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        print("emulator stopped", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the command line ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchdata-gcs",
        description=(
            "List, measure and clean datasets on Google Cloud Storage, check a bucket, and run a local emulator."
        ),
        epilog=(
            "Credentials: Application Default Credentials, or STORAGE_EMULATOR_HOST for an emulator. "
            "Exit codes: 0 done, 1 GCS refused or failed, 2 bad usage."
        ),
    )
    parser.add_argument("--verbose", action="store_true", help="log requests and show tracebacks")
    parser.add_argument(
        "--endpoint",
        type=_endpoint,
        metavar="URL",
        help="where requests go, such as an emulator (default: STORAGE_EMULATOR_HOST, else GCS)",
    )
    parser.add_argument(
        "--anonymous", action="store_true", help="send no credentials (public buckets; the default for emulators)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = argparse.ArgumentParser(add_help=False)
    listing.add_argument(
        "--concurrency", type=_integer(1, 256), default=32, metavar="N", help="list requests at once (default: 32)"
    )
    billing = argparse.ArgumentParser(add_help=False)
    billing.add_argument(
        "--user-project", metavar="PROJECT", help="project billed for requests to a requester-pays bucket"
    )

    ls = commands.add_parser(
        "ls",
        parents=[billing, listing],
        help="count the objects under a prefix and their total size",
        description=(
            "List gs://BUCKET/PREFIX with list_files_by_gcs's parallel lister and print how many objects it "
            "holds, their total size, and how fast they were listed. A URL that does not end in '/' lists "
            f"that object and everything under URL/, as list_files_by_gcs does; {TEMPORARY_PREFIX} is skipped."
        ),
    )
    ls.add_argument("url", type=_url, metavar="URL", help="gs://BUCKET or gs://BUCKET/PREFIX")
    ls.add_argument("--long", "-l", action="store_true", help="also print each object: size in bytes, URL")
    ls.set_defaults(run=_ls)

    bench = commands.add_parser(
        "bench",
        parents=[billing, listing],
        help="measure listing and loading throughput on a prefix and suggest settings",
        description=(
            "Measure, on gs://BUCKET/PREFIX: listing throughput; then, on the first --limit objects listed, "
            "load_files_by_gcs at max_in_flight M and 2M, and compose_shards_by_gcs at M (objects/s, MB/s, "
            "requests, 429 answers), after an untimed read that opens the connections. Each step stops "
            "after --seconds. Prints a table and suggestions drawn only from what was measured. "
            "compose_shards_by_gcs needs permission to create and delete objects under "
            f"gs://BUCKET/{TEMPORARY_PREFIX}; without it the table says 'compose not permitted'. "
            "Objects are downloaded and discarded; GCS bills the requests (and egress outside its region)."
        ),
    )
    bench.add_argument("url", type=_url, metavar="URL", help="gs://BUCKET/PREFIX to measure on")
    bench.add_argument(
        "--limit", type=_integer(1, 1_000_000), default=2000, metavar="N", help="objects to load (default: 2000)"
    )
    bench.add_argument(
        "--seconds", type=_duration, default=10.0, metavar="S", help="time limit of each step (default: 10)"
    )
    bench.add_argument(
        "--max-in-flight",
        type=_integer(1, MAX_IN_FLIGHT),
        default=TransferConfig().max_in_flight,
        metavar="M",
        help="requests a loader keeps in flight "
        f"(TransferConfig.max_in_flight; default: {TransferConfig().max_in_flight})",
    )
    bench.set_defaults(run=run_bench)

    clean = commands.add_parser(
        "clean",
        parents=[billing],
        help="delete temporary composites and abort multipart uploads that killed jobs left behind",
        description=(
            f"Delete objects under gs://BUCKET/{TEMPORARY_PREFIX} (the temporary composites and parts of "
            "compose_shards_by_gcs and CompositeWriter) created longer ago than --older-than, and abort the "
            "bucket's unfinished XML API multipart uploads that torchdata-gcs started (MultipartWriter marks each) "
            "initiated longer ago than that, whose parts are billed until then (--all-uploads: every upload). "
            "Running jobs clean up after themselves; a killed one may leave some. A running job whose composite "
            "is deleted loads those objects directly instead; one whose upload is aborted fails, so keep "
            "--older-than above your longest upload. Then list the soft-deleted "
            f"objects under {TEMPORARY_PREFIX} (softDeleted=true) and say how many, their size and when the last "
            "expires: soft delete keeps deleted objects billed until then, and no request removes them sooner."
        ),
    )
    clean.add_argument("bucket", type=_bucket, help="the bucket, as gs://BUCKET")
    clean.add_argument(
        "--older-than",
        type=checked_age,
        default="1d",
        metavar="AGE",
        help="minimum age, such as 0s, 30m, 6h or 2d (default: 1d)",
    )
    clean.add_argument("--dry-run", action="store_true", help="list what would be deleted or aborted, change nothing")
    clean.add_argument(
        "--all-uploads",
        action="store_true",
        help="abort every unfinished multipart upload older than AGE, also those other tools started",
    )
    clean.set_defaults(run=run_clean)

    cache = commands.add_parser(
        "cache",
        help="what a local cache's folder holds (ls), or empty it (clear)",
        description=(
            "ls: the entries of the LocalCache at PATH, their size against the limit it was last used with, and "
            "the hit rate of its recent reads and of all counted. clear: remove every entry and the counts; "
            "jobs reading it meanwhile read what is gone from GCS again."
        ),
    )
    cache.add_argument("action", choices=("ls", "clear"), help="ls or clear")
    cache.add_argument("path", metavar="PATH", help="the folder given to LocalCache")
    cache.set_defaults(run=run_cache)

    doctor_command = commands.add_parser(
        "doctor",
        parents=[billing],
        help="check that a bucket allows everything torchdata-gcs does, with your credentials",
        description=(
            "Check gs://BUCKET/PREFIX with your own credentials: print the endpoint, the identity used and the "
            "bucket's settings (requester pays, soft delete, retention policy, object versioning, hierarchical "
            "namespace, location, default storage class, Autoclass, default event-based hold, lifecycle rules; these "
            "need storage.buckets.get, else 'unknown' but for location and namespace, which the storage layout "
            "tells), each with what it means for composites, checkpoints and clean, and the lifecycle file that "
            "adds the rules removing what killed jobs leave (AbortIncompleteMultipartUpload, Delete under the "
            "temporary prefix) if the bucket lacks them; then list, write (ifGenerationMatch=0), check that a "
            "second such write is refused with 412, read, compose, run an XML API multipart upload, list "
            "unfinished uploads, delete, and measure latency and throughput. Each check is OK, REFUSED (403), "
            "MISSING (the endpoint lacks it) or FAILED, with what that means for which feature. "
            f"Everything is written under PREFIX/{SCRATCH_MARK}<random>/ (and the multipart upload's marker "
            f"under {UPLOAD_MARKERS}) and deleted at the end, also on Ctrl-C; what cannot be deleted is named. "
            "Exit 0 when everything the library needs works, 1 when something is refused, missing or failed."
        ),
    )
    doctor_command.add_argument("url", type=_url, metavar="URL", help="gs://BUCKET or gs://BUCKET/PREFIX/")
    doctor_command.set_defaults(run=_doctor)

    pack = commands.add_parser(
        "pack",
        parents=[billing],
        help="pack the objects under a prefix into WebDataset tar shards",
        description=(
            "Pack the objects under gs://BUCKET/PREFIX/ (SRC) into WebDataset tar shards in the folder DST: "
            "shard-000000.tar, shard-000001.tar, ... each followed by its index (shard-000000.tar.idx, member "
            "offsets). Objects whose names share a key (000123.jpg, 000123.json) are one sample (--group-by stem), "
            "or each object is one (--group-by none); member names are relative to SRC. Shards are filled in name "
            "order up to --shard-size, so packing the same objects again gives the same shards, and a rerun of an "
            "interrupted pack skips the shards already whole. DST must not be inside SRC. Prints a progress line "
            "on stderr (objects/s, MB/s) and a summary at the end."
        ),
    )
    pack.add_argument("source", type=_url, metavar="SRC", help="gs://BUCKET/PREFIX/ holding the objects")
    pack.add_argument("destination", type=_url, metavar="DST", help="gs://BUCKET/FOLDER/ for the shards")
    pack.add_argument(
        "--shard-size",
        type=shard_size,
        default="512MiB",
        metavar="SIZE",
        help="bytes of tar per shard, such as 512MiB or 1GB (default: 512MiB); a larger sample is a shard alone",
    )
    pack.add_argument(
        "--group-by",
        choices=("stem", "none"),
        default="stem",
        help="stem (default): objects sharing a key are one sample; none: each object is a sample",
    )
    pack.set_defaults(run=run_pack)

    emulator = commands.add_parser(
        "emulator",
        help="run a local GCS emulator for notebooks and development",
        description=(
            "Start the embedded emulator (fake-gcs-server, from the 'emulator' extra) on a free port of "
            "127.0.0.1, optionally create a bucket and seed it, print the endpoint and the "
            f"'export {EMULATOR_ENV}=...' line that points torchdata-gcs and Google's clients at it, and serve "
            "until Ctrl-C or SIGTERM; then stop it and delete its data (unless --data-dir). "
            "The emulator has no XML API: MultipartWriter needs torchdata_gcs.testing.GCSFront in front of it."
        ),
    )
    emulator.add_argument("--bucket", type=_bucket_name, metavar="NAME", help="create this bucket")
    emulator.add_argument(
        "--seed-dir", type=_folder, metavar="DIR", help="upload DIR's files into --bucket, named by their path in DIR"
    )
    emulator.add_argument(
        "--objects", type=_integer(1, 10_000_000), metavar="N", help="upload N random objects to --bucket/objects/"
    )
    emulator.add_argument(
        "--object-size",
        type=_integer(0, 64 * 1024 * 1024),
        default=1024,
        metavar="BYTES",
        help="size of each of --objects (default: 1024)",
    )
    emulator.add_argument(
        "--backend",
        choices=("memory", "filesystem"),
        default="memory",
        help="memory (default) suits a few thousand objects; filesystem (RAM-backed) scales further",
    )
    emulator.add_argument(
        "--port", type=_integer(1, 65535), metavar="PORT", help="serve on this port (default: a free one)"
    )
    emulator.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="keep the objects in DIR for the next run (filesystem backend); default: deleted on exit",
    )
    emulator.set_defaults(run=_emulator, parser=emulator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.run(args))
    except BrokenPipeError:  # the reader went away (`torchdata-gcs ls --long | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush fails quietly
        return 0
    except (GCSError, OSError, EmulatorError) as exc:
        if args.verbose:
            raise
        print(printable(f"torchdata-gcs {args.command}: {exc}".splitlines()[0]), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"torchdata-gcs {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
