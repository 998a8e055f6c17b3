"""Limits: token estimate, 429s in OpenAI's shape, degrade, reconciliation, leases, budget, fail modes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from app.config import RoutingConfig
from app.context import Usage
from app.errors import GatewayError
from app.limits import (
    Limiter,
    cap_max_tokens,
    estimate_input_tokens,
    max_output_tokens,
    seconds_to_next_month,
)
from app.routing.classify import classify
from app.store.base import AdmitResult, LimitSpec, Release, SpendRecord, Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from app.surfaces import CHAT, COMPLETIONS
from app.tenancy import TenantRegistry
from tests.servers import free_port
from tests.store.helpers import config, make_ctx, tenant_of


def chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def limiter(store: Store, fail_mode: str = "open") -> Limiter:
    return Limiter(store, fail_mode)


def error_of(err: GatewayError) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(err.body())["error"]
    return body


# -- the estimate --------------------------------------------------------------------------------
def test_estimate_is_a_quarter_of_the_characters_plus_message_framing() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "x" * 400},
            {"role": "user", "content": [{"type": "text", "text": "y" * 41}, {"type": "image_url"}]},
        ]
    }
    assert estimate_input_tokens(CHAT.view(body)) == 100 + 11 + 2 * 4


def test_estimate_counts_prompts_and_tool_schemas() -> None:
    assert estimate_input_tokens(COMPLETIONS.view({"prompt": "z" * 80})) == 20
    assert estimate_input_tokens(COMPLETIONS.view({"prompt": ["a" * 8, "b" * 8]})) == 4
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert estimate_input_tokens(CHAT.view({"messages": [], "tools": tools})) == -(-len(orjson.dumps(tools)) // 4)


def test_output_reservation_prefers_max_completion_tokens_and_multiplies_by_n() -> None:
    assert max_output_tokens({"max_tokens": 50, "max_completion_tokens": 70, "n": 2}) == 140
    assert max_output_tokens({"max_tokens": 50}) == 50
    assert max_output_tokens({}) == 0


def test_cap_max_tokens_lowers_or_sets_but_never_raises() -> None:
    body: dict[str, Any] = {"max_tokens": 1000}
    cap_max_tokens(body, 256)
    assert body["max_tokens"] == 256
    body = {"max_completion_tokens": 10}
    cap_max_tokens(body, 256)
    assert body == {"max_completion_tokens": 10}
    body = {}
    cap_max_tokens(body, 256)
    assert body == {"max_tokens": 256}


def test_budget_retry_after_runs_to_the_next_month() -> None:
    assert seconds_to_next_month(datetime(2026, 12, 31, 23, 0, tzinfo=UTC)) == 3600
    assert seconds_to_next_month(datetime(2026, 11, 30, 12, 0, tzinfo=UTC)) == 12 * 3600


# -- admit ---------------------------------------------------------------------------------------
async def test_admit_records_the_estimate_on_the_context(any_store: Store) -> None:
    acme = tenant_of(rpm=10)
    ctx = make_ctx(acme, body=chat("w" * 40))
    await limiter(any_store).admit(ctx)
    assert ctx.estimated_input_tokens == 10 + 4


async def test_over_rpm_is_429_rate_limit_exceeded_with_retry_after(any_store: Store) -> None:
    acme = tenant_of(rpm=2)
    lim = limiter(any_store)
    for _ in range(2):
        await lim.admit(make_ctx(acme))
    with pytest.raises(GatewayError) as err:
        await lim.admit(make_ctx(acme))
    assert err.value.status == 429
    assert (error_of(err.value)["type"], error_of(err.value)["code"]) == ("requests", "rate_limit_exceeded")
    assert int(err.value.headers["Retry-After"]) >= 1
    assert err.value.headers["x-kvgate-limit"] == "rejected:rpm"


async def test_over_tpm_is_429_of_type_tokens(any_store: Store) -> None:
    acme = tenant_of(tpm=100)
    lim = limiter(any_store)
    await lim.admit(make_ctx(acme, body=chat(max_tokens=90)))
    with pytest.raises(GatewayError) as err:
        await lim.admit(make_ctx(acme, body=chat(max_tokens=90)))
    assert (error_of(err.value)["type"], error_of(err.value)["code"]) == ("tokens", "rate_limit_exceeded")


async def test_one_request_larger_than_tpm_still_passes_an_idle_window(any_store: Store) -> None:
    acme = tenant_of(tpm=100)
    lim = limiter(any_store)
    admission = await lim.admit(make_ctx(acme, body=chat(max_tokens=5000)))
    assert admission.tokens_reserved == 100


async def test_exhausted_budget_is_429_budget_exceeded_until_next_month(any_store: Store) -> None:
    acme = tenant_of(monthly_budget_usd=0.01)
    lim = limiter(any_store)
    today = datetime.now(UTC).date().isoformat()
    await any_store.record_spend([SpendRecord("s", "acme", today, "fast", 10_000)])
    with pytest.raises(GatewayError) as err:
        await lim.admit(make_ctx(acme))
    assert err.value.status == 429
    assert error_of(err.value)["code"] == "budget_exceeded"
    assert int(err.value.headers["Retry-After"]) > 60


async def test_degrade_serves_over_limit_requests_as_bulk_with_capped_max_tokens(any_store: Store) -> None:
    acme = tenant_of(rpm=1, on_exceed="degrade", degrade_max_tokens=64)
    lim = limiter(any_store)
    first = make_ctx(acme, body=chat(max_tokens=1000))
    await lim.admit(first)
    assert first.admission is None and first.body["max_tokens"] == 1000
    second = make_ctx(acme, body=chat(max_tokens=1000))
    admission = await lim.admit(second)
    assert admission.degraded == "rpm"
    decision = classify(second.body, {}, second.tenant, RoutingConfig(), degraded=admission.degraded is not None)
    assert (decision.route_class, decision.reason) == ("bulk", "degraded")
    assert second.body["max_tokens"] == 64
    assert second.limit_notes == ["degraded:rpm:class=bulk:max_tokens=64"]


async def test_degraded_budget_overrun_is_served_not_rejected(any_store: Store) -> None:
    acme = tenant_of(monthly_budget_usd=0, on_exceed="degrade")
    lim = limiter(any_store)
    ctx = make_ctx(acme)
    admission = await lim.admit(ctx)
    assert admission.degraded == "budget" and ctx.body["max_tokens"] == 256


async def test_an_unlimited_tenant_costs_no_store_round_trip() -> None:
    class Counting(MemoryStore):
        calls = 0

        async def admit(self, *args: Any, **kw: Any) -> AdmitResult:
            Counting.calls += 1
            return await super().admit(*args, **kw)

    await limiter(Counting()).admit(make_ctx())
    assert Counting.calls == 0


# -- settle --------------------------------------------------------------------------------------
async def test_settle_reconciles_tpm_to_actual_usage(any_store: Store) -> None:
    acme = tenant_of(tpm=1000)
    lim = limiter(any_store)
    ctx = make_ctx(acme, body=chat(max_tokens=900))
    admission = await lim.admit(ctx)
    with pytest.raises(GatewayError):
        await lim.admit(make_ctx(acme, body=chat(max_tokens=900)))
    ctx.usage = Usage(prompt_tokens=20, completion_tokens=30, reported=True)
    await lim.settle(ctx, admission)
    await lim.admit(make_ctx(acme, body=chat(max_tokens=900)))


async def test_settle_releases_the_concurrency_slot(any_store: Store) -> None:
    acme = tenant_of(concurrent=1)
    lim = limiter(any_store)
    ctx = make_ctx(acme)
    admission = await lim.admit(ctx)
    with pytest.raises(GatewayError) as err:
        await lim.admit(make_ctx(acme))
    assert error_of(err.value)["code"] == "rate_limit_exceeded"
    await lim.settle(ctx, admission)
    await lim.admit(make_ctx(acme))


async def test_settle_records_spend_by_pool_and_token_type(any_store: Store) -> None:
    lim = limiter(any_store)
    ctx = make_ctx(pool="bulk", cost_usd=0.0123456)
    ctx.usage = Usage(prompt_tokens=100, completion_tokens=7, cached_tokens=64, reported=True)
    await lim.settle(ctx, await lim.admit(ctx))
    [day] = await any_store.usage("acme", [datetime.now(UTC).date().isoformat()])
    row = day.pools["bulk"]
    assert (row.usd_micros, row.uncached_tokens, row.cached_tokens, row.output_tokens, row.requests) == (
        12346,
        36,
        64,
        7,
        1,
    )


async def test_settle_never_raises_into_the_request() -> None:
    class Broken(MemoryStore):
        async def settle(self, release: Release | None, spend: SpendRecord | None) -> None:
            raise RuntimeError("boom")

    lim = limiter(Broken())
    ctx = make_ctx(tenant_of(rpm=5))
    await lim.settle(ctx, await lim.admit(ctx))


# -- fail modes ----------------------------------------------------------------------------------
async def test_fail_open_serves_unenforced_and_buffers_spend() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:")
    try:
        acme = tenant_of(rpm=1)
        lim = limiter(store, "open")
        for _ in range(3):
            ctx = make_ctx(acme, cost_usd=0.5)
            admission = await lim.admit(ctx)
            assert not admission.enforced
            assert ctx.limit_notes == ["unenforced:store_unavailable"]
            await lim.settle(ctx, admission)
        assert lim.ledger.pending == 3
    finally:
        await store.aclose()


async def test_fail_closed_answers_503_in_openai_shape() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:")
    try:
        acme = tenant_of(rpm=1)
        with pytest.raises(GatewayError) as err:
            await limiter(store, "closed").admit(make_ctx(acme))
    finally:
        await store.aclose()
    assert err.value.status == 503
    assert error_of(err.value)["code"] == "store_unavailable"


def test_fail_mode_must_be_open_or_closed() -> None:
    with pytest.raises(ValueError):
        limiter(MemoryStore(), "ajar")


def test_limit_spec_budget_is_integer_micro_dollars() -> None:
    from app.config import LimitsConfig
    from app.limits import limit_spec

    assert limit_spec(LimitsConfig(monthly_budget_usd=12.345678), 60) == LimitSpec(
        budget_micros=12_345_678, lease_s=60
    )


# -- leases of long streams ----------------------------------------------------------------------
@pytest.mark.slow
async def test_a_stream_longer_than_its_lease_still_holds_its_concurrency_slot(any_store: Store) -> None:
    lease_s = 1.5  # renewed every 0.5 s; a whole lease (1.5 s) of loop lag would be needed to lose it
    acme = TenantRegistry(config(acme_limits={"concurrent": 1}), any_store, lease_s=lease_s).tenant("acme")
    lim = limiter(any_store)
    stream = make_ctx(acme, body=chat(stream=True))
    stream.stream = True
    admission = await lim.admit(stream)
    await asyncio.sleep(3 * lease_s)
    with pytest.raises(GatewayError) as err:
        await lim.admit(make_ctx(acme))
    assert error_of(err.value)["code"] == "rate_limit_exceeded"
    await lim.settle(stream, admission)
    await lim.settle(second := make_ctx(acme), await lim.admit(second))


async def test_renew_lease_moves_a_held_lease_and_refuses_a_released_one(any_store: Store) -> None:
    spec = LimitSpec(rpm=None, tpm=None, concurrent=1, budget_micros=None, lease_s=60)
    result = await any_store.admit("acme", spec, 1, "lease-1", "2026-12", False)
    assert result.lease_taken
    assert await any_store.renew_lease("acme", "lease-1", 60)
    await any_store.settle(Release("acme", "lease-1", None, 0, 60.0), None)
    assert not await any_store.renew_lease("acme", "lease-1", 60)
    assert not await any_store.renew_lease("nobody", "lease-1", 60)


# -- the tenant record ---------------------------------------------------------------------------
async def test_admit_enforces_the_limits_on_the_tenant_record_and_looks_the_tenant_up_nowhere(
    any_store: Store,
) -> None:
    # Two records of the same tenant id: what the one the request carries says is what is enforced.
    lim, limited, unlimited = limiter(any_store), tenant_of(rpm=1), tenant_of()
    await lim.admit(make_ctx(limited))
    with pytest.raises(GatewayError):
        await lim.admit(make_ctx(limited))
    admission = await lim.admit(make_ctx(unlimited))
    assert admission.tenant is unlimited and admission.spec is unlimited.limit_spec


@pytest.mark.parametrize("weight", [0.0, 1.0])
async def test_settle_weighs_cached_tokens_by_the_tenant_records_weight(weight: float) -> None:
    lim = limiter(MemoryStore())
    acme = tenant_of(tpm=1000, tpm_cached_weight=weight)
    ctx = make_ctx(acme, body=chat(max_tokens=900))
    admission = await lim.admit(ctx)
    ctx.usage = Usage(prompt_tokens=900, cached_tokens=900, completion_tokens=0, reported=True)
    await lim.settle(ctx, admission)  # the window keeps 900 x weight tokens of this request
    nxt = make_ctx(acme, body=chat(max_tokens=900))
    if weight == 0.0:
        await lim.admit(nxt)
    else:
        with pytest.raises(GatewayError):
            await lim.admit(nxt)
