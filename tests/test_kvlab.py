"""The harness's place: kvlab/ (shared by tests/ and experiments/) imports neither app/ nor tests/, and experiments
import kvlab, never tests/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
    return names


def test_kvlab_imports_neither_app_nor_tests() -> None:
    bad = {str(p.relative_to(ROOT)): sorted(_imported(p) & {"app", "tests"}) for p in (ROOT / "kvlab").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_experiments_import_nothing_from_tests() -> None:
    bad = [str(p.relative_to(ROOT)) for p in (ROOT / "experiments").rglob("*.py") if "tests" in _imported(p)]
    assert bad == []
