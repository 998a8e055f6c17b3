"""The prefix memory: how the per-tenant tables count prefixes and stay bounded (what a prefix is: each surface's
warm_request, tests/api/surfaces)."""

from __future__ import annotations

from typing import Any

from app.config.prewarm import PrewarmConfig
from app.prewarm.memory import PrefixMemory
from app.surfaces import CHAT, COMPLETIONS, RESPONSES


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


def test_each_tracked_key_keeps_its_latest_history_beyond_its_prefix() -> None:
    mem = PrefixMemory(PrewarmConfig())
    first = chat(("system", "rules"), ("user", "task"))
    mem.record("p", "t", 1, first, None, CHAT)
    (entry,) = mem.top("p")
    assert entry.history is None and entry.replay() is entry.request, "a first turn is its prefix"
    mem.record("p", "t", 1, chat(("system", "rules"), ("user", "task"), ("assistant", "a1"), ("user", "t2")), None,
               CHAT)  # fmt: skip
    later = chat(("system", "rules"), ("user", "task"), ("assistant", "a1"), ("user", "t2"), ("assistant", "a2"),
                 ("user", "t3"))  # fmt: skip
    mem.record("p", "t", 1, later, None, CHAT)
    assert entry.history is not None and entry.history.body is later, "kept by reference, not copied"
    replay = entry.replay()
    assert replay is not entry.request and [m["content"] for m in replay.body["messages"]][-1] == "t3"
    assert replay.body["max_tokens"] == 1 and entry.hits == 3
    assert mem.histories is not None and mem.histories.chars == entry.history.chars


def test_a_key_that_leaves_the_memory_takes_its_history_along() -> None:
    mem = PrefixMemory(PrewarmConfig(per_tenant=1, tenants=1))
    mem.record("p", "a", 1, chat(("user", "a"), ("assistant", "x"), ("user", "more")), None, CHAT)
    assert mem.histories is not None and len(mem.histories) == 1
    mem.record("p", "a", 2, chat(("user", "b"), ("assistant", "x"), ("user", "more")), None, CHAT)
    assert len(mem.histories) == 1, "key 1's slot went to key 2, and its history with it"
    mem.record("p", "b", 3, chat(("user", "c"), ("assistant", "x"), ("user", "more")), None, CHAT)
    assert [e.key for e in mem.top("p")] == [3] and len(mem.histories) == 1
    held = mem.top("p")[0].history
    assert held is not None and mem.histories.chars == held.chars


def test_histories_off_keep_only_prefixes() -> None:
    mem = PrefixMemory(PrewarmConfig(history_budget_chars=0))
    mem.record("p", "t", 1, chat(("user", "a"), ("assistant", "x"), ("user", "more")), None, CHAT)
    assert mem.histories is None and mem.top("p")[0].history is None


def test_a_kept_request_its_surface_replays_no_history_of_replays_the_prefix() -> None:
    mem = PrefixMemory(PrewarmConfig())
    first = {"model": "m", "input": [{"role": "user", "content": "task " * 20}]}
    mem.record("p", "t", 1, first, None, RESPONSES)
    turns = [{"role": "user", "content": "task " * 20}, {"role": "user", "content": "more " * 40}]
    stored = {"model": "m", "previous_response_id": "resp_1", "input": turns}  # its history is on the storing replica
    mem.record("p", "t", 1, stored, None, RESPONSES)
    (entry,) = mem.top("p")
    assert entry.history is not None, "kept by size, unread until a pre-warm"
    assert entry.replay() is entry.request
