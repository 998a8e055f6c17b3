"""Spend: exact integer sums per tenant/day/pool, and no acknowledged spend lost across a Redis restart."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, date, datetime
from decimal import Decimal

from app.context import Usage
from app.limits import Limiter
from app.spend import SpendLedger, recent_days, spend_record, usage_report, usd_to_micros
from app.store.base import DayUsage, PoolUsage, SpendRecord, Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from tests.servers import free_port
from tests.store.helpers import make_ctx, tenant_of
from tests.store.redis_fixtures import RedisServer, loose_redis_store


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def mixed_request(rng: random.Random) -> tuple[str, Usage, float]:
    """A request with a random pool, token split and cost (costs span 6 orders of magnitude)."""
    prompt = rng.randint(1, 4000)
    usage = Usage(prompt, rng.randint(0, 800), rng.randint(0, prompt), reported=True)
    return rng.choice(["fast", "bulk"]), usage, rng.uniform(0, 0.05) * 10 ** -rng.randint(0, 5)


def test_usd_to_micros_rounds_to_the_nearest_micro_dollar() -> None:
    assert usd_to_micros(0.0000014) == 1
    assert usd_to_micros(1.2345675) in (1_234_567, 1_234_568)
    assert usd_to_micros(0) == 0


def test_a_spend_record_splits_tokens_by_type() -> None:
    ctx = make_ctx(pool="fast", usage=Usage(100, 20, 30, True), cost_usd=0.25)
    rec = spend_record(ctx, "acme", "id1", datetime(2026, 11, 30, tzinfo=UTC))
    assert rec == SpendRecord("id1", "acme", "2026-11-30", "fast", 250_000, 70, 30, 20, 1)
    assert spend_record(make_ctx(pool=None), "acme", "id2").pool == "-"


def test_recent_days_are_newest_first() -> None:
    assert recent_days(3, date(2026, 3, 1)) == ["2026-03-01", "2026-02-28", "2026-02-27"]


def test_usage_report_totals_days_and_pools() -> None:
    days = [
        DayUsage("2026-11-30", {"fast": PoolUsage(10, 1, 2, 3, 1), "bulk": PoolUsage(5, 0, 0, 1, 2)}),
        DayUsage("2026-11-29", {"fast": PoolUsage(1, 1, 1, 1, 1)}),
    ]
    report = usage_report(days)
    assert report["total"]["usd_micros"] == 16 and report["total"]["requests"] == 4
    assert report["pools"]["fast"]["tokens"] == {"uncached": 2, "cached": 3, "output": 4}
    assert report["days"][0]["usd_micros"] == 15 and set(report["days"][0]["pools"]) == {"bulk", "fast"}


async def test_ledger_buffer_is_bounded_and_counts_what_it_drops() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:")
    try:
        ledger = SpendLedger(store, max_pending=3)
        for i in range(5):
            await ledger.record(SpendRecord(str(i), "acme", "2026-11-30", "fast", 1))
        assert (ledger.pending, ledger.dropped) == (3, 2)
        assert await ledger.flush() == 0
    finally:
        await store.aclose()


async def test_ledger_flush_writes_buffered_records_once() -> None:
    store = MemoryStore()
    ledger = SpendLedger(store, flush_batch=2)
    for i in range(5):
        ledger.buffer(SpendRecord(f"r{i}", "acme", "2026-11-30", "fast", 100))
    ledger.buffer(SpendRecord("r0", "acme", "2026-11-30", "fast", 100))  # a retry of r0
    assert await ledger.flush() == 6
    assert ledger.pending == 0
    assert await store.month_spend_micros("acme", "2026-11") == 500


async def test_spend_of_1000_mixed_requests_equals_the_sum_of_their_costs(any_store: Store) -> None:
    lim, acme = Limiter(any_store, "open"), tenant_of(rpm=100_000)
    rng = random.Random(6)
    header_sum = Decimal(0)
    micros_by_pool = {"fast": 0, "bulk": 0}
    for _ in range(1000):
        pool, usage, cost = mixed_request(rng)
        ctx = make_ctx(acme, pool=pool, usage=usage, cost_usd=cost)
        await lim.settle(ctx, await lim.admit(ctx))
        header_sum += Decimal(f"{cost:.8f}")  # what x-kvgate-cost-usd would carry
        micros_by_pool[pool] += usd_to_micros(cost)
    [day] = await any_store.usage("acme", [today()])
    assert {p: r.usd_micros for p, r in day.pools.items()} == micros_by_pool
    assert day.total().requests == 1000
    recorded = Decimal(day.total().usd_micros) / 1_000_000
    assert abs(recorded - header_sum) < Decimal("0.005")


async def test_redis_restart_mid_run_loses_no_acknowledged_spend_and_keeps_serving(own_redis: RedisServer) -> None:
    """fail_mode open: while Redis is down requests are admitted unenforced and their spend is buffered."""
    store = loose_redis_store(own_redis.url, "kvgate:", cooldown_s=0.05)
    lim, acme = Limiter(store, "open"), tenant_of(rpm=10_000, concurrent=50)
    rng = random.Random(7)
    expected = 0
    unenforced = 0

    async def one() -> None:
        nonlocal expected, unenforced
        pool, usage, cost = mixed_request(rng)
        ctx = make_ctx(acme, pool=pool, usage=usage, cost_usd=cost)
        admission = await lim.admit(ctx)  # must not raise while Redis is down
        unenforced += not admission.enforced
        await lim.settle(ctx, admission)
        expected += usd_to_micros(cost)

    try:
        for _ in range(100):
            await one()
        own_redis.stop()
        for _ in range(100):
            await one()
        assert unenforced == 100 and lim.ledger.pending == 100
        own_redis.start()  # same dir: the AOF brings back what was acknowledged before the stop
        await asyncio.sleep(0.1)
        for _ in range(100):
            await one()
        for _ in range(50):
            if not lim.ledger.pending:
                break
            await lim.ledger.flush()
            await asyncio.sleep(0.1)
        assert lim.ledger.pending == 0 and lim.ledger.dropped == 0
        [day] = await store.usage("acme", [today()])
        assert day.total().requests == 300
        assert day.total().usd_micros == expected
    finally:
        await store.aclose()
