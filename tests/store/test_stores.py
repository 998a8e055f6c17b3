"""Both Store implementations answer alike: limits, leases, spend and keys (real Redis for RedisStore)."""

from __future__ import annotations

import asyncio
import uuid

from app.store.base import LimitSpec, Release, SpendRecord, Store

MONTH = "2026-11"


def lease() -> str:
    return uuid.uuid4().hex


async def admit_many(store: Store, tenant: str, spec: LimitSpec, n: int, tokens: int = 1) -> list[bool]:
    results = await asyncio.gather(*(store.admit(tenant, spec, tokens, lease(), MONTH, False) for _ in range(n)))
    return [r.admitted for r in results]


async def test_rpm_admits_exactly_the_limit_then_rejects_with_retry_after(any_store: Store) -> None:
    spec = LimitSpec(rpm=7)
    admitted = await admit_many(any_store, "t", spec, 12)
    assert admitted.count(True) == 7
    over = await any_store.admit("t", spec, 1, lease(), MONTH, False)
    assert (over.admitted, over.reason) == (False, "rpm")
    assert 0 < over.retry_after_s <= 60 / 7 + 0.01


async def test_tpm_charges_tokens_and_rejects_what_does_not_fit(any_store: Store) -> None:
    spec = LimitSpec(tpm=1000)
    assert await admit_many(any_store, "t", spec, 3, tokens=300) == [True, True, True]
    over = await any_store.admit("t", spec, 300, lease(), MONTH, False)
    assert (over.admitted, over.reason) == (False, "tpm")
    fits = await any_store.admit("t", spec, 100, lease(), MONTH, False)
    assert fits.admitted and fits.tokens_reserved == 100


async def test_a_failed_check_commits_nothing(any_store: Store) -> None:
    spec = LimitSpec(rpm=2, tpm=100, concurrent=5)
    too_big = await any_store.admit("t", spec, 150, lease(), MONTH, False)
    assert (too_big.admitted, too_big.reason, too_big.lease_taken) == (False, "tpm", False)
    # The rejected request took neither an rpm slot nor a lease: two small ones still fit.
    assert await admit_many(any_store, "t", spec, 2, tokens=10) == [True, True]


async def test_window_refills_after_retry_after(any_store: Store) -> None:
    spec = LimitSpec(rpm=2, window_s=0.4)
    assert await admit_many(any_store, "t", spec, 2) == [True, True]
    over = await any_store.admit("t", spec, 1, lease(), MONTH, False)
    assert not over.admitted
    await asyncio.sleep(over.retry_after_s + 0.02)
    assert (await any_store.admit("t", spec, 1, lease(), MONTH, False)).admitted


async def test_tpm_reconciliation_returns_unused_tokens_and_charges_overruns(any_store: Store) -> None:
    spec = LimitSpec(tpm=1000)
    first = await any_store.admit("t", spec, 900, lease(), MONTH, False)
    assert first.tokens_reserved == 900
    assert not (await any_store.admit("t", spec, 800, lease(), MONTH, False)).admitted
    # Actual usage was 100 tokens: 800 go back to the window.
    await any_store.settle(Release("t", None, 1000, 100 - 900), None)
    second = await any_store.admit("t", spec, 800, lease(), MONTH, False)
    assert second.admitted
    # That one really used 1,000: the overrun of 200 is charged, so even 100 more no longer fit.
    await any_store.settle(Release("t", None, 1000, 1000 - 800), None)
    assert not (await any_store.admit("t", spec, 100, lease(), MONTH, False)).admitted


async def test_concurrency_slots_are_leased_and_released(any_store: Store) -> None:
    spec = LimitSpec(concurrent=2)
    a, b = lease(), lease()
    assert (await any_store.admit("t", spec, 1, a, MONTH, False)).lease_taken
    assert (await any_store.admit("t", spec, 1, b, MONTH, False)).lease_taken
    full = await any_store.admit("t", spec, 1, lease(), MONTH, False)
    assert (full.admitted, full.reason, full.lease_taken) == (False, "concurrent", False)
    await any_store.settle(Release("t", a, None, 0), None)
    assert (await any_store.admit("t", spec, 1, lease(), MONTH, False)).admitted


async def test_a_lease_never_released_expires_so_a_crashed_gateway_leaks_no_slot(any_store: Store) -> None:
    spec = LimitSpec(concurrent=1, lease_s=0.2)
    assert (await any_store.admit("t", spec, 1, lease(), MONTH, False)).admitted
    assert not (await any_store.admit("t", spec, 1, lease(), MONTH, False)).admitted
    await asyncio.sleep(0.3)
    assert (await any_store.admit("t", spec, 1, lease(), MONTH, False)).admitted


async def test_budget_blocks_once_the_month_spend_reaches_it(any_store: Store) -> None:
    spec = LimitSpec(budget_micros=1_000)
    await any_store.record_spend([SpendRecord(lease(), "t", f"{MONTH}-03", "fast", 600)])
    assert (await any_store.admit("t", spec, 1, lease(), MONTH, False)).admitted
    await any_store.record_spend([SpendRecord(lease(), "t", f"{MONTH}-04", "bulk", 400)])
    over = await any_store.admit("t", spec, 1, lease(), MONTH, False)
    assert (over.admitted, over.reason) == (False, "budget")
    assert (await any_store.admit("t", spec, 1, lease(), "2026-12", False)).admitted
    assert await any_store.month_spend_micros("t", MONTH) == 1_000


async def test_force_lease_holds_a_slot_but_charges_no_window(any_store: Store) -> None:
    spec = LimitSpec(rpm=1, concurrent=10)
    assert (await any_store.admit("t", spec, 1, lease(), MONTH, False)).admitted
    forced = await any_store.admit("t", spec, 1, lease(), MONTH, True)
    assert (forced.admitted, forced.reason, forced.lease_taken, forced.tokens_reserved) == (False, "rpm", True, 0)
    busy = LimitSpec(concurrent=2)
    assert not (await any_store.admit("t", busy, 1, lease(), MONTH, False)).admitted


async def test_spend_is_idempotent_per_record_id_and_reads_back_by_day_and_pool(any_store: Store) -> None:
    rec = SpendRecord("r1", "t", "2026-11-29", "fast", 1234, uncached_tokens=10, cached_tokens=5, output_tokens=7)
    await any_store.settle(None, rec)
    await any_store.record_spend([rec])  # a retry of an already-applied record
    await any_store.record_spend([SpendRecord("r2", "t", "2026-11-29", "bulk", 66, output_tokens=3)])
    await any_store.record_spend([SpendRecord("r3", "t", "2026-11-30", "fast", 1)])
    d29, d28 = await any_store.usage("t", ["2026-11-29", "2026-11-28"])
    assert d28.pools == {}
    assert d29.pools["fast"].usd_micros == 1234
    assert (d29.pools["fast"].uncached_tokens, d29.pools["fast"].cached_tokens) == (10, 5)
    assert d29.pools["fast"].requests == 1
    assert d29.total().usd_micros == 1300 and d29.total().output_tokens == 10
    assert await any_store.month_spend_micros("t", "2026-11") == 1301


async def test_keys_map_to_tenants_and_revocation_sticks(any_store: Store) -> None:
    assert await any_store.put_key("h1", "acme")
    assert await any_store.put_key("h2", "acme")
    assert await any_store.key_tenant("h1") == "acme"
    assert await any_store.tenant_keys("acme") == ["h1", "h2"]
    assert await any_store.revoke_key("acme", "h1")
    assert not await any_store.revoke_key("acme", "h1")
    assert await any_store.key_tenant("h1") is None
    # Reloading config keys must not resurrect a revoked one.
    assert not await any_store.put_key("h1", "acme", unless_revoked=True)
    assert await any_store.tenant_keys("acme") == ["h2"]


async def test_tenants_do_not_share_windows(any_store: Store) -> None:
    spec = LimitSpec(rpm=1)
    assert (await any_store.admit("a", spec, 1, lease(), MONTH, False)).admitted
    assert (await any_store.admit("b", spec, 1, lease(), MONTH, False)).admitted
    assert not (await any_store.admit("a", spec, 1, lease(), MONTH, False)).admitted
