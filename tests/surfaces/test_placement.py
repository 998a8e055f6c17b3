"""Where moved spans are written into a body (app/surfaces/placement.py)."""

from __future__ import annotations

from app.surfaces.placement import at_head

PARTS = [{"type": "text", "text": t} for t in ("skills", "env", "tools", "words")]


def test_the_head_block_opens_the_first_user_turn_by_default() -> None:
    body = {"messages": [{"role": "user", "content": "words"}]}
    out = at_head(body, ("messages", 0, "content"), "HEAD", "text")
    assert out["messages"][0]["content"] == "HEAD\n\nwords"
    out = at_head({"messages": [{"role": "user", "content": PARTS}]}, ("messages", 0, "content"), "HEAD", "text")
    assert [p["text"] for p in out["messages"][0]["content"]] == ["HEAD", "skills", "env", "tools", "words"]


def test_the_head_block_follows_the_shared_parts_and_the_others_keep_their_order() -> None:
    body = {"messages": [{"role": "user", "content": PARTS}]}
    out = at_head(body, ("messages", 0, "content"), "HEAD", "input_text", (0, 2))
    assert [p["text"] for p in out["messages"][0]["content"]] == ["skills", "tools", "HEAD", "env", "words"]
    assert out["messages"][0]["content"][2]["type"] == "input_text"
    assert [p["text"] for p in body["messages"][0]["content"]] == ["skills", "env", "tools", "words"]  # unchanged
