"""RedisStore specifics: replicas share one limit, keys stay in one slot per tenant, a dead Redis fails fast."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from app.store.base import LimitSpec, Release, SpendRecord, StoreUnavailable
from app.store.redis_store import RedisStore
from tests.servers import free_port
from tests.store.redis_fixtures import RedisServer, loose_redis_store, redis_dump

MONTH = "2026-11"


async def two_replicas(url: str, prefix: str) -> tuple[RedisStore, RedisStore]:
    """Two stores with separate connection pools, as two gateway processes would have."""
    return loose_redis_store(url, prefix), loose_redis_store(url, prefix)


@pytest.mark.parametrize(("spec", "tokens", "n", "allowed"), [
    (LimitSpec(rpm=25), 1, 60, 25),
    (LimitSpec(tpm=1000), 100, 40, 10),
    (LimitSpec(rpm=50, tpm=2000, concurrent=8), 10, 40, 8),
])
async def test_two_replicas_enforce_one_limit_jointly(
    redis_url: str, key_prefix: str, spec: LimitSpec, tokens: int, n: int, allowed: int
) -> None:
    a, b = await two_replicas(redis_url, key_prefix)
    try:
        calls = [
            (a if i % 2 else b).admit("acme", spec, tokens, uuid.uuid4().hex, MONTH, False) for i in range(n)
        ]
        results = await asyncio.gather(*calls)
    finally:
        await a.aclose()
        await b.aclose()
    assert sum(r.admitted for r in results) == allowed


async def test_tpm_reconciled_on_one_replica_frees_tokens_for_the_other(redis_url: str, key_prefix: str) -> None:
    a, b = await two_replicas(redis_url, key_prefix)
    try:
        spec = LimitSpec(tpm=1000)
        assert (await a.admit("acme", spec, 1000, "l1", MONTH, False)).admitted
        assert not (await b.admit("acme", spec, 500, "l2", MONTH, False)).admitted
        await a.settle(Release("acme", None, 1000, 400 - 1000), None)
        assert (await b.admit("acme", spec, 500, "l3", MONTH, False)).admitted
    finally:
        await a.aclose()
        await b.aclose()


async def test_every_key_of_a_tenant_shares_one_hash_tag(redis_url: str, key_prefix: str) -> None:
    store = loose_redis_store(redis_url, key_prefix)
    try:
        spec = LimitSpec(rpm=5, tpm=500, concurrent=3, budget_micros=10**9)
        await store.admit("acme", spec, 10, "l1", MONTH, False)
        await store.settle(Release("acme", "l1", 500, 5), SpendRecord("s1", "acme", "2026-11-29", "fast", 7))
    finally:
        await store.aclose()
    keys = [k for k in redis_dump(redis_url, key_prefix) if k.startswith(key_prefix)]
    tenant_keys = [k for k in keys if "{acme}" in k]
    assert len(tenant_keys) >= 4  # rpm, tpm, month, day, dedupe marker (the lease was released)
    assert all(k.startswith(f"{key_prefix}{{acme}}:") for k in tenant_keys)


async def test_unreachable_redis_raises_store_unavailable_then_fails_fast() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:", cooldown_s=30)
    try:
        with pytest.raises(StoreUnavailable):
            await store.admit("acme", LimitSpec(rpm=1), 1, "l", MONTH, False)
        with pytest.raises(StoreUnavailable, match="cooling off"):
            await store.ping()
    finally:
        await store.aclose()


async def test_store_recovers_after_a_redis_restart(own_redis: RedisServer) -> None:
    store = loose_redis_store(own_redis.url, "r:", cooldown_s=0)
    try:
        await store.record_spend([SpendRecord("a", "acme", "2026-11-29", "fast", 5)])
        own_redis.stop()
        with pytest.raises(StoreUnavailable):
            await store.record_spend([SpendRecord("b", "acme", "2026-11-29", "fast", 5)])
        own_redis.start()
        # Scripts are gone from the restarted server's cache; the store reloads them.
        assert (await store.admit("acme", LimitSpec(rpm=1), 1, "l", MONTH, False)).admitted
        await store.record_spend([SpendRecord("b", "acme", "2026-11-29", "fast", 5)])
        assert await store.month_spend_micros("acme", MONTH) == 10
    finally:
        await store.aclose()


async def test_pooled_connections_left_stale_by_a_restart_do_not_put_the_store_into_cool_off(
    own_redis: RedisServer,
) -> None:
    store = loose_redis_store(own_redis.url, "p:", cooldown_s=30)
    try:
        await asyncio.gather(*(store.tenant_keys(f"t{i}") for i in range(4)))  # several pooled connections
        await store.admit("acme", LimitSpec(rpm=5), 1, "l1", MONTH, False)
        own_redis.stop()
        own_redis.start()
        # Any failure here would start a 30 s cool-off and fail everything after it.
        await asyncio.gather(*(store.tenant_keys(f"t{i}") for i in range(4)))
        await store.record_spend([SpendRecord("s", "acme", "2026-11-29", "fast", 4)])
        assert await store.month_spend_micros("acme", MONTH) == 4
        assert (await store.admit("acme", LimitSpec(rpm=5), 1, "l2", MONTH, False)).admitted
    finally:
        await store.aclose()


async def test_scripts_flushed_from_the_server_run_again_without_an_error(own_redis: RedisServer) -> None:
    store = loose_redis_store(own_redis.url, "f:")
    admin = aioredis.from_url(own_redis.url)
    try:
        spec = LimitSpec(rpm=2, concurrent=5)
        assert (await store.admit("acme", spec, 1, "l1", MONTH, False)).admitted
        await admin.script_flush()
        assert (await store.admit("acme", spec, 1, "l2", MONTH, False)).admitted
        assert (await store.admit("acme", spec, 1, "l3", MONTH, False)).reason == "rpm"
        assert await admin.script_exists(store._admit_call.sha) == [True]  # cached again by the fallback
        await admin.script_flush()
        await store.settle(Release("acme", "l1", None, 0), SpendRecord("s1", "acme", "2026-11-29", "fast", 9))
        assert await store.month_spend_micros("acme", MONTH) == 9
        assert await admin.script_exists(store._settle_call.sha) == [True]
    finally:
        await store.aclose()
        await admin.aclose()


async def test_an_established_connection_reconnects_after_a_redis_restart(own_redis: RedisServer) -> None:
    store = loose_redis_store(own_redis.url, "c:", cooldown_s=0)
    try:
        assert (await store.admit("acme", LimitSpec(rpm=5), 1, "l1", MONTH, False)).admitted
        own_redis.stop()
        with pytest.raises(StoreUnavailable):
            await store.admit("acme", LimitSpec(rpm=5), 1, "l2", MONTH, False)
        own_redis.start()
        assert (await store.admit("acme", LimitSpec(rpm=5), 1, "l3", MONTH, False)).admitted
        await store.settle(None, SpendRecord("s", "acme", "2026-11-29", "fast", 3))
        assert await store.month_spend_micros("acme", MONTH) == 3
    finally:
        await store.aclose()


async def test_a_reply_slower_than_the_socket_timeout_is_store_unavailable_then_cools_off(
    own_redis: RedisServer,
) -> None:
    store = RedisStore(own_redis.url, "t:", socket_timeout_s=0.1, cooldown_s=30)
    admin = aioredis.from_url(own_redis.url, socket_timeout=5)
    try:
        assert (await store.admit("acme", LimitSpec(rpm=5), 1, "l1", MONTH, False)).admitted
        await admin.execute_command("CLIENT", "PAUSE", 400, "ALL")
        with pytest.raises(StoreUnavailable, match="RespTimeout"):
            await store.admit("acme", LimitSpec(rpm=5), 1, "l2", MONTH, False)
        with pytest.raises(StoreUnavailable, match="cooling off"):
            await store.settle(None, SpendRecord("s", "acme", "2026-11-29", "fast", 3))
        await admin.ping()  # the pause is over
    finally:
        await store.aclose()
        await admin.aclose()


async def test_a_cold_calls_timeout_fails_that_call_only_and_admits_go_on(own_redis: RedisServer) -> None:
    # redis-py times its reads on the gateway's loop (late under a burst without Redis being slow): only the
    # pipelined client, timed on Redis' answer, may put the hot path into its cool-off.
    store = RedisStore(own_redis.url, "c:", socket_timeout_s=0.1, cooldown_s=30)
    admin = aioredis.from_url(own_redis.url, socket_timeout=5)
    try:
        await store.ping()
        await admin.execute_command("CLIENT", "PAUSE", 300, "ALL")
        with pytest.raises(StoreUnavailable, match="TimeoutError"):
            await store.share_load("p1", "1", 5)
        await admin.ping()  # the pause is over
        assert (await store.admit("acme", LimitSpec(rpm=5), 1, "l1", MONTH, False)).admitted
    finally:
        await store.aclose()
        await admin.aclose()


async def test_an_error_reply_is_store_unavailable_and_logged_without_cooling_off(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = loose_redis_store(redis_url, key_prefix, cooldown_s=30)
    admin = aioredis.from_url(redis_url)
    try:
        await admin.set(f"{key_prefix}{{acme}}:rpm", "not a bucket")  # the script's HMGET hits WRONGTYPE
        with pytest.raises(StoreUnavailable, match="redis error: RespError"):
            await store.admit("acme", LimitSpec(rpm=5), 1, "l1", MONTH, False)
        assert any("WRONGTYPE" in r.getMessage() for r in caplog.records)
        assert (await store.admit("acme", LimitSpec(tpm=50), 1, "l2", MONTH, False)).admitted
    finally:
        await store.aclose()
        await admin.aclose()


@pytest.mark.parametrize(("url", "fast_path", "expected"), [
    ("redis://127.0.0.1:6379/0", True, True),
    ("redis://127.0.0.1:6379/0", False, False),
    ("rediss://127.0.0.1:6379/0", True, False),
])
async def test_hot_scripts_use_the_pipelined_client_unless_the_url_or_caller_rules_it_out(
    url: str, fast_path: bool, expected: bool
) -> None:
    store = RedisStore(url, "x:", fast_path=fast_path)
    assert store.fast_path is expected
    await store.aclose()
