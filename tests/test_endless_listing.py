"""A server that hands a page token back (or repeats a page) ends every lister with a ListingError naming the
prefix, after a few list requests, instead of paging and billing forever."""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from torchdata_gcs import ClientConfig, GCSFileListerIterDataPipe, GCSIterableDataset, ListingError, RetryConfig
from torchdata_gcs._ops.client import Client
from torchdata_gcs._ops.paging import PageTrail
from torchdata_gcs._ops.temporaries import list_soft_deleted, list_versions
from torchdata_gcs._ops.urls import TEMPORARY_PREFIX
from torchdata_gcs.cli import main
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, Fault, GCSFront

PAGE = 3  # entries per list page: the dozen objects below span several pages
DEADLINE = 30.0  # seconds: a listing that does not end is stopped long before
BUCKET = "endless-listing"


@pytest.fixture(scope="module")
def front(gcs_emulator: Emulator) -> Iterator[GCSFront]:
    gcs_emulator.seed(
        BUCKET,
        {
            **{f"data/{i:03d}.bin": b"x" for i in range(12)},
            **{f"data/sub{i}/x.bin": b"y" for i in range(8)},
            **{f"{TEMPORARY_PREFIX}20200101T000000Z-host-1-abcdef/{i:09d}": b"t" for i in range(8)},
        },
    )
    with GCSFront(gcs_emulator.endpoint, page_size=PAGE) as running:
        yield running


@pytest.fixture
def stuck(front: GCSFront) -> Iterator[GCSFront]:
    """The front, answering every page after the first with its own request's token as the next one."""
    front.set_faults([Fault("repeat_token")])
    front.reset_counts()
    yield front
    front.set_faults([])


def ends_within(call: Callable[[], object], seconds: float = DEADLINE) -> BaseException | None:
    """What ``call`` raised (``None``: nothing), failing the test if it has not ended within ``seconds`` (it
    is then left to fail once its front stops)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still listing after {seconds:g} s"
    return outcome[0]


def ends_in_listing_error(call: Callable[[], object], prefix: str, front: GCSFront) -> ListingError:
    error = ends_within(call)
    assert isinstance(error, ListingError), error
    assert prefix in str(error) and error.url is not None and prefix in error.url
    assert "a second time" in str(error)
    assert front.faults_injected["repeat_token"] >= 1
    assert front.counts["list"] <= 20  # a few pages, not a loop
    return error


@pytest.mark.parametrize("concurrency", [1, 4])
def test_the_parallel_lister_stops_on_a_repeated_token(stuck: GCSFront, concurrency: int) -> None:
    pipe = GCSFileListerIterDataPipe(
        f"gs://{BUCKET}/data/", client=stuck.client_config, page_size=PAGE, concurrency=concurrency
    )
    ends_in_listing_error(lambda: list(pipe), f"gs://{BUCKET}/data/", stuck)


def test_a_dataset_is_not_made_from_an_endless_listing(stuck: GCSFront) -> None:
    ends_in_listing_error(
        lambda: GCSIterableDataset(f"gs://{BUCKET}/data/", client=stuck.client_config), f"gs://{BUCKET}/data/", stuck
    )


def test_fsspec_ls_names_each_folder_once_however_many_pages_name_it(front: GCSFront) -> None:
    """The emulator names every prefix on every page of a listing by level: not a listing going round, and
    each folder is listed once."""
    fs = GCSFileSystem(client=front.client_config, skip_instance_cache=True)
    front.reset_counts()
    listed = fs.ls(f"{BUCKET}/data", detail=False)
    assert sorted(listed) == sorted(
        [f"{BUCKET}/data/{i:03d}.bin" for i in range(12)] + [f"{BUCKET}/data/sub{i}" for i in range(8)]
    )
    assert front.counts["list"] >= 4  # several pages, each naming the folders


def test_fsspec_ls_and_find_stop_on_a_repeated_token(stuck: GCSFront) -> None:
    fs = GCSFileSystem(client=stuck.client_config, skip_instance_cache=True)
    ends_in_listing_error(lambda: fs.ls(f"{BUCKET}/data"), f"gs://{BUCKET}/data/", stuck)
    stuck.reset_counts()
    ends_in_listing_error(lambda: fs.find(f"{BUCKET}/data"), f"gs://{BUCKET}/data/", stuck)


def test_the_listers_of_temporary_objects_stop_on_a_repeated_token(stuck: GCSFront) -> None:
    client = Client(stuck.client_config, RetryConfig())
    prefix = f"gs://{BUCKET}/{TEMPORARY_PREFIX}"
    ends_in_listing_error(lambda: list(list_versions(client, BUCKET, TEMPORARY_PREFIX)), prefix, stuck)
    stuck.bucket_overlay.update(BUCKET, {"softDeletePolicy": {"retentionDurationSeconds": "604800"}})
    for name in [f"{TEMPORARY_PREFIX}gone/{i}" for i in range(2 * PAGE)]:  # through the front: deleted softly
        requests.post(
            f"{stuck.endpoint}/upload/storage/v1/b/{BUCKET}/o", params={"uploadType": "media", "name": name}, data=b"s"
        ).raise_for_status()
        requests.delete(
            f"{stuck.endpoint}/storage/v1/b/{BUCKET}/o/{requests.utils.quote(name, safe='')}"
        ).raise_for_status()
    stuck.reset_counts()
    ends_in_listing_error(lambda: list(list_soft_deleted(client, BUCKET, TEMPORARY_PREFIX)), prefix, stuck)


def test_the_cli_says_so_in_one_line(stuck: GCSFront, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = ["--endpoint", stuck.endpoint]
    codes: list[int] = []
    assert ends_within(lambda: codes.append(main([*endpoint, "ls", f"gs://{BUCKET}/data/"]))) is None
    clean = [*endpoint, "clean", f"gs://{BUCKET}", "--older-than", "0s", "--dry-run"]
    assert ends_within(lambda: codes.append(main(clean))) is None
    assert codes == [1, 1]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("makes no progress" in line and "a second time" in line for line in err)
    assert f"gs://{BUCKET}/data/" in err[0] and f"gs://{BUCKET}/{TEMPORARY_PREFIX}" in err[1]


def test_clean_stops_on_repeated_multipart_upload_markers(stuck: GCSFront, capsys: pytest.CaptureFixture[str]) -> None:
    for number in range(2 * PAGE):
        answer = requests.post(f"{stuck.endpoint}/{BUCKET}/old/{number}.pt", params={"uploads": ""})
        assert answer.status_code == 200
    stuck.set_faults([Fault("repeat_token", match=r"\?uploads")])
    stuck.reset_counts()
    codes: list[int] = []
    clean = ["--endpoint", stuck.endpoint, "clean", f"gs://{BUCKET}", "--older-than", "0s", "--dry-run"]
    assert ends_within(lambda: codes.append(main(clean))) is None
    assert codes == [1]
    err = capsys.readouterr().err
    assert f"gs://{BUCKET}" in err and "a second time" in err and stuck.counts["list"] <= 20


# -- what counts as no progress -------------------------------------------------------------------


def test_a_page_that_repeats_earlier_entries_with_a_new_token_is_no_progress() -> None:
    trail = PageTrail("gs://b/p/")
    assert trail.follow([("p/a", "1"), ("p/b", "1")], "t1") == "t1"
    with pytest.raises(ListingError, match="page 2 names only what earlier pages listed"):
        trail.follow([("p/a", "1"), ("p/b", "1")], "t2")
    trail = PageTrail("gs://b/p/")
    trail.follow([("p/a", "1"), ("p/b", "1")], "t1")
    with pytest.raises(ListingError, match="page 2 names only"):  # backwards, whatever the token
        trail.follow([("p/a", "1")], "t2")


def test_prefixes_named_again_are_no_progress_on_their_own() -> None:
    trail = PageTrail("gs://b/p/")
    assert trail.follow([("p/a", "1")], "t1", ["p/x/", "p/y/"]) == "t1"
    assert trail.follow([("p/b", "1")], "t2", ["p/x/", "p/y/"]) == "t2"  # some servers name them on every page
    assert trail.follow([], "t3", ["p/x/", "p/z/"]) == "t3"
    with pytest.raises(ListingError, match="page 4 names only"):
        trail.follow([], "t4", ["p/y/"])


ENTRY = st.tuples(st.text("ab/", min_size=1, max_size=3), st.sampled_from(["", "1", "2", "3"]))


@given(
    entries=st.lists(ENTRY, unique=True, max_size=30).map(sorted),
    cuts=st.lists(st.integers(0, 30), max_size=8),
    empty_pages=st.lists(st.integers(0, 8), max_size=4),
)
def test_a_listing_in_order_is_always_followed_to_its_end(
    entries: list[tuple[str, str]], cuts: list[int], empty_pages: list[int]
) -> None:
    """Entries in GCS's order, cut into pages anywhere (versions of one name across pages too), with empty
    pages between (GCS sends those), are followed to the end."""
    bounds = sorted({0, len(entries), *(min(cut, len(entries)) for cut in cuts)})
    pages = [entries[a:b] for a, b in itertools.pairwise(bounds)] or [[]]
    for position in sorted(empty_pages, reverse=True):
        pages.insert(min(position, len(pages)), [])
    trail = PageTrail("gs://b/")
    for number, page in enumerate(pages):
        last = number == len(pages) - 1
        assert trail.follow(page, None if last else f"token-{number}") == (None if last else f"token-{number}")


# -- a server that repeats its page under a new token every time ----------------------------------


@pytest.fixture
def same_page_server() -> Iterator[tuple[ClientConfig, list[str]]]:
    """A server answering every list request with the same objects and a token never given before, as a
    broken proxy or server could; its client settings, and the requests it got."""
    requests_seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            requests_seen.append(self.path)
            items = [{"name": f"p/{n}", "size": "1", "generation": "7", "crc32c": "AAAAAA=="} for n in "ab"]
            body = json.dumps({"items": items, "nextPageToken": uuid.uuid4().hex}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ClientConfig(endpoint=f"http://127.0.0.1:{server.server_address[1]}"), requests_seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("lister", ["list_files_by_gcs", "fsspec ls", "list_versions"])
def test_the_same_page_under_new_tokens_ends_the_lister(
    same_page_server: tuple[ClientConfig, list[str]], lister: str
) -> None:
    client, seen = same_page_server
    calls: dict[str, Callable[[], object]] = {
        "list_files_by_gcs": lambda: list(GCSFileListerIterDataPipe("gs://bkt/p/", client=client, concurrency=4)),
        "fsspec ls": lambda: GCSFileSystem(client=client, skip_instance_cache=True).ls("bkt/p"),
        "list_versions": lambda: list(list_versions(Client(client, RetryConfig()), "bkt", "p/")),
    }
    error = ends_within(calls[lister])
    assert isinstance(error, ListingError), error
    assert "page 2 names only what earlier pages listed" in str(error) and "gs://bkt/p/" in str(error)
    assert len(seen) == 2
