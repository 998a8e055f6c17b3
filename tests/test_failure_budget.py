"""The failure budget: a token bucket of upstream failures per tenant and per client address."""

from __future__ import annotations

import orjson
import pytest

from app.config.failure_budget import FailureBudgetConfig
from app.errors import GatewayError
from app.failure_budget import MAX_BUCKETS, FailureBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def budget(**cfg: object) -> tuple[FailureBudget, Clock]:
    clock = Clock()
    return FailureBudget(FailureBudgetConfig.model_validate(cfg), clock), clock


def test_a_client_past_its_burst_is_refused_with_a_429_until_the_bucket_refills() -> None:
    b, clock = budget(client_burst=3, tenant_burst=100, refill_per_s=0.5)
    for _ in range(3):
        b.check("acme", "10.0.0.1")
        b.charge("acme", "10.0.0.1")
    with pytest.raises(GatewayError) as info:
        b.check("acme", "10.0.0.1")
    err = info.value
    assert err.status == 429 and err.code == "failure_budget_exceeded" and err.headers["Retry-After"] == "2"
    assert orjson.loads(err.body())["error"]["type"] == "rate_limit_exceeded"
    b.check("acme", "10.0.0.2")  # another client of the same tenant is not refused
    b.check("beta", "10.0.0.1")  # nor another tenant's behind the same address (a load balancer)
    clock.now += 2.0
    b.check("acme", "10.0.0.1")


def test_a_tenant_past_its_burst_is_refused_whichever_address_it_uses() -> None:
    b, _ = budget(client_burst=100, tenant_burst=4)
    for i in range(4):
        b.charge("acme", f"10.0.0.{i}")
    with pytest.raises(GatewayError):
        b.check("acme", "10.0.0.99")
    b.check("beta", "10.0.0.1")


def test_disabled_it_never_refuses() -> None:
    b, _ = budget(enabled=False, client_burst=1)
    for _ in range(5):
        b.charge("acme", "x")
    b.check("acme", "x")


def test_buckets_stay_bounded_under_a_flood_of_addresses() -> None:
    b, _ = budget(client_burst=1, tenant_burst=MAX_BUCKETS + 5)
    for i in range(MAX_BUCKETS + 10):
        b.charge("acme", f"c{i}")
    assert len(b._buckets) <= MAX_BUCKETS
    with pytest.raises(GatewayError):  # the tenant's own bucket survives the flood
        b.check("acme", "a-new-address")
