"""Both stores keep gateway processes' load payloads alike: publish, stamp by the store's clock, read everyone's,
forget the silent."""

from __future__ import annotations

import asyncio

import redis

from app.store.base import LoadShare, Store, written_payload
from app.store.memory import MemoryStore
from tests.store.redis_fixtures import loose_redis_store


def _payloads(share: LoadShare) -> dict[str, str]:
    return {pid: payload for pid, (_, payload) in share[1].items()}


async def test_every_process_reads_every_live_process_payload_its_own_included(any_store: Store) -> None:
    assert _payloads(await any_store.share_load("a", '{"x": 3}', 5.0)) == {"a": '{"x": 3}'}
    await any_store.share_load("b", "b's|payload", 5.0)  # opaque to the store, separators included
    assert _payloads(await any_store.share_load("c", None, 5.0)) == {"a": '{"x": 3}', "b": "b's|payload"}


async def test_a_read_publishes_nothing_and_a_new_round_replaces_a_process_payload(any_store: Store) -> None:
    await any_store.share_load("a", "round 1", 5.0)
    await any_store.share_load("a", "round 2", 5.0)
    assert _payloads(await any_store.share_load("reader", None, 5.0)) == {"a": "round 2"}


async def test_each_payload_carries_the_store_s_clock_at_its_write_and_every_answer_the_clock_now(
    any_store: Store,
) -> None:
    first_now, first = await any_store.share_load("a", "p", 5.0)
    assert first["a"][0] == first_now  # the write and the answer are one step on the store
    later_now, later = await any_store.share_load("b", None, 5.0)
    assert later["a"][0] == first_now <= later_now
    assert 1_600_000_000 * 10**6 < first_now < 4_000_000_000 * 10**6  # µs of the Unix epoch


async def test_memory_store_stamps_with_its_clock_and_forgets_a_process_once_its_ttl_passed() -> None:
    now = [1_000_000_000]
    store = MemoryStore(clock_us=lambda: now[0])
    await store.share_load("dead", "x", 1.0)
    now[0] += 900_000
    assert await store.share_load("live", "y", 1.0) == (
        1_000_900_000,
        {"dead": (1_000_000_000, "x"), "live": (1_000_900_000, "y")},
    )
    now[0] += 200_000
    assert _payloads(await store.share_load("live", None, 1.0)) == {"live": "y"}


async def test_redis_forgets_a_silent_process_by_the_server_clock_and_the_hash_expires(
    redis_url: str, key_prefix: str
) -> None:
    store = loose_redis_store(redis_url, key_prefix)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.share_load("dead", "x", 0.05)
        await store.share_load("live", "y", 5.0)
        await asyncio.sleep(0.1)
        assert _payloads(await store.share_load("live", "y", 0.05)) == {"live": "y"}
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
        assert _payloads(await store.share_load("a", "p", 5.0)) == {"a": "p"}
        assert list(client.hgetall(f"{key_prefix}in_flight")) == ["a"]
    finally:
        client.close()
        await store.aclose()


def test_a_stored_value_without_a_write_time_reads_as_written_at_zero() -> None:
    assert written_payload("1700000000000000|{}") == (1_700_000_000_000_000, "{}")
    assert written_payload('{"r": 3}') == (0, '{"r": 3}')  # an older gateway's entry: in no round
