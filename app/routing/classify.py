"""The classify stage (pure): is this request interactive or bulk, and which rule said so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.config import RoutingConfig
from app.config.types import ROUTE_CLASSES
from app.context import ClassDecision, RouteClass, Tenant
from app.errors import bad_request
from app.headers import CLASS as CLASS_HEADER

_CLASSES: dict[str, RouteClass] = {c: c for c in ROUTE_CLASSES}
# OpenAI's service_tier: "priority" buys low latency, "flex" trades latency for price. "auto"/"default"
# say nothing about latency, so they fall through to the next rule.
_SERVICE_TIERS: dict[str, RouteClass] = {"priority": "interactive", "flex": "bulk"}
# Nothing said anything: a chat call is someone waiting more often than not.
DEFAULT_CLASS: RouteClass = "interactive"
# Every decision there can be, built once (frozen, so shared): one per request costs a frozen dataclass's
# __init__, a field at a time through object.__setattr__.
_DECISIONS: dict[tuple[RouteClass, str], ClassDecision] = {
    (c, reason): ClassDecision(c, reason)
    for c in ROUTE_CLASSES
    for reason in ("degraded", "header", "service_tier", "tenant_default", "stream", "n", "max_tokens", "default")
}


def _int_field(body: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        # bool is an int subclass; a JSON `true` is not a count.
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def classify(
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    tenant: Tenant | None,
    cfg: RoutingConfig,
    *,
    degraded: bool = False,
    cap_fields: tuple[str, ...] = ("max_completion_tokens", "max_tokens", "max_output_tokens"),
) -> ClassDecision:
    """Decide the latency class: degraded by limits, header, service_tier, tenant default, shape, default.

    `headers` keys are lowercase (as ASGI delivers them). An unknown x-kvgate-class value is a client
    error (400) rather than silently ignored, since the client asked for something explicit.
    """
    if degraded:
        return _DECISIONS["bulk", "degraded"]
    raw = headers.get(CLASS_HEADER)
    if raw is not None:
        chosen = _CLASSES.get(raw.strip().lower())
        if chosen is None:
            raise bad_request(f"{CLASS_HEADER} must be 'interactive' or 'bulk'", param=CLASS_HEADER)
        return _DECISIONS[chosen, "header"]
    tier = body.get("service_tier")
    if isinstance(tier, str) and tier in _SERVICE_TIERS:
        return _DECISIONS[_SERVICE_TIERS[tier], "service_tier"]
    if tenant is not None and tenant.default_class is not None:
        return _DECISIONS[tenant.default_class, "tenant_default"]
    if body.get("stream") is True:
        return _DECISIONS["interactive", "stream"]
    n = _int_field(body, "n")
    if n is not None and n > 1:
        return _DECISIONS["bulk", "n"]
    max_tokens = _int_field(body, *cap_fields)  # the surface's own output-cap fields (Surface.output_cap_fields)
    if max_tokens is not None and max_tokens > cfg.bulk_max_tokens_threshold:
        return _DECISIONS["bulk", "max_tokens"]
    return _DECISIONS[DEFAULT_CLASS, "default"]
