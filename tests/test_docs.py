"""The docs against the code: every relative link resolves; every module and HTTP path docs/architecture.md names
exists, and every path the gateway serves is named there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from app.api.app import create_app
from app.api.stored_responses import STORED_PATHS
from app.surfaces import SURFACES
from kvlab.configs import gateway_config
from tests.config_env import parse_with_env

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _markdown() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_relative_link_in_the_docs_resolves() -> None:
    broken = []
    for md in _markdown():
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            path = target.split("#", 1)[0]
            if path and not re.match(r"^[a-z]+:", target) and not (md.parent / path).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_module_the_reference_pages_name_exists() -> None:
    # Reference pages (README, docs/*.md) describe the code as it is; dated measurement pages keep their day's names.
    missing = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        missing += [f"{md.relative_to(ROOT)}: {p}" for p in re.findall(r"(app/[\w/]+\.py)", md.read_text())
                    if not (ROOT / p).exists()]
    assert missing == []


def test_every_module_architecture_md_names_exists() -> None:
    named = set(re.findall(r"`(app/[\w/.]*)`", ARCHITECTURE.read_text()))
    assert named, "architecture.md names no module"
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def _shape(path: str) -> str:
    # `{id}`, `{model_id:path}`, `…`: one placeholder shape, so the docs' and the routers' spellings compare.
    return re.sub(r"\{[^}]*\}|…", "{}", path)


def _documented() -> set[str]:
    text = ARCHITECTURE.read_text()
    return {_shape(p) for p in re.findall(r"`(?:(?:GET|POST|DELETE) )?(/[\w/{}:.…-]*)`", text)}


def _route_paths(routes: list[Any]) -> set[str]:
    paths: set[str] = set()
    for r in routes:
        if isinstance(getattr(r, "path", None), str):
            paths.add(r.path)
        elif getattr(r, "original_router", None) is not None:  # FastAPI >= 0.13x keeps an included router lazily
            paths |= _route_paths(r.original_router.routes)
    return paths


def _served() -> set[str]:
    cfg = parse_with_env(gateway_config({"main": {"role": "interactive", "replicas": ["http://127.0.0.1:9"]}}), {})
    app = create_app(cfg)
    raw = set(SURFACES) | set(STORED_PATHS)
    return {_shape(p) for p in raw | _route_paths(app.api.routes)}


def test_every_path_architecture_md_names_is_served() -> None:
    assert sorted(_documented() - _served()) == []


def test_every_served_path_is_in_architecture_md() -> None:
    assert sorted(_served() - _documented()) == []
