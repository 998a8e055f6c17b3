"""System turns right after the first user message go before it (Claude Code's list for non-Claude model names)."""

from __future__ import annotations

from typing import Any

from app.normalize import VolatilityMemory, normalize
from app.surfaces import MESSAGES
from tests.normalize.helpers import NOW, STATIC_SYSTEM, model, tenant


def body(task: str, skills: str, *later: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "system": STATIC_SYSTEM,
            "messages": [{"role": "user", "content": task}, {"role": "system", "content": skills}, *later]}


def run(b: dict[str, Any], memory: VolatilityMemory, sid: str) -> dict[str, Any]:
    out, _ = normalize(b, surface=MESSAGES, tenant=tenant("on"), model=model(), memory=memory, opt_out=False, now=NOW,
                       headers={"x-claude-code-session-id": sid})
    return out


def roles(b: dict[str, Any]) -> list[str]:
    return [m["role"] for m in b["messages"]]


def test_a_static_system_turn_after_the_first_user_message_goes_before_it_on_every_turn() -> None:
    memory = VolatilityMemory()
    first = run(body("task A", "skills"), memory, "A")
    assert roles(first) == ["system", "user"] and first["messages"][0]["content"] == "skills"
    later = run(body("task A", "skills", {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}),
                memory, "A")
    assert later["messages"][:2] == first["messages"]  # the same start: the session stays append-only
    assert roles(run(body("task B", "skills"), memory, "B")) == ["system", "user"]


def test_a_system_turn_that_varies_between_sessions_stays_where_the_client_put_it() -> None:
    memory = VolatilityMemory()
    run(body("task A", "skills for A"), memory, "A")
    assert roles(run(body("task B", "skills for B"), memory, "B")) == ["user", "system"]
    assert roles(run(body("task A", "skills for A"), memory, "A")) == ["system", "user"]  # A keeps its layout
