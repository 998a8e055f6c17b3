"""Both stores keep per-tenant sets of volatile template fingerprints alike: add, forget, cap, expiry."""

from __future__ import annotations

import time

import redis

from app.store.base import VOLATILE_KEEP_S, VOLATILE_PER_TENANT, Store
from app.store.memory import MemoryStore
from tests.store.redis_fixtures import loose_redis_store

BIG = 2**64 - 1  # fingerprints are unsigned 64-bit


async def test_added_fingerprints_come_back_per_tenant(any_store: Store) -> None:
    await any_store.add_volatile("a", [1, 2, BIG])
    await any_store.add_volatile("b", [3])
    await any_store.add_volatile("a", [2, 4])
    sets = await any_store.volatile_fingerprints(["a", "b", "nobody"])
    assert sets == {"a": {1, 2, 4, BIG}, "b": {3}, "nobody": set()}


async def test_forget_removes_and_wins_over_nothing_else(any_store: Store) -> None:
    await any_store.add_volatile("a", [1, 2, 3])
    await any_store.add_volatile("a", [4], forget=[2, 99])
    assert (await any_store.volatile_fingerprints(["a"]))["a"] == {1, 3, 4}


async def test_an_empty_update_and_an_empty_read_are_no_ops(any_store: Store) -> None:
    await any_store.add_volatile("a", [])
    assert await any_store.volatile_fingerprints([]) == {}
    assert await any_store.volatile_fingerprints(["a"]) == {"a": set()}


async def test_a_tenant_set_is_capped_oldest_added_first(any_store: Store) -> None:
    await any_store.add_volatile("a", [0])  # the oldest: goes first
    starts = range(1, VOLATILE_PER_TENANT + 200, 250)
    for start in starts:
        await any_store.add_volatile("a", list(range(start, start + 250)))
    held = (await any_store.volatile_fingerprints(["a"]))["a"]
    assert len(held) == VOLATILE_PER_TENANT
    assert 0 not in held and set(range(starts[-1], starts[-1] + 250)) <= held


async def test_memory_store_expires_a_fingerprint_keep_seconds_after_its_last_add() -> None:
    now = [1_000_000_000_000]
    store = MemoryStore(clock_us=lambda: now[0])
    await store.add_volatile("a", [1, 2])
    now[0] += (VOLATILE_KEEP_S - 10) * 1_000_000
    await store.add_volatile("a", [2])  # refreshed
    now[0] += 20 * 1_000_000
    assert (await store.volatile_fingerprints(["a"]))["a"] == {2}
    now[0] += VOLATILE_KEEP_S * 1_000_000
    assert (await store.volatile_fingerprints(["a"]))["a"] == set()
    assert store.entry_counts()["volatile"] == 0


async def test_redis_set_is_one_sorted_set_per_tenant_scored_in_server_microseconds_with_a_ttl(
    redis_url: str, key_prefix: str
) -> None:
    store = loose_redis_store(redis_url, key_prefix)
    try:
        await store.add_volatile("acme", [7, 8])
    finally:
        await store.aclose()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        key = f"{key_prefix}{{acme}}:volatile"
        assert client.type(key) == "zset"
        assert sorted(client.zrange(key, 0, -1)) == ["7", "8"]
        assert 0 < client.pttl(key) <= VOLATILE_KEEP_S * 1000
        score = client.zscore(key, "7")
        assert score is not None and score % 1 == 0 and abs(score - time.time() * 1e6) < 60e6
    finally:
        client.close()


async def test_redis_read_skips_members_that_are_not_fingerprints(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.zadd(f"{key_prefix}{{acme}}:volatile", {"12": 1, "not-a-number": 2})
    client.close()
    store = loose_redis_store(redis_url, key_prefix)
    try:
        assert await store.volatile_fingerprints(["acme"]) == {"acme": {12}}
    finally:
        await store.aclose()
