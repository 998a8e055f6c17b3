"""The prefix memory: what a chat request's stable prefix is, and how the per-tenant tables stay bounded."""

from __future__ import annotations

from typing import Any

from app.prewarm.config import PrewarmConfig
from app.prewarm.memory import PrefixMemory, stable_prefix

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_stable_prefix_is_the_leading_system_messages_tools_and_first_user_message() -> None:
    body = chat(("system", "rules"), ("developer", "more rules"), ("user", "task 1"), ("assistant", "done"),
                ("user", "task 2"), tools=TOOLS, tool_choice="none", temperature=0.2, stream=True)  # fmt: skip
    prefix = stable_prefix(body, 10_000)
    assert prefix is not None
    assert [m["content"] for m in prefix["messages"]] == ["rules", "more rules", "task 1"]
    assert prefix["tools"] == TOOLS and prefix["tool_choice"] == "none"
    assert "temperature" not in prefix and "stream" not in prefix and "model" not in prefix


def test_a_prompt_without_a_leading_user_message_has_no_stable_prefix() -> None:
    assert stable_prefix(chat(("system", "rules")), 10_000) is None
    assert stable_prefix(chat(("assistant", "hi"), ("user", "x")), 10_000) is None
    assert stable_prefix({"messages": "not a list"}, 10_000) is None


def test_a_prefix_longer_than_max_prefix_chars_is_not_kept() -> None:
    body = chat(("system", "x" * 900), ("user", "y" * 50), tools=TOOLS)
    assert stable_prefix(body, 2_000) is not None
    assert stable_prefix(body, 960) is None, "tools count toward the size"


def test_repeated_keys_count_and_the_body_is_read_only_for_a_new_key() -> None:
    mem = PrefixMemory(PrewarmConfig())
    mem.record("p", "t", 1, chat(("user", "first")), "salt-t")
    mem.record("p", "t", 1, {"messages": None}, "salt-t")  # same key: counted, never parsed
    (entry,) = mem.top("p")
    assert entry.hits == 2 and entry.salt == "salt-t" and entry.body["messages"][0]["content"] == "first"


def test_a_full_table_gives_the_least_seen_slot_to_a_new_prefix_and_keeps_the_favourite() -> None:
    mem = PrefixMemory(PrewarmConfig(per_tenant=2))
    for _ in range(5):
        mem.record("p", "t", 1, chat(("user", "favourite")), None)
    mem.record("p", "t", 2, chat(("user", "once")), None)
    mem.record("p", "t", 3, chat(("user", "newcomer")), None)
    assert [e.key for e in mem.top("p")] == [1, 3] and mem.size() == 2
    assert mem.top("p")[1].hits == 2, "the newcomer inherits the evicted count (space saving)"


def test_the_least_recently_seen_tenant_is_forgotten_beyond_the_tenant_bound() -> None:
    mem = PrefixMemory(PrewarmConfig(tenants=2))
    mem.record("p", "a", 1, chat(("user", "a")), None)
    mem.record("p", "b", 2, chat(("user", "b")), None)
    mem.record("p", "a", 1, chat(("user", "a")), None)
    mem.record("p", "c", 3, chat(("user", "c")), None)
    assert sorted(e.key for e in mem.top("p")) == [1, 3]


def test_top_takes_every_tenants_favourite_before_anyones_second_and_only_the_pools_own() -> None:
    mem = PrefixMemory(PrewarmConfig())
    for key, hits in ((10, 9), (11, 8), (12, 7)):
        for _ in range(hits):
            mem.record("p", "big", key, chat(("user", str(key))), None)
    mem.record("p", "small", 20, chat(("user", "20")), None)
    mem.record("other", "big", 30, chat(("user", "30")), None)
    assert [e.key for e in mem.top("p")] == [10, 20, 11, 12]
    assert [e.key for e in mem.top("other")] == [30]
