"""Which filesystem serves gs:// in every process: the main one, DataLoader workers made by fork, spawn
and forkserver, and plain subprocesses; without gcsfs, and with the real gcsfs installed beside us."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchdata_gcs.testing import Emulator
from torchdata_gcs_fsspec_handler import VARIABLE, choose

pytestmark = pytest.mark.timeout(240)

OURS = "torchdata_gcs.fsspec.GCSFileSystem"
GCSFS = "gcsfs.core.GCSFileSystem"
PLACES = ["main", "fork", "spawn", "forkserver", "subprocess"]

PROGRAM = '''
"""Reports, for each kind of process, the class that serves gs:// there and the object read through it."""
import json
import subprocess
import sys

import fsspec
from torch.utils.data import DataLoader, Dataset


def served(url):
    cls = type(fsspec.filesystem("gs"))
    with fsspec.open(url, "rb") as f:
        return [f"{cls.__module__}.{cls.__qualname__}", f.read().decode()]


class Reads(Dataset):
    def __init__(self, url):
        self.url = url

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return served(self.url)


if __name__ == "__main__":
    url, call = sys.argv[1], sys.argv[2]
    if call == "child":
        print(json.dumps(served(url)))
        sys.exit()
    if call == "register":
        import torchdata_gcs.fsspec

        torchdata_gcs.fsspec.register()
    report = {"main": served(url)}
    for context in ("fork", "spawn", "forkserver"):
        (report[context],) = DataLoader(Reads(url), batch_size=None, num_workers=1, multiprocessing_context=context)
    child = subprocess.run([sys.executable, __file__, url, "child"], capture_output=True, text=True, check=True)
    report["subprocess"] = json.loads(child.stdout)
    print(json.dumps(report))
'''


def environment(emulator: Emulator, **settings: str) -> dict[str, str]:
    """This process's environment pointed at the emulator, with no choice of ours in it unless given;
    Google's clients never look for a metadata server (gcsfs would, to find credentials)."""
    environ = {key: value for key, value in os.environ.items() if key != VARIABLE}
    environ.update(emulator.environ)
    environ.update(NO_GCE_CHECK="true", GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9")
    environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # gcsfs 2026.x would first call a gRPC API
    environ.update(settings)
    return environ


def run(python: str, arguments: list[str], environ: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, *arguments], capture_output=True, text=True, env=environ, cwd=cwd, timeout=200, check=False
    )


def served_everywhere(python: str, emulator: Emulator, bucket: str, tmp_path: Path, call: str, **settings: str):
    """``{place: [class, text]}`` from the program above, run by ``python``."""
    emulator.upload(bucket, "x", b"the object's bytes")
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    done = run(python, [str(program), f"gs://{bucket}/x", call], environment(emulator, **settings), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def python_with_gcsfs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An interpreter that sees this environment's packages plus the real gcsfs (from PyPI, with what it
    needs beyond them), as a user who has both installed has."""
    folder = tmp_path_factory.mktemp("gcsfs-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = str(folder / "bin" / "python")
    own_site = run(python, ["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], {}, folder)
    parent_site = run(sys.executable, ["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], {}, folder)
    link = f"import site; site.addsitedir({parent_site.stdout.strip()!r})\n"  # also reads its .pth files
    (Path(own_site.stdout.strip()) / "parent-environment.pth").write_text(link)
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--disable-pip-version-check"]
    installed = subprocess.run([*pip, "gcsfs"], capture_output=True, text=True, timeout=600, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return python


def everywhere(served: str) -> dict[str, list[str]]:
    return {place: [served, "the object's bytes"] for place in PLACES}


@pytest.mark.parametrize("call", ["nothing", "register"])
def test_without_gcsfs_gs_urls_are_ours_in_every_process(
    gcs_emulator: Emulator, gcs_bucket: str, tmp_path: Path, call: str
) -> None:
    assert run(sys.executable, ["-c", "import gcsfs"], {}, tmp_path).returncode != 0, "this environment has gcsfs"
    assert served_everywhere(sys.executable, gcs_emulator, gcs_bucket, tmp_path, call) == everywhere(OURS)


@pytest.mark.parametrize(
    ("call", "settings", "served"),
    [
        ("nothing", {}, GCSFS),  # installing torchdata-gcs changes nothing for a gcsfs user
        ("register", {}, OURS),
        ("nothing", {VARIABLE: "1"}, OURS),  # a whole job, without code
        ("nothing", {VARIABLE: "0"}, GCSFS),
    ],
    ids=["nothing", "register", "variable-1", "variable-0"],
)
def test_with_gcsfs_installed_gs_urls_are_gcsfs_unless_ours_is_asked_for(
    python_with_gcsfs: str,
    gcs_emulator: Emulator,
    gcs_bucket: str,
    tmp_path: Path,
    call: str,
    settings: dict[str, str],
    served: str,
) -> None:
    found = served_everywhere(python_with_gcsfs, gcs_emulator, gcs_bucket, tmp_path, call, **settings)
    assert found == everywhere(served)


def test_a_gcsfs_user_never_imports_torchdata_gcs_through_fsspec(
    python_with_gcsfs: str, gcs_emulator: Emulator, tmp_path: Path
) -> None:
    program = (
        "import sys, fsspec; fsspec.filesystem('gs'); print(sorted({'torch', 'torchdata_gcs'} & set(sys.modules)))"
    )
    done = run(python_with_gcsfs, ["-c", program], environment(gcs_emulator), tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr[-3000:]


def test_a_variable_that_asks_for_gcsfs_where_it_is_missing_fails_as_fsspec_would(
    gcs_emulator: Emulator, tmp_path: Path
) -> None:
    done = run(
        sys.executable,
        ["-c", "import fsspec; fsspec.filesystem('gs')"],
        environment(gcs_emulator, **{VARIABLE: "0"}),
        tmp_path,
    )
    assert (
        done.returncode != 0
        and "ImportError: TORCHDATA_GCS_FSSPEC=0 asks for gcsfs, which is not installed" in done.stderr
    )


@pytest.mark.parametrize(
    ("environ", "gcsfs_installed", "expected"),
    [
        ({}, False, "torchdata_gcs.fsspec"),
        ({}, True, "gcsfs"),
        ({VARIABLE: ""}, True, "gcsfs"),
        ({VARIABLE: "1"}, False, "torchdata_gcs.fsspec"),
        ({VARIABLE: "1"}, True, "torchdata_gcs.fsspec"),
        ({VARIABLE: "0"}, True, "gcsfs"),
    ],
)
def test_the_rule(environ: dict[str, str], gcsfs_installed: bool, expected: str) -> None:
    assert choose(environ, gcsfs_installed) == expected


def test_the_rule_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ImportError, match="asks for gcsfs, which is not installed: pip install gcsfs"):
        choose({VARIABLE: "0"}, gcsfs_installed=False)
    with pytest.raises(ValueError, match="TORCHDATA_GCS_FSSPEC='yes': 1 serves gs:// with torchdata_gcs, 0 with gcsfs"):
        choose({VARIABLE: "yes"}, gcsfs_installed=True)
