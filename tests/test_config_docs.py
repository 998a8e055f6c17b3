"""docs/config.md is generated from the schema and up to date; the README shows a newcomer's keys only."""

from __future__ import annotations

import re
from pathlib import Path

from app.config.docs import DOC, REGENERATE, keys, render
from app.config.models import GatewayConfig

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 120
README_MAX_KEYS = 16


def test_every_key_has_a_description() -> None:
    missing = [k.path for k in keys(GatewayConfig) if not k.description.strip()]
    assert missing == [], f"give these keys a Field(description=…): {missing}"


def test_every_leaf_key_is_in_docs_config_md() -> None:
    text = DOC.read_text()
    missing = [k.path for k in keys(GatewayConfig) if k.leaf and f"| `{k.path}` |" not in text]
    assert missing == [], f"docs/config.md lacks {missing}; regenerate it: {REGENERATE}"


def test_docs_config_md_is_what_the_schema_says() -> None:
    assert DOC.read_text() == render(), f"docs/config.md is out of date with the schema; regenerate it: {REGENERATE}"


def _readme_keys() -> list[str]:
    section = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_.<>\[\]]+)` \|", section, flags=re.MULTILINE)


def test_readme_is_short_and_links_the_reference() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "(docs/config.md)" in text


def test_readme_shows_a_newcomers_keys_that_exist() -> None:
    documented = {k.path for k in keys(GatewayConfig)}
    shown = _readme_keys()
    assert 0 < len(shown) <= README_MAX_KEYS
    assert [k for k in shown if k not in documented] == []
