from __future__ import annotations

from typing import Any

import pytest

from app.config import RoutingConfig
from app.context import ClassDecision, Tenant
from app.errors import GatewayError
from app.routing.classify import classify

CFG = RoutingConfig(bulk_max_tokens_threshold=1000)
BULK_TENANT = Tenant("t", default_class="bulk")
PLAIN_TENANT = Tenant("p")


@pytest.mark.parametrize(
    ("body", "headers", "tenant", "expected"),
    [
        # header beats everything below it
        ({"service_tier": "priority", "stream": True}, {"x-kvgate-class": "bulk"}, None, ("bulk", "header")),
        ({"service_tier": "flex"}, {"x-kvgate-class": " Interactive "}, BULK_TENANT, ("interactive", "header")),
        # service_tier beats the tenant default and the shape
        ({"service_tier": "priority", "n": 4}, {}, BULK_TENANT, ("interactive", "service_tier")),
        ({"service_tier": "flex", "stream": True}, {}, None, ("bulk", "service_tier")),
        # tiers that say nothing about latency fall through
        ({"service_tier": "auto", "stream": True}, {}, None, ("interactive", "stream")),
        ({"service_tier": "default"}, {}, BULK_TENANT, ("bulk", "tenant_default")),
        # tenant default beats the shape
        ({"stream": True}, {}, BULK_TENANT, ("bulk", "tenant_default")),
        # shape: stream, then n, then max_tokens
        ({"stream": True, "n": 3, "max_tokens": 5000}, {}, PLAIN_TENANT, ("interactive", "stream")),
        ({"n": 2, "max_tokens": 10}, {}, PLAIN_TENANT, ("bulk", "n")),
        ({"n": 1, "max_tokens": 1001}, {}, None, ("bulk", "max_tokens")),
        ({"max_completion_tokens": 4096}, {}, None, ("bulk", "max_tokens")),
        ({"max_tokens": 1000}, {}, None, ("interactive", "default")),
        ({"stream": False}, {}, None, ("interactive", "default")),
        ({}, {}, None, ("interactive", "default")),
    ],
)
def test_classify_precedence(
    body: dict[str, Any], headers: dict[str, str], tenant: Tenant | None, expected: tuple[str, str]
) -> None:
    decision = classify(body, headers, tenant, CFG)
    assert (decision.route_class, decision.reason) == expected


def test_degraded_by_limits_wins_over_header() -> None:
    decision = classify({"stream": True}, {"x-kvgate-class": "interactive"}, None, CFG, degraded=True)
    assert decision == ClassDecision("bulk", "degraded")


def test_unknown_class_header_is_a_400_naming_the_header() -> None:
    with pytest.raises(GatewayError) as info:
        classify({}, {"x-kvgate-class": "urgent"}, None, CFG)
    assert info.value.status == 400
    assert info.value.param == "x-kvgate-class"


def test_non_integer_counts_are_ignored() -> None:
    # `true` is not a count and a string is not a number: neither makes the request bulk.
    assert classify({"n": True, "max_tokens": "99999"}, {}, None, CFG).reason == "default"


def test_threshold_comes_from_config() -> None:
    low = RoutingConfig(bulk_max_tokens_threshold=10)
    assert classify({"max_tokens": 11}, {}, None, low).route_class == "bulk"
    assert classify({"max_tokens": 11}, {}, None, CFG).route_class == "interactive"
