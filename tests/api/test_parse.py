"""The depth bound on request bodies (app/api/parse.py): walked without recursion at any depth, so no walker after
it (token estimate, prompt view, tool canonicalization, chat rendering) meets a depth near Python's limit."""

from __future__ import annotations

import sys
from typing import Any

import orjson

from app.api.parse import MAX_DEPTH, deeper_than


def nested(depth: int) -> Any:
    out: Any = "x"
    for i in range(depth - 1):
        out = [out] if i % 2 else {"k": out}
    return [out]


def test_a_body_at_the_bound_passes_and_one_level_more_is_refused() -> None:
    at, over = nested(MAX_DEPTH), nested(MAX_DEPTH + 1)
    assert not deeper_than(at, orjson.dumps(at))
    assert deeper_than(over, orjson.dumps(over))


def test_any_depth_is_decided_without_recursion() -> None:
    depth = 50 * sys.getrecursionlimit()  # orjson parses only 1024 levels; the walker has no such limit of its own
    body = nested(depth)
    assert deeper_than(body, b"[" * depth)


def test_brackets_inside_strings_do_not_make_a_flat_body_deep() -> None:
    body = {"messages": [{"role": "user", "content": "[" * 10_000 + "{" * 10_000}]}
    assert not deeper_than(body, orjson.dumps(body))
