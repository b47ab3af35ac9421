"""Every Python block of README.md and docs/ runs, in page order, on the embedded emulator, so no page drifts.

A page's blocks share one namespace, as a script's (a ``__main__`` module, so pickle finds its functions) or a
notebook's cells do, and run in a fresh folder with ``STORAGE_EMULATOR_HOST`` pointing at a GCS front (for XML
multipart uploads) over a new emulator whose ``my-bucket`` holds ``train/00000.png`` ... ``train/00255.png``
(8 x 8 RGB images). A block that needs a module this environment lacks (DataLoader2 needs torchdata 0.9, the
nodes torchdata 0.10+) is skipped naming it: README's test command runs this file in both environments, so
each block runs in one of them. A block preceded by ``<!-- docs-test: skip: <reason> -->`` (a real bucket's
credentials, say) is skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import io
import linecache
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.doc_blocks import PAGES, Block, blocks_of
from torchdata_gcs.fsspec import GCSFileSystem
from torchdata_gcs.testing import Emulator, GCSFront

# Modules one environment of the test command has and the other lacks.
NEEDS = (
    "torchdata.nodes",
    "torchdata.dataloader2",
    "torchdata.datapipes",
    "torchdata.stateful_dataloader",
    "lightning",
)
IMAGES = 256
BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def missing_module(code: str) -> str | None:
    """The module ``code`` imports that this environment lacks, if any."""
    for name in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", code, re.M):
        for needed in NEEDS:
            if (name == needed or name.startswith(needed + ".")) and not _importable(needed):
                return needed
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def png(index: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (index % 256, 0, 255 - index % 256)).save(out, format="PNG")
    return out.getvalue()


@dataclass
class PageRun:
    """One page's emulator, front, folder and namespace, kept while its blocks run."""

    emulator: Emulator
    front: GCSFront
    folder: Path
    script: types.ModuleType = field(default_factory=lambda: types.ModuleType("__main__"))
    failed: str | None = None

    def close(self) -> None:
        self.front.stop()
        self.emulator.stop()


@pytest.fixture(scope="session")
def page_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PageRun]]:
    runs: dict[str, PageRun] = {}
    yield runs
    for run in runs.values():
        run.close()


def page_run(page: str, runs: dict[str, PageRun], tmp_path_factory: pytest.TempPathFactory) -> PageRun:
    if page not in runs:
        for run in runs.values():
            run.close()
        runs.clear()
        GCSFileSystem.clear_instance_cache()  # fsspec keeps filesystems made on an earlier page's emulator
        emulator = Emulator().start()
        emulator.seed("my-bucket", {f"train/{i:05d}.png": png(i) for i in range(IMAGES)})
        front = GCSFront(emulator.endpoint).start()
        runs[page] = PageRun(emulator, front, tmp_path_factory.mktemp(Path(page).stem))
    return runs[page]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{block.page}:{block.line}" for block in BLOCKS])
def test_block_runs(
    block: Block,
    page_runs: dict[str, PageRun],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if block.skip:
        pytest.skip(block.skip)
    needed = missing_module(block.code)
    if needed:
        pytest.skip(f"needs {needed}, which this environment lacks; the other environment of the test command runs it")
    pytest.importorskip("PIL", reason="the page's images are made with pillow")
    run = page_run(block.page, page_runs, tmp_path_factory)
    if run.failed:
        pytest.fail(f"an earlier block of {block.page} failed ({run.failed}), so this one cannot run")
    monkeypatch.chdir(run.folder)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", run.front.endpoint)
    monkeypatch.setitem(sys.modules, "__main__", run.script)  # what pickle finds the page's functions in
    filename = f"{block.page}:{block.line}"
    linecache.cache[filename] = (len(block.code), None, block.code.splitlines(keepends=True), filename)
    try:
        exec(compile(block.code, filename, "exec"), run.script.__dict__)  # noqa: S102
    except BaseException:
        run.failed = f"line {block.line}"
        raise


def test_every_page_is_collected() -> None:
    """The fence pattern finds every Python block: a block it misses would silently never run."""
    for page in PAGES:
        text = page.read_text()
        assert len(blocks_of(page)) == text.count("```python\n"), page
    assert len(BLOCKS) > 0
    assert PAGES[0].name == "README.md"


def test_readme_links_resolve() -> None:
    """README.md is read outside the site (on a repository's page, in a package index), so the strict site
    build does not check it: every relative link of it must name a file that exists."""
    readme = PAGES[0]
    targets = re.findall(r"\]\((?!https?://|#)([^)#\s]+)", readme.read_text())
    assert targets, "README links into the site"
    missing = [target for target in targets if not (readme.parent / target).exists()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"
