"""Reminders a client sends in its latest user turn only (app/normalize/transient.py): learned from the drop, moved
to the tail block; kept ones never move."""

from __future__ import annotations

from typing import Any

from app.normalize import VolatilityMemory, normalize
from app.normalize.transient import Transient, transient_parts
from app.surfaces import CHAT
from tests.normalize.helpers import NOW, model, tenant

DATE = ("<system-reminder>\nThe current date is: Thursday, December 3, 2026. Note: This is the authoritative "
        "current date.\n</system-reminder>")
SKILLS = "<system-reminder>\nThe following skills are available.\n</system-reminder>"


def user(*texts: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": t} for t in texts]}


def turn(messages: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """A Qwen Code-like session after `n` user turns: the date reminder in the latest user turn only."""
    out = list(messages)
    for i in range(1, n + 1):
        texts = (SKILLS, DATE, f"Turn {i}") if i == 1 else (DATE, f"Turn {i}")
        if i < n:  # history: the client dropped the reminder
            texts = tuple(t for t in texts if t is not DATE)
        out += [user(*texts), {"role": "assistant", "content": f"answer {i}"}]
    return out[:-1]


def test_a_reminder_dropped_from_history_moves_from_the_next_request_on() -> None:
    memory = Transient(64)
    assert transient_parts(turn([], 1), "text", memory) is None  # no evidence yet
    assert transient_parts(turn([], 2), "text", memory) == (2, (0,))  # turn 1 came back without it
    assert transient_parts(turn([], 1), "text", memory) == (0, (1,))  # a new session: from its first request


def test_a_reminder_kept_in_history_never_moves_and_keeping_wins() -> None:
    memory = Transient(64)
    kept = [user(DATE, "Turn 1"), {"role": "assistant", "content": "a"}, user("Turn 2")]
    transient_parts(kept[:1], "text", memory)
    assert transient_parts(kept, "text", memory) is None
    # Seen dropped afterwards (another client of the tenant): still kept, the body as sent is the safe side.
    transient_parts(turn([], 1), "text", memory)
    assert transient_parts(turn([], 2), "text", memory) is None


def test_the_same_reminder_on_another_day_is_the_same_reminder() -> None:
    memory = Transient(64)
    transient_parts(turn([], 1), "text", memory)
    transient_parts(turn([], 2), "text", memory)
    tomorrow = turn([], 1)
    tomorrow[0]["content"][1]["text"] = DATE.replace("Thursday, December 3", "Friday, December 4")
    assert transient_parts(tomorrow, "text", memory) == (0, (1,))


def test_normalize_moves_the_learned_reminder_to_the_tail_block_and_reports_it() -> None:
    memory = VolatilityMemory()
    kwargs: dict[str, Any] = {"surface": CHAT, "tenant": tenant("on"), "model": model(), "memory": memory,
                              "opt_out": False, "now": NOW}
    normalize({"model": "m", "messages": turn([], 1)}, **kwargs)
    out, report = normalize({"model": "m", "messages": turn([], 2)}, **kwargs)
    assert report.moved == {"reminder": 1}
    messages = out["messages"]
    assert [p["text"] for p in messages[2]["content"]] == ["Turn 2"]
    assert messages[-1]["role"] == "system" and DATE in messages[-1]["content"]
    again, _ = normalize(out, **kwargs)
    assert again == out  # normalized once


def test_a_tenant_without_the_reminder_rule_keeps_it_in_place() -> None:
    memory = VolatilityMemory()
    kwargs: dict[str, Any] = {"surface": CHAT, "tenant": tenant("on", frozenset({"section"})), "model": model(),
                              "memory": memory, "opt_out": False, "now": NOW}
    normalize({"model": "m", "messages": turn([], 1)}, **kwargs)
    out, report = normalize({"model": "m", "messages": turn([], 2)}, **kwargs)
    assert "reminder" not in report.moved and DATE in out["messages"][2]["content"][0]["text"]


def test_a_tagged_part_longer_than_a_reminder_is_content_and_never_moves() -> None:
    # A hostile or pasted 1 MB `<system-reminder>` part: not a reminder, so never searched for dates or moved.
    memory = Transient(64)
    huge = "<system-reminder>\n" + "x" * 1_000_000 + "\n</system-reminder>"
    one = [user(huge, "Turn 1")]
    two = [user("Turn 1"), {"role": "assistant", "content": "a"}, user(huge, "Turn 2")]
    assert transient_parts(one, "text", memory) is None
    assert transient_parts(two, "text", memory) is None
