"""Properties (hypothesis): idempotent, facts preserved, untouchable parts byte-identical, off = identity."""

from __future__ import annotations

import copy
import re
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from app.normalize import BLOCK_CLOSE, BLOCK_OPEN, VolatilityMemory
from tests.normalize.helpers import NOW, run

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_FENCE_RX = re.compile(r"^```[^\n]*\n.*?^```", re.MULTILINE | re.DOTALL)

seconds = st.integers(min_value=0, max_value=20 * 86400)
iso = seconds.map(lambda s: (NOW + timedelta(seconds=s)).isoformat())
uuids = st.integers(min_value=0, max_value=(1 << 128) - 1).map(lambda n: str(uuid.UUID(int=n)))
req_ids = st.text("abcdef0123456789", min_size=8, max_size=16).map(lambda s: "req_" + s + "7")
epochs = seconds.map(lambda s: str(int(NOW.timestamp()) + s))
labels = st.sampled_from(["Current time", "Request ID", "Session", "Timestamp", "Now", "Trace", "Date", "Note"])
volatile_line = st.one_of(
    st.tuples(labels, st.one_of(iso, uuids, req_ids, epochs)).map(lambda lv: f"{lv[0]}: {lv[1]}"),
    st.one_of(iso, uuids),
)
prose = st.text(
    st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters=" .,:-'"), max_size=60
).filter(lambda s: "request_metadata" not in s)
fenced = st.lists(st.one_of(volatile_line, prose), max_size=3).map(lambda ls: "```\n" + "\n".join(ls) + "\n```")
few_shot = st.sampled_from(["Date: 2024-01-05", "Example (2023-03-01): ship it", "the date above is fixed"])
line = st.one_of(volatile_line, volatile_line, prose, fenced, few_shot, st.just(""))
short_text = st.lists(line, max_size=10).map("\n".join)
# Long static padding takes texts past the small-text path, into the cached (shape) fast path.
PADDING = "\n".join(f"Rule {i}: answer politely and never share internal notes with anyone." for i in range(12))
text = st.one_of(
    short_text,
    st.tuples(short_text, short_text).map(lambda t: t[0] + "\n" + PADDING + "\n" + t[1]),
)


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 2))):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(text)})
    for turn in range(draw(st.integers(1, 3))):
        if turn == 0 and draw(st.booleans()):
            content: Any = [{"type": "text", "text": draw(text)}, {"type": "image_url", "image_url": {"url": "x"}}]
        else:
            content = draw(text)
        messages.append({"role": "user", "content": content})
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": draw(text)})
        if draw(st.booleans()):
            messages.append({"role": "tool", "tool_call_id": "c", "content": draw(text)})
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if draw(st.booleans()):
        body["tools"] = [
            {"type": "function", "function": {"name": n, "parameters": {"b": 1, "a": {"d": 2, "c": 3}}}}
            for n in draw(st.lists(st.sampled_from(["x", "y", "z"]), max_size=3))
        ]
    return body


placements = st.sampled_from(["system", "user"])


def texts(body: dict[str, Any]) -> list[str]:
    out = []
    for msg in body["messages"]:
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(p["text"] for p in content if p.get("type") == "text")
    return out


def fact_lines(body: dict[str, Any]) -> Counter[str]:
    """Every non-blank line of every message, the restated block's delimiters aside."""
    return Counter(
        ln for t in texts(body) for ln in t.split("\n") if ln.strip() and ln not in (BLOCK_OPEN, BLOCK_CLOSE)
    )


def warmed(body: dict[str, Any], placement: Literal["system", "user"]) -> VolatilityMemory:
    """A memory that has already seen the same request once (so every changing span is learned)."""
    memory = VolatilityMemory()
    run(copy.deepcopy(body), memory=memory, placement=placement)
    return memory


@SETTINGS
@given(chat_bodies(), placements)
def test_normalization_is_idempotent(body: dict[str, Any], placement: Literal["system", "user"]) -> None:
    memory = warmed(body, placement)
    once, _ = run(body, memory=memory, placement=placement)
    twice, report = run(once, memory=memory, placement=placement)
    assert twice == once
    assert report.moved_total == 0


@SETTINGS
@given(chat_bodies(), placements)
def test_every_moved_line_reappears_exactly_once(body: dict[str, Any], placement: Literal["system", "user"]) -> None:
    out, report = run(body, memory=warmed(body, placement), placement=placement)
    assert fact_lines(out) == fact_lines(body)
    blocks = [t for t in texts(out) if BLOCK_OPEN in t]
    assert len(blocks) == (1 if report.moved_total > report.to_head else 0)


@SETTINGS
@given(chat_bodies(), placements)
def test_assistant_tool_messages_and_code_blocks_are_byte_identical(
    body: dict[str, Any], placement: Literal["system", "user"]
) -> None:
    snapshot = copy.deepcopy(body)
    out, _ = run(body, memory=warmed(body, placement), placement=placement)
    assert body == snapshot  # the input is never mutated
    kept = [m for m in out["messages"] if not str(m.get("content", "")).startswith(BLOCK_OPEN)]
    assert len(kept) == len(body["messages"])
    for before, after in zip(body["messages"], kept, strict=True):
        if before["role"] in ("assistant", "tool"):
            assert after == before
    fences = Counter(f for t in texts(body) for f in _FENCE_RX.findall(t))
    assert Counter(f for t in texts(out) for f in _FENCE_RX.findall(t)) == fences


@SETTINGS
@given(chat_bodies())
def test_off_is_the_identity(body: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(body)
    memory = VolatilityMemory()
    out, report = run(body, memory=memory, mode="off")
    assert out is body and body == snapshot and report.mode == "off" and memory.size() == 0


@SETTINGS
@given(chat_bodies())
def test_observe_never_changes_the_request(body: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(body)
    out, report = run(body, memory=warmed(body, "system"), mode="observe")
    assert out is body and body == snapshot and not report.applied


@pytest.mark.slow
def test_generated_requests_do_exercise_moving() -> None:
    def moves(body: dict[str, Any]) -> bool:
        return run(body, memory=warmed(body, "system"))[1].moved_total >= 2

    example = find(chat_bodies(), moves, settings=settings(max_examples=500, deadline=None))
    assert moves(example)
