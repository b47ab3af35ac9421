"""The quickstart notebook runs top to bottom in a fresh kernel, on the embedded emulator, without errors."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"
KERNEL = "torchdata-gcs-tests"


def write_kernelspec(jupyter_dir: Path) -> None:
    """A kernel that runs on this very interpreter (where torchdata-gcs is installed), whatever kernels the
    machine has registered under the notebook's own kernel name."""
    spec = jupyter_dir / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))


def test_notebook_is_saved_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"saved with outputs: {cell.source[:60]!r}"


def test_quickstart_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jupyter_dir = tmp_path / "jupyter"
    write_kernelspec(jupyter_dir)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_dir))  # searched before the user's and the environment's kernels
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))  # connection files
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # the kernel's profile and history
    workdir = tmp_path / "work"
    workdir.mkdir()

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=240,  # per cell; the whole notebook takes well under a minute
        startup_timeout=120,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises CellExecutionError, with the cell's traceback, at the first failing cell

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    stdout = "".join(output.text for output in outputs if output.output_type == "stream" and output.name == "stdout")
    stderr = "".join(output.text for output in outputs if output.output_type == "stream" and output.name == "stderr")
    assert stderr == "", stderr
    assert ": 600 images," in stdout
    assert re.search(r"epoch 0: 600 images in [\d.]+ s \(circle=200, square=200, triangle=200\)", stdout), stdout
    assert re.search(r"epoch 1: 600 images in [\d.]+ s \(circle=200, square=200, triangle=200\)", stdout), stdout
    assert "images (64, 3, 32, 32) torch.uint8, labels (64,)" in stdout
    rates = dict(re.findall(r"(load_files_by_gcs|compose_shards_by_gcs): +([\d,]+) objects/s", stdout))
    assert set(rates) == {"load_files_by_gcs", "compose_shards_by_gcs"}, stdout
    assert all(int(rate.replace(",", "")) > 0 for rate in rates.values())
    assert re.search(r"load_files_by_gcs: .* 1\.0\d\d requests per object", stdout), stdout
    assert re.search(r"compose_shards_by_gcs: .* 0\.\d+ requests per object", stdout), stdout
    assert "temporary composites left in the bucket: 0" in stdout
    assert "round trip identical: True" in stdout
    assert "emulator stopped" in stdout
    figures = [output for output in outputs if output.output_type == "display_data" and "image/png" in output.data]
    assert len(figures) == 2  # the sample grid and the throughput chart
    assert list(workdir.iterdir()) == []  # the notebook leaves no files behind
