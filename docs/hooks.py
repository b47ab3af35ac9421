"""Build hooks for the site (mkdocs): the benchmark charts, drawn from ``benchmarks/results/*.json`` at every
build so no figure is drawn by hand or goes stale, and a check that the API reference documents every name in
the ``__all__`` of every public module (the package and its modules and packages not named ``_...``)."""

from __future__ import annotations

import ast
import json
import re
from html import escape
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PACKAGE = ROOT / "torchdata_gcs"
OURS = re.compile(r"torchdata-gcs|^ours", re.I)
documented: set[str] = set()


def on_files(files: Files, config: Any) -> Files:
    for name, svg in charts().items():
        files.append(File.generated(config, f"charts/{name}.svg", content=svg))
    return files


def on_post_page(output: str, page: Any, config: Any) -> str:
    documented.update(re.findall(r'id="(torchdata_gcs(?:\.\w+)+)"', output))
    return SPHINX_ROLE.sub(_as_code, output)


# The docstrings name objects as Sphinx does (:class:`X`, :meth:`~a.b.c`), which IDEs and help() show as
# written; the site shows the name alone, as code.
SPHINX_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):<code>(~?)([^<]+)</code>")


def _as_code(match: re.Match[str]) -> str:
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{name}</code>"


def on_post_build(config: Any) -> None:
    missing = [
        f"{module}.{name}"
        for module, names in public_names().items()
        for name in names
        if not any(anchor.startswith(f"{module}.") and anchor.endswith(f".{name}") for anchor in documented)
    ]
    if missing:
        raise PluginError(f"the API reference lacks {len(missing)} public names: {', '.join(missing)}")


def public_names() -> dict[str, list[str]]:
    """Each public module's ``__all__``, read from its source. A name may be documented where it is defined
    (``torchdata_gcs.shards.pack.pack``, whose module shares its name) as long as that is inside the module."""
    modules = {"torchdata_gcs": PACKAGE / "__init__.py"}
    for path in sorted(PACKAGE.iterdir()):
        if path.name.startswith("_"):
            continue
        if path.suffix == ".py":
            modules[f"torchdata_gcs.{path.stem}"] = path
        elif (path / "__init__.py").exists():
            modules[f"torchdata_gcs.{path.name}"] = path / "__init__.py"
    return {module: _all_of(path) for module, path in modules.items()}


def _all_of(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "__all__" for target in node.targets):
            return [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    return []


def charts() -> dict[str, str]:
    """Every chart, by file name, from the recorded benchmark results."""
    out: dict[str, str] = {}
    results = _load("results.json")
    for workload, latency, unit in (
        ("small objects", 0, "MB/s"),
        ("small objects", 20, "MB/s"),
        ("large objects", 0, "MB/s"),
        ("listing", 20, "names/s"),
    ):
        rows = [row for row in results["rows"] if row["workload"] == workload and row["latency_ms"] == latency]
        bars = [(row["label"], _rate(row, unit)) for row in rows if "error" not in row]
        name = f"{workload.replace(' ', '-')}-{latency}ms"
        out[name] = bar_chart(f"{workload}, {latency} ms added latency ({results['date']})", unit, bars)
    checkpoint = [row for row in results["rows"] if row["workload"] == "checkpoint" and "error" not in row]
    for key, what in (("seconds", "save"), ("load_seconds", "load")):
        bars = [(row["label"], row[key]) for row in checkpoint if row.get(key)]
        out[f"checkpoint-{what}"] = bar_chart(
            f"{what} a 512 MiB state dict, 25 MB/s per connection ({results['date']})", "seconds, lower is better", bars
        )
    shards = _load("shards.json")
    out["shards"] = bar_chart(
        f"tar shards, shuffled reading ({shards['date']})",
        "MB/s",
        [(r["setup"], r["mb_per_s"]) for r in shards["rows"]],
    )
    weights = _load("weights.json")
    out["weights"] = bar_chart(
        f"a 1 GiB safetensors file ({weights['date']})",
        "MB/s",
        [(r["label"], r["mb_per_s"]) for r in weights["rows"] if r["workload"] == "file" and r.get("mb_per_s")],
    )
    cache = _load("cache.json")
    out["cache"] = bar_chart(
        f"{cache['objects']:,} objects at {cache['latency_ms']} ms, by epoch",
        "objects/s",
        [(f"{r['setup']}, epoch {r['epoch']}", r["objects_per_s"]) for r in cache["rows"] if "epoch" in r],
    )
    return out


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data


def _rate(row: dict[str, Any], unit: str) -> float:
    amount = row["objects"] if unit == "names/s" else row["bytes"] / 1e6
    return float(amount / row["seconds"])


def bar_chart(title: str, unit: str, bars: list[tuple[str, float]]) -> str:
    """A horizontal bar chart as SVG: one bar per row, ours in the accent colour, each bar's value written."""
    label_width, bar_width, height, top = 470, 330, 24, 36
    top_value = max((value for _, value in bars), default=1.0) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_width + bar_width + 90}" '
        f'height="{top + height * len(bars) + 10}" font-family="sans-serif" font-size="12">',
        f'<text x="0" y="16" font-size="14" font-weight="bold">{escape(title)}</text>',
        f'<text x="{label_width}" y="30" fill="#555">{escape(unit)}</text>',
    ]
    for index, (label, value) in enumerate(bars):
        y = top + index * height
        width = max(1.0, bar_width * value / top_value)
        colour = "#3f51b5" if OURS.search(label) else "#9e9e9e"
        short = label if len(label) <= 70 else label[:67] + "..."
        parts += [
            f'<text x="{label_width - 6}" y="{y + 15}" text-anchor="end">{escape(short)}</text>',
            f'<rect x="{label_width}" y="{y + 3}" width="{width:.1f}" height="{height - 6}" fill="{colour}"/>',
            f'<text x="{label_width + width + 4:.1f}" y="{y + 15}">{value:,.1f}</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts)
