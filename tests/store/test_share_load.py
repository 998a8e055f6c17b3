"""Both stores keep gateway processes' load payloads alike: publish, read everyone's, forget the silent."""

from __future__ import annotations

import asyncio

import redis

from app.store.base import Store
from app.store.memory import MemoryStore
from tests.store.redis_fixtures import loose_redis_store


async def test_every_process_reads_every_live_process_payload_its_own_included(any_store: Store) -> None:
    assert await any_store.share_load("a", '{"x": 3}', 5.0) == {"a": '{"x": 3}'}
    await any_store.share_load("b", "b's|payload", 5.0)  # opaque to the store, separators included
    assert await any_store.share_load("c", None, 5.0) == {"a": '{"x": 3}', "b": "b's|payload"}


async def test_a_read_publishes_nothing_and_a_new_round_replaces_a_process_payload(any_store: Store) -> None:
    await any_store.share_load("a", "round 1", 5.0)
    await any_store.share_load("a", "round 2", 5.0)
    assert await any_store.share_load("reader", None, 5.0) == {"a": "round 2"}


async def test_memory_store_forgets_a_process_once_its_ttl_passed() -> None:
    now = [1_000_000_000]
    store = MemoryStore(clock_us=lambda: now[0])
    await store.share_load("dead", "x", 1.0)
    now[0] += 900_000
    assert await store.share_load("live", "y", 1.0) == {"dead": "x", "live": "y"}
    now[0] += 200_000
    assert await store.share_load("live", None, 1.0) == {"live": "y"}


async def test_redis_forgets_a_silent_process_by_the_server_clock_and_the_hash_expires(
    redis_url: str, key_prefix: str
) -> None:
    store = loose_redis_store(redis_url, key_prefix)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.share_load("dead", "x", 0.05)
        await store.share_load("live", "y", 5.0)
        await asyncio.sleep(0.1)
        assert await store.share_load("live", "y", 0.05) == {"live": "y"}
        assert list(client.hgetall(f"{key_prefix}in_flight")) == ["live"]
        await asyncio.sleep(0.1)  # nobody published within the last ttl: the whole key is gone
        assert not client.exists(f"{key_prefix}in_flight")
    finally:
        client.close()
        await store.aclose()


async def test_redis_drops_an_entry_without_an_expiry_instead_of_failing_the_round(
    redis_url: str, key_prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.hset(f"{key_prefix}in_flight", mapping={"junk": "no expiry here"})
    store = loose_redis_store(redis_url, key_prefix)
    try:
        assert await store.share_load("a", "p", 5.0) == {"a": "p"}
        assert list(client.hgetall(f"{key_prefix}in_flight")) == ["a"]
    finally:
        client.close()
        await store.aclose()
