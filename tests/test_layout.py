"""The layers hold: imports only go down (front ends -> engines -> ops -> transport -> config/errors),
and no module borrows another's private name."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torchdata_gcs"
LAYERS = {"config": 0, "errors": 0, "_transport": 1, "_ops": 2, "_engines": 3, "cli": 5}
FRONT_ENDS = 4  # datapipes, checkpoint, dcp, lightning, testing, the package itself


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], FRONT_ENDS) if len(parts) > 1 else FRONT_ENDS


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(absolute module, imported names)`` of every package-internal import in ``path``."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            found.append((target, [alias.name for alias in node.names]))
    return found


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_imports_only_go_down() -> None:
    upward = []
    for path in modules():
        own = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for target, _ in imports(path):
            if layer(target) > layer(own):
                upward.append(f"{own} imports {target}")
    assert upward == []


def test_no_module_borrows_a_private_name() -> None:
    borrowed = [
        f"{path.relative_to(PACKAGE.parent)}: {target}.{name}"
        for path in modules()
        for target, names in imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert borrowed == []


def test_the_layers_are_folders() -> None:
    for folder in ("_transport", "_ops", "_engines", "cli", "datapipes", "testing"):
        assert (PACKAGE / folder / "__init__.py").is_file(), folder
    flat_private = sorted(path.name for path in PACKAGE.glob("_*.py") if path.name != "__init__.py")
    assert flat_private == []


PUBLIC_MODULES = [
    "torchdata_gcs",
    "torchdata_gcs.config",
    "torchdata_gcs.errors",
    "torchdata_gcs.checkpoint",
    "torchdata_gcs.safetensors",
    "torchdata_gcs.dcp",
    "torchdata_gcs.lightning",
    "torchdata_gcs.datasets",
    "torchdata_gcs.nodes",
    "torchdata_gcs.fsspec",
    "torchdata_gcs.stalls",
    "torchdata_gcs.datapipes",
    "torchdata_gcs.testing",
    "torchdata_gcs.cli",
    "torchdata_gcs_fsspec_handler",
]


OPTIONAL = {"torchdata_gcs.nodes": "torchdata >= 0.10", "torchdata_gcs.lightning": "lightning"}
"""Modules that need a dependency one of the two test environments lacks, and what they need."""


def _imported(name: str) -> ModuleType | None:
    """The module, or ``None`` where it needs an optional dependency this environment lacks."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if name not in OPTIONAL:
            raise
        return None


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_each_public_module_exports_exactly_what_it_defines_sorted(name: str) -> None:
    module = _imported(name)
    if module is None:
        pytest.skip(f"{name} needs {OPTIONAL[name]}, tested in the other environment")
    exported = list(module.__all__)
    assert exported == sorted(exported)
    assert [symbol for symbol in exported if not hasattr(module, symbol)] == []
    defined = [
        symbol
        for symbol, value in vars(module).items()
        if not symbol.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == name
    ]
    assert [symbol for symbol in defined if symbol not in exported] == []


def test_tests_use_only_what_each_module_exports() -> None:
    """A test reaches a layer through its exported names, as another layer would."""
    borrowed = []
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchdata_gcs")):
                continue
            module = _imported(node.module)
            if module is None:
                continue  # checked in the environment that has its dependency
            exported = getattr(module, "__all__", None)
            for alias in node.names:
                if inspect.ismodule(getattr(module, alias.name, None)):
                    continue  # a module of the package
                if alias.name.startswith("_") or (exported is not None and alias.name not in exported):
                    borrowed.append(f"{path.name}: {node.module}.{alias.name}")
    assert borrowed == []


MAX_CHAIN = 14
MAX_ENGINE_FLOORS = 3


def import_graph() -> dict[str, set[str]]:
    """Each module's package-internal imports, function-level ones included: ``from .x import y`` links
    to the module ``x.y`` where there is one, else to ``x`` (a package links to its ``__init__``)."""
    paths = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p for p in modules()
    }
    graph = {}
    for name, path in paths.items():
        linked = {f"{t}.{n}" if f"{t}.{n}" in paths else t for t, names in imports(path) for n in names}
        absolute = ast.walk(ast.parse(path.read_text()))
        linked |= {a.name for node in absolute if isinstance(node, ast.Import) for a in node.names}
        graph[name] = {target for target in linked if target in paths and target != name}
    return graph


def longest_chain(graph: dict[str, set[str]], within: str = "torchdata_gcs") -> list[str]:
    """The longest path of imports among the modules whose names start with ``within``."""
    found: dict[str, list[str]] = {}

    def chain(module: str) -> list[str]:
        if module not in found:
            found[module] = [module]  # a circle stops here
            below = [chain(target) for target in graph[module] if target.startswith(within)]
            found[module] = [module, *max(below, key=len, default=[])]
        return found[module]

    return max((chain(module) for module in graph if module.startswith(within)), key=len)


def test_the_longest_import_chain_is_short() -> None:
    chain = longest_chain(import_graph())
    assert len(chain) <= MAX_CHAIN, " > ".join(chain)


def test_engines_are_at_most_three_floors_deep() -> None:
    chain = longest_chain(import_graph(), within="torchdata_gcs._engines.")
    assert len(chain) <= MAX_ENGINE_FLOORS, " > ".join(chain)


DOCSTRING_LINES = 12
LONGER_DOCSTRINGS = {"errors.py": 26}  # the exception tree, drawn whole where a reader of the errors looks
FIGURE = re.compile(r"\d+(\.\d+)? ?(s|ms|µs|MB/s|GB/s|KiB|MiB|GiB)\b|\d+(\.\d+)?x\b")


def test_each_module_opens_with_a_short_docstring_without_figures() -> None:
    """What a module does and why fits in a few lines; reasons go beside the code, measured figures to
    benchmarks/README.md, where they keep their provenance."""
    found = []
    for path in modules():
        name = str(path.relative_to(PACKAGE))
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        if not docstring:
            found.append(f"{name}: no docstring")
            continue
        lines = len(docstring.splitlines())
        if lines > LONGER_DOCSTRINGS.get(name, DOCSTRING_LINES):
            found.append(f"{name}: {lines} lines")
        found += [f"{name}: {match.group(0)!r}" for match in FIGURE.finditer(docstring)]
    assert found == []


SCRIPT_DOCSTRING_LINES = 16  # a script's docstring is also its --help, usage lines included


def test_each_script_opens_with_a_short_docstring() -> None:
    """The benchmarks and examples say what they run and how in a few lines; their results and the longer
    account live in benchmarks/README.md and README.md. Workload sizes are settings there, not figures."""
    found = []
    for path in sorted([*(PACKAGE.parent / "benchmarks").glob("*.py"), *(PACKAGE.parent / "examples").glob("*.py")]):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        lines = len(docstring.splitlines()) if docstring else 0
        if not 0 < lines <= SCRIPT_DOCSTRING_LINES:
            found.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines")
    assert found == []


def _outside(*allowed: str) -> list[Path]:
    """The package's modules but those under the folders or files ``allowed`` (relative to the package)."""
    return [path for path in modules() if not path.relative_to(PACKAGE).as_posix().startswith(allowed)]


def _uses(path: Path, names: set[str]) -> list[str]:
    """Where ``path`` imports a module or a name in ``names``, or reads an attribute in ``names``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] in names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            found += [f"{module}.{alias.name}" for alias in node.names if {module.split(".")[0], alias.name} & names]
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return [f"{path.relative_to(PACKAGE.parent)}: {use}" for use in found]


def test_only_the_transport_speaks_aiohttp() -> None:
    """Ops, engines and front ends see the transport seam's responses only (the testing kit is an HTTP
    server of its own, and may use aiohttp's)."""
    speaking = [use for path in _outside("_transport/", "testing/") for use in _uses(path, {"aiohttp"})]
    assert speaking == []


def test_only_the_transport_reads_a_body_stream() -> None:
    stream_reads = {"content", "readany", "iter_any"}
    reading = [use for path in _outside("_transport/", "testing/") for use in _uses(path, stream_reads)]
    assert reading == []


def test_one_way_onto_the_io_loop() -> None:
    """Every thread waits for the loop through ``_transport/loop.py``, which cancels on Ctrl-C and timeout."""
    raw = [use for path in _outside("_transport/loop.py") for use in _uses(path, {"run_coroutine_threadsafe"})]
    assert raw == []


FRONT_END_MODULES = {"datapipes", "datasets", "nodes", "fsspec", "checkpoint", "dcp", "lightning", "safetensors"}
"""What the front ends are (the package itself, ``cli`` and ``testing`` sit above them and may use them)."""


def front_end(module: str) -> str | None:
    """The front end ``module`` (absolute) belongs to, if any."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FRONT_END_MODULES else None


def test_no_front_end_imports_another() -> None:
    crossing = []
    for path in modules():
        own = front_end(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        if own is None:
            continue
        for target, names in imports(path):
            targets = [target, *(f"{target}.{name}" for name in names)]  # `from . import checkpoint` names a module
            others = {front_end(t) for t in targets} - {None, own}
            crossing += [f"{path.relative_to(PACKAGE.parent)} imports {other}" for other in sorted(others)]
    assert crossing == []


HANDLE_MODULE = PACKAGE / "_ops" / "client.py"


def test_below_the_front_ends_only_the_handle_builds_clients_and_contexts() -> None:
    """A front-end object builds one handle (``Client``) and hands it down; engines, ops and transport never
    build a ``Client`` or a request context (``new_context``) of their own, except the handle's own module."""
    built = []
    for path in modules():
        own = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if layer(own) >= FRONT_ENDS or path == HANDLE_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if called in ("Client", "new_context"):
                    built.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {called}(...)")
    assert built == []


WIRE_LAYERS = ("torchdata_gcs/_transport/", "torchdata_gcs/_ops/", "torchdata_gcs/testing/")
SENDING = {"read_media", "send", "request", "json_answer"}  # a session's or transport's ways to send
WIRE_TYPES = {"Response", "Headers", "Transport"}


def test_only_the_wire_and_ops_touch_a_response_or_send_a_request() -> None:
    """Engines and front ends hold a request context and call ``_ops``; what one request does and what its
    answer means is written once, there (the test front, a server, speaks HTTP of its own)."""
    found = []
    for path in modules():
        name = str(path.relative_to(PACKAGE.parent))
        if name.startswith(WIRE_LAYERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith(("transport", "session")):
                found += [f"{name}: imports {alias.name}" for alias in node.names if alias.name in WIRE_TYPES]
            elif isinstance(node, ast.Import | ast.ImportFrom):
                modules_named = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
                found += [f"{name}: imports {m}" for m in modules_named if m and m.split(".")[0] == "aiohttp"]
            elif isinstance(node, ast.Attribute) and node.attr in SENDING and isinstance(node.value, ast.Attribute):
                if node.value.attr in ("session", "transport", "media"):
                    found.append(f"{name}: calls {node.value.attr}.{node.attr}")
    assert found == []


DATAPIPE_MODULES = ("torch.utils.data.datapipes", "torchdata.datapipes", "torchdata_gcs.datapipes")


def absolute_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports made absolute."""
    tree = ast.walk(ast.parse(path.read_text()))
    found = {target for target, _ in imports(path)}
    for node in tree:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_datapipe_type_outside_the_datapipes() -> None:
    """The engines, and the front ends that are not DataPipes, hand out plain streams and know nothing of
    DataPipes (the package registers them, the command line runs them)."""
    found = []
    for path in modules():
        name = str(path.relative_to(PACKAGE.parent))
        if name.startswith(("torchdata_gcs/datapipes/", "torchdata_gcs/cli/")) or name == "torchdata_gcs/__init__.py":
            continue
        found += [f"{name} imports {t}" for t in absolute_imports(path) if t.startswith(DATAPIPE_MODULES)]
    assert sorted(found) == []


IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def test_every_type_ignore_names_its_error_and_says_why() -> None:
    """mypy checks the package (pyproject.toml): what it is told to ignore names the error ignored and carries
    the reason beside it, ``# type: ignore[code]  # why``."""
    found = []
    for path in modules():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = IGNORE.search(line)
            if match and not (match["codes"] and re.match(r"\s+#\s*\S", match["rest"])):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}")
    assert found == []


MAX_MODULE_LINES = 700


def test_no_room_is_too_big_to_live_in() -> None:
    """No module above ~700 lines: a class with dozens of methods is a package."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}: {lines} lines"
        for path in modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert found == []


def test_the_endpoint_is_resolved_in_one_place() -> None:
    """Where requests go is decided once, when a client is made (``Destination.of``): nothing else calls
    ``resolve_endpoint``, and no front end builds default client settings of its own."""
    found = []
    for path in modules():
        name = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called == "resolve_endpoint" and name != "torchdata_gcs/_transport/session.py":
                found.append(f"{name}:{node.lineno} resolves the endpoint")
            if called == "ClientConfig" and not (node.args or node.keywords) and name != "torchdata_gcs/_ops/client.py":
                found.append(f"{name}:{node.lineno} makes default client settings")
    assert found == []
