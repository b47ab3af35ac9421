"""What installing the package brings, and what it leaves alone."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import metadata, requires
from pathlib import Path

from packaging.requirements import Requirement


def test_torchdata_is_only_an_extra() -> None:
    """pip never replaces a user's torchdata: ``[dataloader2]`` pins 0.9 (DataLoader2), ``[nodes]`` asks for 0.10+."""
    torchdata = [Requirement(text) for text in requires("torchdata-gcs") or [] if Requirement(text).name == "torchdata"]
    assert torchdata and not any(r.marker is None or r.marker.evaluate({"extra": ""}) for r in torchdata)
    pinned = {
        extra: [r.specifier for r in torchdata if r.marker is not None and r.marker.evaluate({"extra": extra})]
        for extra in ("dataloader2", "nodes")
    }
    assert pinned["dataloader2"] and all(
        s.contains("0.9.0") and not s.contains("0.10.0") for s in pinned["dataloader2"]
    )
    assert pinned["nodes"] and all(s.contains("0.11.0") and not s.contains("0.9.0") for s in pinned["nodes"])


def test_the_datapipes_need_no_torchdata(gcs_emulator, gcs_bucket) -> None:
    """With torchdata impossible to import, the package imports and its DataPipes list and load."""
    gcs_emulator.seed(gcs_bucket, {"a.txt": b"alpha", "b.txt": b"beta"})
    program = f"""
import sys
from pathlib import Path
sys.modules["torchdata"] = None  # any import of torchdata now fails
import torchdata_gcs
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper
from torchdata_gcs import ClientConfig
client = ClientConfig(endpoint={gcs_emulator.endpoint!r})
pipe = IterableWrapper(["gs://{gcs_bucket}/"]).list_files_by_gcs(client=client).sharding_filter()
pipe = pipe.load_files_by_gcs(client=client).map(lambda item: (item[0], item[1].read()))
print(sorted(tuple(item) for item in DataLoader(pipe, batch_size=None, num_workers=2)))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([(f"gs://{gcs_bucket}/a.txt", b"alpha"), (f"gs://{gcs_bucket}/b.txt", b"beta")])


def extra_requirements(extra: str, seen: frozenset[str] = frozenset()) -> list[Requirement]:
    """What ``pip install 'torchdata-gcs[extra]'`` asks for beyond the core, through other extras too."""
    found = []
    for text in requires("torchdata-gcs") or []:
        requirement = Requirement(text)
        if requirement.marker is None or not requirement.marker.evaluate({"extra": extra}):
            continue
        if requirement.name == "torchdata-gcs":
            for inner in sorted(requirement.extras - seen - {extra}):
                found += extra_requirements(inner, seen | {extra})
        else:
            found.append(requirement)
    return found


def keeps_torchdata_0_10_and_later(requirement: Requirement) -> bool:
    return all(requirement.specifier.contains(version) for version in ("0.10.0", "0.11.0"))


def test_only_a_dataloader2_extra_takes_torchdata_below_0_10() -> None:
    """A user with torchdata 0.10 or 0.11 keeps it through every extra but those named for DataLoader2."""
    extras = metadata("torchdata-gcs").get_all("Provides-Extra") or []
    assert {"dataloader2", "examples", "test"} <= set(extras)
    downgrading = {
        extra: sorted(
            f"{r.name}{r.specifier}"
            for r in extra_requirements(extra)
            if r.name == "torchdata" and not keeps_torchdata_0_10_and_later(r)
        )
        for extra in extras
        if "dataloader2" not in extra
    }
    assert {extra: found for extra, found in downgrading.items() if found} == {}
    assert not any(
        keeps_torchdata_0_10_and_later(r) for r in extra_requirements("dataloader2") if r.name == "torchdata"
    )


def test_ci_lints_with_the_pinned_ruff() -> None:
    """README's test command (what CI runs) checks and format-checks with ruff before the tests, and the
    ``test`` extra it installs pins ruff exactly, so every machine lints alike; it builds the site strictly and
    runs the docs' blocks in both environments."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    command = readme.split("<!-- test-command -->", 1)[1].split("<!-- /test-command -->", 1)[0]
    steps = [step.strip() for step in command.strip("`\n ").split("&&")]
    install = steps.index("python3 -m venv .venv") + 2
    assert steps[install] == ".venv/bin/pip install -e '.[test,dataloader2,docs]'"
    lint = [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."]
    assert steps[install + 1 : install + 3] == lint
    assert steps.index(lint[1]) < steps.index(".venv/bin/python -m pytest")
    assert ".venv/bin/mkdocs build --strict --site-dir site" in steps, "the site's strict build is part of the command"
    assert "tests/test_docs.py" in steps[-1], "the second environment runs the docs' blocks that need torchdata 0.10+"
    ruff = [r for r in extra_requirements("test") if r.name == "ruff"]
    assert len(ruff) == 1 and str(ruff[0].specifier).startswith("==")
