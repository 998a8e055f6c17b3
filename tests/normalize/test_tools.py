"""Tool canonicalization: key order and tool order no longer reach the tokens."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson

from app.normalize import VolatilityMemory, canonicalize_tools
from tests.normalize.helpers import STATIC_SYSTEM, chat_body, run


def tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Look up {name}.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
                "required": ["order_id"],
            },
        },
    }


def shuffled(obj: Any, rng: random.Random) -> Any:
    if isinstance(obj, dict):
        keys = list(obj)
        rng.shuffle(keys)
        return {k: shuffled(obj[k], rng) for k in keys}
    if isinstance(obj, list):
        return [shuffled(v, rng) for v in obj]
    return obj


def test_shuffled_key_order_gives_byte_identical_json() -> None:
    tools = [tool(n) for n in ("search", "refund", "track")]
    outputs = set()
    for seed in range(6):
        rng = random.Random(seed)
        variant = [shuffled(t, rng) for t in tools]
        rng.shuffle(variant)
        out, _ = canonicalize_tools(variant)
        outputs.add(json.dumps(out))
        assert out == sorted(tools, key=lambda t: t["function"]["name"])  # same meaning
    assert len(outputs) == 1


def test_tools_are_ordered_by_name_unless_client_order_is_kept() -> None:
    tools = [tool("b"), tool("a")]
    by_name, changed = canonicalize_tools(tools)
    assert [t["function"]["name"] for t in by_name] == ["a", "b"] and changed == 2
    kept, _ = canonicalize_tools(tools, order="client")
    assert [t["function"]["name"] for t in kept] == ["b", "a"]


def test_canonical_tools_are_returned_as_is() -> None:
    tools = [orjson.loads(orjson.dumps(tool(n), option=orjson.OPT_SORT_KEYS)) for n in ("a", "b")]
    out, changed = canonicalize_tools(tools)
    assert out is tools and changed == 0


def test_huge_integers_fall_back_to_the_python_sort() -> None:
    tools = [{"type": "function", "function": {"name": "x", "parameters": {"maximum": 2**70, "a": 1}}}]
    out, changed = canonicalize_tools(tools)
    assert changed == 1 and list(out[0]["function"]["parameters"]) == ["a", "maximum"]


def test_stage_canonicalizes_tools_without_touching_the_input() -> None:
    rng = random.Random(3)
    tools = [shuffled(tool(n), rng) for n in ("track", "refund")]
    snapshot = json.dumps(tools)
    body = chat_body(STATIC_SYSTEM, tools=tools)
    out, report = run(body, memory=VolatilityMemory())
    assert json.dumps(tools) == snapshot
    assert report.tools_canonicalized == 2 and "tools=2" in report.header()
    assert [t["function"]["name"] for t in out["tools"]] == ["refund", "track"]
