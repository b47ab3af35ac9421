"""``mv`` as gcsfs's, over HTTP to the emulator through a ``GCSFront`` that records requests: each object is
moved on its own (``mv_file``: a server-side rewrite of the live version, then a delete of the source only
while it is still that version, so an object written there meanwhile is not lost), sources and destinations
paired as ``copy`` pairs them; and ``on_google`` tells whether requests go to Google's endpoint."""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from torchdata_gcs.config import ClientConfig
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fs(front: GCSFront) -> GCSFileSystem:
    return GCSFileSystem(client=front.client_config, skip_instance_cache=True)


def _deletes(front: GCSFront) -> dict[str, dict[str, list[str]]]:
    """The query of each object DELETE the front received, by object name."""
    found = {}
    for request in front.recorded:
        target = urlsplit(request.target)
        if request.method == "DELETE" and "/o/" in target.path:
            found[unquote(target.path.rpartition("/o/")[2])] = parse_qs(target.query)
    return found


def test_a_tree_moves_object_by_object_each_source_deleted_only_while_it_is_the_generation_copied(
    fs: GCSFileSystem, front: GCSFront, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    fs.pipe({f"{gcs_bucket}/src/a.txt": b"a", f"{gcs_bucket}/src/sub/b.txt": b"b", f"{gcs_bucket}/src/empty/": b""})
    generations = {
        name.removeprefix(f"{gcs_bucket}/"): entry["generation"]
        for name, entry in fs.find(f"{gcs_bucket}/src", detail=True).items()
    }
    assert sorted(generations) == ["src/a.txt", "src/empty/", "src/sub/b.txt"]
    front.recorded.clear()
    fs.mv(f"gs://{gcs_bucket}/src", f"gs://{gcs_bucket}/dst", recursive=True)
    assert gcs_emulator.names(gcs_bucket) == ["dst/a.txt", "dst/empty/", "dst/sub/b.txt"]
    assert fs.cat(f"{gcs_bucket}/dst/sub/b.txt") == b"b" and fs.ls(f"{gcs_bucket}/dst/empty") == [
        f"{gcs_bucket}/dst/empty"
    ]
    assert _deletes(front) == {name: {"ifGenerationMatch": [str(gen)]} for name, gen in generations.items()}


@pytest.mark.parametrize(
    ("source", "destination", "moved"),
    [
        (["d/a.txt", "d/b.txt"], "to/", ["to/a.txt", "to/b.txt"]),
        (["d/a.txt", "d/b.txt"], ["x/1", "x/2"], ["x/1", "x/2"]),
        ("d/*.txt", "to/", ["to/a.txt", "to/b.txt"]),
        ("d/a.txt", "renamed.txt", ["renamed.txt"]),
        ("d/a.txt", "existing/", ["existing/a.txt"]),
    ],
)
def test_sources_and_destinations_pair_as_copy_pairs_them(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str, source: object, destination: object, moved: list[str]
) -> None:
    fs.pipe({f"{gcs_bucket}/d/a.txt": b"a", f"{gcs_bucket}/d/b.txt": b"b", f"{gcs_bucket}/existing/e": b"e"})

    def path(name: str) -> str:
        return f"{gcs_bucket}/{name}"

    fs.mv(
        [path(s) for s in source] if isinstance(source, list) else path(str(source)),
        [path(d) for d in destination] if isinstance(destination, list) else path(str(destination)),
    )
    left = {"d/a.txt", "d/b.txt", "existing/e"} - {s for s in (source if isinstance(source, list) else [])}
    if not isinstance(source, list):
        left -= {"d/a.txt", "d/b.txt"} if "*" in str(source) else {str(source)}
    assert gcs_emulator.names(gcs_bucket) == sorted(left | set(moved))


def test_moving_what_is_missing_raises_and_a_directory_needs_recursive(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    fs.pipe({f"{gcs_bucket}/d/a.txt": b"a"})
    with pytest.raises(IsADirectoryError, match="recursive=True"):  # gcsfs moves nothing, silently
        fs.mv(f"{gcs_bucket}/d", f"{gcs_bucket}/to2")
    fs.mv(f"{gcs_bucket}/d*", f"{gcs_bucket}/to2/")  # a glob's directories are skipped, as copy skips them
    fs.mv(f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/a.txt")  # onto itself: nothing to do
    assert gcs_emulator.names(gcs_bucket) == ["d/a.txt"]
    with pytest.raises(FileNotFoundError):
        fs.mv(f"{gcs_bucket}/missing.txt", f"{gcs_bucket}/to.txt")
    with pytest.raises(FileNotFoundError):  # each object moves on its own: what is there moves
        fs.mv([f"{gcs_bucket}/d/a.txt", f"{gcs_bucket}/d/missing.txt"], f"{gcs_bucket}/to/")
    assert gcs_emulator.names(gcs_bucket) == ["to/a.txt"]


def test_on_google_tells_whether_requests_go_to_googles_endpoint(
    gcs_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert GCSFileSystem(client=gcs_emulator.client_config, skip_instance_cache=True).on_google is False
    assert GCSFileSystem(token="anon", skip_instance_cache=True).on_google is True
    google = GCSFileSystem(endpoint_url="https://storage.googleapis.com", token="anon", skip_instance_cache=True)
    assert google.on_google is True
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    assert GCSFileSystem(client=ClientConfig(anonymous=True), skip_instance_cache=True).on_google is False


def test_lists_of_sources_and_destinations_of_different_lengths_are_refused(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    fs.pipe({f"{gcs_bucket}/a": b"a", f"{gcs_bucket}/b": b"b"})
    with pytest.raises(ValueError, match="2 sources but 1 destinations"):
        fs.mv([f"{gcs_bucket}/a", f"{gcs_bucket}/b"], [f"{gcs_bucket}/x"])
    assert gcs_emulator.names(gcs_bucket) == ["a", "b"]


def test_keywords_mv_does_not_take_are_refused_by_name(
    fs: GCSFileSystem, gcs_emulator: Emulator, gcs_bucket: str
) -> None:
    fs.pipe_file(f"{gcs_bucket}/a", b"a")
    with pytest.raises(TypeError, match="consistency"):
        fs.mv(f"{gcs_bucket}/a", f"{gcs_bucket}/b", consistency="md5")
    fs.mv(f"{gcs_bucket}/a", f"{gcs_bucket}/b", batch_size=1)  # fsspec's: how many at once
    assert gcs_emulator.names(gcs_bucket) == ["b"]
