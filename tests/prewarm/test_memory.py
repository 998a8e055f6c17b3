"""The prefix memory: how the per-tenant tables count prefixes and stay bounded (what a prefix is: each surface's
warm_request, tests/api/surfaces)."""

from __future__ import annotations

from typing import Any

from app.api.surfaces import CHAT, COMPLETIONS
from app.prewarm.config import PrewarmConfig
from app.prewarm.memory import PrefixMemory


def chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_repeated_keys_count_and_the_body_is_read_only_for_a_new_key() -> None:
    mem = PrefixMemory(PrewarmConfig())
    mem.record("p", "t", 1, chat(("user", "first")), "salt-t", CHAT)
    mem.record("p", "t", 1, {"messages": None}, "salt-t", CHAT)  # same key: counted, never parsed
    (entry,) = mem.top("p")
    assert entry.hits == 2 and entry.salt == "salt-t" and entry.request.body["messages"][0]["content"] == "first"


def test_a_full_table_gives_the_least_seen_slot_to_a_new_prefix_and_keeps_the_favourite() -> None:
    mem = PrefixMemory(PrewarmConfig(per_tenant=2))
    for _ in range(5):
        mem.record("p", "t", 1, chat(("user", "favourite")), None, CHAT)
    mem.record("p", "t", 2, chat(("user", "once")), None, CHAT)
    mem.record("p", "t", 3, chat(("user", "newcomer")), None, CHAT)
    assert [e.key for e in mem.top("p")] == [1, 3] and mem.size() == 2
    assert mem.top("p")[1].hits == 2, "the newcomer inherits the evicted count (space saving)"


def test_the_least_recently_seen_tenant_is_forgotten_beyond_the_tenant_bound() -> None:
    mem = PrefixMemory(PrewarmConfig(tenants=2))
    mem.record("p", "a", 1, chat(("user", "a")), None, CHAT)
    mem.record("p", "b", 2, chat(("user", "b")), None, CHAT)
    mem.record("p", "a", 1, chat(("user", "a")), None, CHAT)
    mem.record("p", "c", 3, chat(("user", "c")), None, CHAT)
    assert sorted(e.key for e in mem.top("p")) == [1, 3]


def test_top_takes_every_tenants_favourite_before_anyones_second_and_only_the_pools_own() -> None:
    mem = PrefixMemory(PrewarmConfig())
    for key, hits in ((10, 9), (11, 8), (12, 7)):
        for _ in range(hits):
            mem.record("p", "big", key, chat(("user", str(key))), None, CHAT)
    mem.record("p", "small", 20, chat(("user", "20")), None, CHAT)
    mem.record("other", "big", 30, chat(("user", "30")), None, CHAT)
    assert [e.key for e in mem.top("p")] == [10, 20, 11, 12]
    assert [e.key for e in mem.top("other")] == [30]


def test_a_request_with_nothing_to_replay_takes_no_tenant_slot() -> None:
    mem = PrefixMemory(PrewarmConfig(tenants=1))
    mem.record("p", "chat", 1, chat(("user", "kept")), None, CHAT)
    mem.record("p", "completions", 2, {"model": "m", "prompt": "a completion"}, None, COMPLETIONS)
    assert [e.key for e in mem.top("p")] == [1], "the completions tenant did not push the chat tenant out"
