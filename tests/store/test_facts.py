"""Routing facts (a response id → its replica) in every Store: written, read back, gone after their lifetime."""

from __future__ import annotations

import asyncio

from app.store.base import Store
from app.store.facts import Facts


async def test_a_remembered_fact_reads_back_and_expires(any_store: Store) -> None:
    await any_store.remember("resp:r1", "fast\thttp://127.0.0.1:8001\tm", 0.3)
    assert await any_store.recall("resp:r1") == "fast\thttp://127.0.0.1:8001\tm"
    assert await any_store.recall("resp:unknown") is None
    await asyncio.sleep(0.45)
    assert await any_store.recall("resp:r1") is None


def test_in_process_facts_live_their_ttl_however_many_come_and_expired_ones_are_dropped() -> None:
    now = [0.0]
    facts = Facts(clock=lambda: now[0])
    for i in range(200_000):  # past the old 100k cap
        facts.put(f"k{i}", str(i), 10)
    assert facts.get("k0") == "0" and facts.get("k199999") == "199999"
    now[0] = 11
    facts.put("new", "n", 10)
    assert len(facts) == 1 and facts.get("k199999") is None and facts.get("new") == "n"
