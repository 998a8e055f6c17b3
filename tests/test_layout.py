"""The codebase's shape: no import circle in app/ counting every edge (module level, TYPE_CHECKING and
function-level imports alike), none between its packages either, only the HTTP layer imports app.api, the path
module stays short with a bounded fan-out, and no module is over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
MAX_LINES = 400
PIPELINE_MAX_LINES = 200
PIPELINE_MAX_APP_IMPORTS = 15
# Who may import the HTTP package: itself, the CLI that serves it.
API_IMPORTERS = frozenset({"app.cli"})


def _module(path: Path) -> str:
    parts = list(path.relative_to(APP.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _paths() -> dict[str, Path]:
    return {_module(p): p for p in APP.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every app.* module `path` imports anywhere: at module level, under TYPE_CHECKING, inside functions."""
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import submodule` depends on the submodule; any other name, on the package.
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [n for n in subs if n in known]
            if len(names) < len(subs):
                names.append(node.module)
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        deps.update(n for n in names if n in known)
    return deps


def _graph() -> dict[str, set[str]]:
    paths = _paths()
    known = set(paths)
    return {m: _imports(p, known) - {m} for m, p in paths.items()}


def _package(module: str) -> str:
    """app.routing.state -> app.routing; a top-level module (app.pipeline) is its own node."""
    return ".".join(module.split(".")[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each package's modules taken as one node."""
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(_package(m), set()).update(_package(d) for d in deps if _package(d) != _package(m))
    return out


def test_no_module_in_app_is_longer_than_400_lines() -> None:
    long = {str(p.relative_to(APP.parent)): n for p in APP.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert long == {}


def test_no_import_circle_between_app_modules_counting_type_checking_and_function_level_imports() -> None:
    assert _cycles(_graph()) == []


def test_no_import_circle_between_app_packages() -> None:
    assert _cycles(_packages(_graph())) == []


def test_only_the_http_layer_and_the_cli_import_app_api() -> None:
    importers = {m for m, deps in _graph().items() if any(d.startswith("app.api") for d in deps)}
    assert {m for m in importers if not m.startswith("app.api")} <= API_IMPORTERS


def test_the_path_module_is_short_and_its_app_fan_out_bounded() -> None:
    path = APP / "pipeline.py"
    assert len(path.read_text().splitlines()) <= PIPELINE_MAX_LINES
    assert len(_graph()["app.pipeline"]) <= PIPELINE_MAX_APP_IMPORTS


def test_the_path_names_no_api_surface_and_no_optional_feature() -> None:
    # Features plug in at app/hooks.py's points; the path asks the Surface, never which one it is.
    imports = _graph()["app.pipeline"]
    features = ("app.admission", "app.prewarm", "app.kvcache", "app.surfaces", "app.routing.response")
    assert not [m for m in imports if m.startswith(features)]
