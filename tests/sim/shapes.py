"""Compare a sim body with a captured vLLM one by shape: the same keys in the same order, recursively."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def shape(value: Any) -> Any:
    """Keys (in order) of every object, types of leaves; lists by their first element."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def real(name: str) -> Any:
    """A captured real-vLLM body (JSON)."""
    return json.loads((FIXTURES / "real" / name).read_text())


def real_events(name: str) -> list[tuple[str, dict[str, Any]]]:
    """A captured real-vLLM SSE stream as (event name, data) pairs."""
    return parse_events((FIXTURES / "real" / name).read_text())


def parse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """`event:`/`data:` SSE frames as (event name, data) pairs."""
    out = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out
