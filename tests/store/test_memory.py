"""MemoryStore upkeep: spend ids, leases and spend rows expire as Redis expires them, in bounded work and memory.

Costs are pinned by counting entries and the ids each structure looks at, never by timing.
"""

from __future__ import annotations

import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.context import Usage
from app.limits import Limiter
from app.store.base import SPEND_DEDUPE_S, SPEND_KEEP_S, LimitSpec, Release, SpendRecord
from app.store.memory import MAX_SPEND_IDS, MemoryStore, RecentIds
from app.tenancy import TenantRegistry
from tests.store.helpers import config, make_ctx

US = 1_000_000
T0 = 1_800_000_000 * US
DAY = "2026-11-29"
MONTH = "2026-11"


class Clock:
    """A store clock the test moves by hand (µs)."""

    def __init__(self, now_us: int = T0) -> None:
        self.now = now_us

    def __call__(self) -> int:
        return self.now


def rec(rid: str, usd_micros: int = 1, day: str = DAY, tenant: str = "t") -> SpendRecord:
    return SpendRecord(rid, tenant, day, "fast", usd_micros)


async def spent(store: MemoryStore, tenant: str = "t", month: str = MONTH) -> int:
    return await store.month_spend_micros(tenant, month)


# -- spend ids: Redis `SET id NX PX 300000` --------------------------------------------------------
async def test_a_duplicate_id_within_the_window_is_not_counted_twice() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    await store.settle(None, rec("r1", 100))
    for _ in range(3):
        clock.now += (SPEND_DEDUPE_S - 1) * US // 3
        await store.record_spend([rec("r1", 100)])
    assert await spent(store) == 100
    day = (await store.usage("t", [DAY]))[0]
    assert day.pools["fast"].requests == 1


async def test_an_id_is_remembered_for_exactly_the_dedupe_window_and_a_duplicate_does_not_extend_it() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    await store.record_spend([rec("r1", 100)])
    clock.now = T0 + SPEND_DEDUPE_S * US - 1
    await store.record_spend([rec("r1", 100)])  # last µs of the window; does not refresh it (NX)
    assert await spent(store) == 100
    clock.now = T0 + SPEND_DEDUPE_S * US
    await store.record_spend([rec("r1", 100)])  # expired, as the Redis key would be: counts again
    assert await spent(store) == 200
    await store.record_spend([rec("r1", 100)])  # and is remembered again from now
    assert await spent(store) == 200


@pytest.mark.slow
async def test_spend_ids_stay_within_rate_times_window_and_upkeep_work_per_record_does_not_grow() -> None:
    clock = Clock()
    store = MemoryStore(clock, max_spend_ids=10**6)  # above the window: ids go by expiry alone
    rate, n, batch = 500, 300_000, 10_000  # 600 s of records at 500/s: twice the window
    bound = rate * SPEND_DEDUPE_S + rate  # the window's ids plus one 100 ms slot of slack
    visited = []
    for i in range(n):
        clock.now = T0 + i * US // rate
        await store.settle(None, rec(f"r{i}"))
        if (i + 1) % batch == 0:
            counts = store.entry_counts()
            assert counts["spend_ids"] <= bound and counts["spend_id_slots"] <= bound
            visited.append(store._seen.visited)
    assert await spent(store) == n
    per_batch = [b - a for a, b in zip([0, *visited], visited, strict=False)]
    # Each id is looked at once, when its slot expires: per batch at most the batch plus one slot.
    assert max(per_batch) <= batch + rate
    assert sum(per_batch) <= n
    # Once the window is full, every batch forgets about as many ids as it adds.
    steady = per_batch[len(per_batch) * 2 // 3 :]
    assert min(steady) >= batch - rate


@pytest.mark.slow
async def test_past_the_cap_the_oldest_ids_go_first_and_recent_duplicates_still_count_once() -> None:
    clock = Clock()  # frozen: nothing expires, only the cap bounds the ids
    cap = 50_000
    store = MemoryStore(clock, max_spend_ids=cap)
    for i in range(300_000):
        await store.settle(None, rec(f"r{i}"))
        assert store._seen.filed <= cap
    assert len(store._seen) <= cap
    assert store._seen.visited <= 300_000
    await store.record_spend([rec(f"r{i}") for i in range(300_000 - cap + cap // 32, 300_000)])
    assert await spent(store) == 300_000
    await store.record_spend([rec("r0")])  # forgotten early, the one deviation from Redis
    assert await spent(store) == 300_001


@pytest.mark.slow
def test_the_default_cap_holds_the_full_window_at_200_requests_per_second_in_at_most_16_mib() -> None:
    assert MAX_SPEND_IDS >= 200 * SPEND_DEDUPE_S
    ids = RecentIds(SPEND_DEDUPE_S * US, MAX_SPEND_IDS)
    tracemalloc.start()
    try:
        for i in range(2 * MAX_SPEND_IDS):  # the gateway's ids (uuid4 hex) at 4,000 per second
            ids.add(uuid.uuid4().hex, T0 + i * 250)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(ids) <= MAX_SPEND_IDS and ids.filed <= MAX_SPEND_IDS
    assert held <= 16 * 2**20  # ~180 B an id: 11.5 MiB on CPython 3.11


def test_an_id_seen_again_after_expiring_survives_its_old_slot_being_dropped() -> None:
    ids = RecentIds(ttl_us=10 * US, cap=1_000)
    assert ids.add("a", T0)
    assert not ids.add("a", T0 + 5 * US)
    assert ids.add("a", T0 + 10 * US)  # re-filed in a later slot
    assert ids.add("b", T0 + 10 * US + 200_000)  # drops the old slot
    assert not ids.add("a", T0 + 19 * US)
    assert ids.add("a", T0 + 20 * US)
    assert ids.filed <= 3 and len(ids) == 2


def test_a_clock_stepping_back_keeps_ids_no_shorter_and_still_bounded() -> None:
    ids = RecentIds(ttl_us=10 * US, cap=100)
    for i in range(50):
        assert ids.add(f"x{i}", T0 + i * US)
    for i in range(200):  # the clock stepped back a minute
        assert ids.add(f"y{i}", T0 - 60 * US + i * 1_000)
        assert ids.filed <= 100
    assert not ids.add("y199", T0 - 60 * US + 200_000)


# -- leases: Redis ZADD / ZREM / ZREMRANGEBYSCORE ---------------------------------------------------
async def test_released_leases_leave_the_heap_bounded_by_the_live_ones() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    spec = LimitSpec(concurrent=100)
    held: list[str] = []
    for _ in range(50_000):
        clock.now += 1_000
        lid = uuid.uuid4().hex
        assert (await store.admit("t", spec, 1, lid, MONTH, False)).admitted
        held.append(lid)
        if len(held) > 50:
            await store.settle(Release("t", held.pop(0), None, 0), None)
        counts = store.entry_counts()
        assert counts["leases"] <= 51
        assert counts["lease_heap"] <= 2 * 51 + 64 + 1


async def test_leases_never_released_expire_from_the_heap_in_order() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    spec = LimitSpec(concurrent=1_000, lease_s=0.25)
    for _ in range(20_000):  # 2,000 per store second, none released (a leak): 500 alive at a time
        clock.now += 500
        assert (await store.admit("t", spec, 1, uuid.uuid4().hex, MONTH, False)).admitted
        counts = store.entry_counts()
        assert counts["leases"] <= 500 and counts["lease_heap"] <= 500
    clock.now += US
    assert (await store.admit("t", LimitSpec(concurrent=1), 1, "last", MONTH, False)).admitted
    assert store.entry_counts()["leases"] == 1


async def test_leases_with_different_lifetimes_expire_each_at_its_own_time() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    await store.admit("t", LimitSpec(concurrent=2, lease_s=100.0), 1, "long", MONTH, False)
    await store.admit("t", LimitSpec(concurrent=2, lease_s=1.0), 1, "short", MONTH, False)
    clock.now += 2 * US
    assert (await store.admit("t", LimitSpec(concurrent=2), 1, "new", MONTH, False)).admitted
    assert not (await store.admit("t", LimitSpec(concurrent=2), 1, "more", MONTH, False)).admitted


# -- spend rows: PEXPIRE SPEND_KEEP_S on every write ------------------------------------------------
async def test_spend_rows_expire_a_keep_period_after_their_last_write() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    await store.record_spend([rec("old", 5, day="2026-01-02", tenant="a"), rec("live", 7, day="2026-01-02")])
    clock.now += SPEND_KEEP_S * US // 2
    await store.record_spend([rec("again", 1, day="2026-01-02")])  # tenant t writes again: its rows live on
    clock.now = T0 + SPEND_KEEP_S * US
    assert await store.month_spend_micros("a", "2026-01") == 0
    assert (await store.usage("a", ["2026-01-02"]))[0].pools == {}
    assert await store.month_spend_micros("t", "2026-01") == 8
    assert store.entry_counts()["month_rows"] == 1 and store.entry_counts()["day_rows"] == 1


# -- the gateway's admit/settle path ----------------------------------------------------------------
@pytest.mark.slow
async def test_gateway_settles_keep_every_memory_store_structure_bounded() -> None:
    clock = Clock()
    store = MemoryStore(clock, max_spend_ids=20_000)
    limits = {"rpm": 10**8, "tpm": 10**10, "concurrent": 64, "monthly_budget_usd": 10**6}
    acme, beta = (TenantRegistry(config(acme_limits=limits), store).tenant(t) for t in ("acme", "beta"))
    assert acme is not None and beta is not None
    limiter = Limiter(store, "open")
    largest: dict[str, int] = {}
    for i in range(60_000):
        clock.now += 1_000  # 1,000 requests per store second
        ctx = make_ctx(acme if i % 3 else beta, usage=Usage(40, 16, 32), cost_usd=0.0001)
        admission = await limiter.admit(ctx)
        await limiter.settle(ctx, admission)
        for name, n in store.entry_counts().items():
            largest[name] = max(largest.get(name, 0), n)
    assert largest["spend_ids"] <= 20_000 and largest["spend_id_slots"] <= 20_000
    assert largest["leases"] <= 1 and largest["lease_heap"] <= 65
    assert largest["buckets"] <= 2 and largest["month_rows"] <= 2 and largest["day_rows"] <= 2
    today = datetime.now(UTC).date()
    days = [(today + timedelta(days=d)).isoformat() for d in (-1, 0)]  # the run may cross midnight
    served = [row.total().requests for t in ("acme", "beta") for row in await store.usage(t, days)]
    assert sum(served) == 60_000
