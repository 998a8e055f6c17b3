"""The settle stage prices a finished request from the tenant record tenancy built, and settles it once."""

from __future__ import annotations

import dataclasses

from app.context import Usage
from app.cost import pool_prices, reference_prices, request_cost, request_savings
from app.limits import Limiter
from app.records import TokenPrices
from app.settle import Settler
from app.store.memory import MemoryStore
from app.telemetry import Telemetry
from tests.store.helpers import config, make_ctx, tenant_of


def settler() -> Settler:
    cfg = config()
    return Settler(cfg, Limiter(MemoryStore(), "open"), Telemetry(cfg.telemetry, cfg.pools))


async def test_savings_are_measured_against_the_reference_price_of_the_tenant_record() -> None:
    cfg = config()
    beta = tenant_of("beta")  # reference 5 / 0.5 / 20 $ per M
    usage = Usage(prompt_tokens=1000, completion_tokens=100, cached_tokens=600, reported=True)
    ctx = make_ctx(beta, pool="fast", usage=usage)
    await settler().settle(ctx)
    pool = pool_prices(cfg.pools["fast"].price)
    assert ctx.cost_usd == request_cost(usage, pool)
    expected = request_savings(usage, pool, reference_prices(cfg.tenants[1].reference_price))
    assert ctx.savings_usd == expected and expected > 0


async def test_settle_reads_the_price_from_the_record_and_looks_the_tenant_up_nowhere() -> None:
    # The same tenant id with another price on its record: the record decides, so no per-request lookup remains.
    usage = Usage(prompt_tokens=1000, completion_tokens=100, reported=True)
    dear = dataclasses.replace(tenant_of("beta"), reference_prices=TokenPrices(1e-3, 1e-3, 1e-3))
    as_configured, repriced = make_ctx(tenant_of("beta"), usage=usage), make_ctx(dear, usage=usage)
    stage = settler()
    await stage.settle(as_configured)
    await stage.settle(repriced)
    assert repriced.savings_usd == request_savings(usage, pool_prices(config().pools["fast"].price),
                                                   TokenPrices(1e-3, 1e-3, 1e-3))
    assert repriced.savings_usd > as_configured.savings_usd


async def test_settle_prices_a_request_once_however_often_it_is_entered() -> None:
    usage = Usage(prompt_tokens=10, completion_tokens=5, reported=True)
    ctx = make_ctx(tenant_of("beta"), usage=usage)
    stage = settler()
    await stage.settle(ctx)
    first = ctx.cost_usd
    ctx.usage = Usage(prompt_tokens=10_000, completion_tokens=5_000, reported=True)
    await stage.cancelled(ctx)
    assert ctx.settled and ctx.cost_usd == first and ctx.status != 499
