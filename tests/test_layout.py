"""The codebase's shape: no import cycle between app/ modules at import time, no module over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
MAX_LINES = 400


def _module(path: Path) -> str:
    parts = list(path.relative_to(APP.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_time_deps(path: Path, known: set[str]) -> set[str]:
    """app.* modules imported at module level (not under TYPE_CHECKING, not inside functions)."""
    deps: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in [node] if isinstance(node, ast.Import | ast.ImportFrom) else []:
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                # `from pkg import submodule` depends on the submodule; any other name, on the package.
                subs = [f"{sub.module}.{a.name}" for a in sub.names]
                names = [n for n in subs if n in known]
                if len(names) < len(subs):
                    names.append(sub.module)
            elif isinstance(sub, ast.Import):
                names = [a.name for a in sub.names]
            else:
                continue
            deps.update(n for n in names if n in known)
    return deps


def test_no_module_in_app_is_longer_than_400_lines() -> None:
    long = {str(p.relative_to(APP.parent)): n for p in APP.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert long == {}


def test_no_import_cycle_between_app_modules() -> None:
    paths = {_module(p): p for p in APP.rglob("*.py")}
    known = set(paths)
    graph = {m: _import_time_deps(p, known) - {m} for m, p in paths.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d):], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []
