"""Canonical tool definitions: recursive key sort and a stable order, so the tool block is byte-identical."""

from __future__ import annotations

from typing import Any, Literal

import orjson

ToolOrder = Literal["name", "client"]


def _tool_name(tool: Any) -> str:
    if not isinstance(tool, dict):
        return ""
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return name if isinstance(name, str) else ""


def _sorted_keys(obj: Any) -> Any:
    # Fallback for values orjson refuses (ints beyond 64 bits); same result, slower.
    if isinstance(obj, dict):
        return {k: _sorted_keys(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted_keys(v) for v in obj]
    return obj


def _canonical(tool: Any) -> tuple[Any, bool]:
    """The tool with keys sorted at every depth, and whether that changed its serialization."""
    try:
        as_sent = orjson.dumps(tool)
        canonical = orjson.dumps(tool, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        sorted_tool = _sorted_keys(tool)
        return sorted_tool, list(_walk_keys(sorted_tool)) != list(_walk_keys(tool))
    if as_sent == canonical:
        return tool, False
    return orjson.loads(canonical), True


def _walk_keys(obj: Any) -> Any:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _walk_keys(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk_keys(v)


def canonicalize_tools(tools: list[Any], order: ToolOrder = "name") -> tuple[list[Any], int]:
    """Tools with sorted keys, sorted by function name (stable) unless `order` is "client".

    Returns the new list (the same list object when nothing changes) and how many tools changed
    (key order or position). Key sorting keeps the JSON's meaning; chat templates render tools with
    `tojson`, which keeps the client's key order, so without this the bytes vary per client library.
    """
    out: list[Any] = []
    changed: set[int] = set()
    for i, tool in enumerate(tools):
        canon, did = _canonical(tool)
        out.append(canon)
        if did:
            changed.add(i)
    if order == "name":
        indexed = sorted(range(len(out)), key=lambda i: _tool_name(out[i]))
        if indexed != list(range(len(out))):
            changed.update(i for pos, i in enumerate(indexed) if pos != i)
            out = [out[i] for i in indexed]
    if not changed:
        return tools, 0
    return out, len(changed)
