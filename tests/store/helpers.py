"""Builders shared by the tenancy, limits, spend and admin tests."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from app.config import GatewayConfig, parse_config
from app.context import RequestContext, RouteDecision, Tenant, Usage
from app.store.memory import MemoryStore
from app.surfaces import CHAT
from app.tenancy import TenantRegistry

ACME_KEY = "sk-acme-dev"
BETA_KEY = "sk-beta-dev"
ADMIN_KEY = "sk-admin-dev"


def config(
    *, required: bool = True, acme_limits: dict[str, Any] | None = None, fail_mode: str = "open", **extra: Any
) -> GatewayConfig:
    """Two tenants (acme with a plaintext key, beta with a sha256 entry) and one admin key."""
    raw: dict[str, Any] = {
        "models": [{"name": "m", "pools": ["fast", "bulk"]}],
        "pools": {
            name: {
                "role": role,
                "served_model": "m",
                "replicas": ["http://127.0.0.1:9"],
                "price": {"input_per_m": 1.0, "output_per_m": 2.0},
            }
            for name, role in (("fast", "interactive"), ("bulk", "bulk"))
        },
        "tenants": [
            {"id": "acme", "api_keys": [ACME_KEY], "limits": acme_limits or {}, "default_class": "interactive"},
            {
                "id": "beta",
                "api_keys": ["sha256:" + hashlib.sha256(BETA_KEY.encode()).hexdigest()],
                "reference_price": {"input_per_m": 5.0, "cached_input_per_m": 0.5, "output_per_m": 20.0},
            },
        ],
        "auth": {"required": required, "admin_keys": [ADMIN_KEY]},
        "store": {"fail_mode": fail_mode},
        **extra,
    }
    return parse_config(raw)


def tenant_of(tenant_id: str = "acme", **acme_limits: Any) -> Tenant:
    """A tenant record as the tenancy stage builds it from `config(acme_limits=...)`: limits and prices resolved."""
    tenant = TenantRegistry(config(acme_limits=acme_limits), MemoryStore()).tenant(tenant_id)
    assert tenant is not None
    return tenant


def make_ctx(
    tenant: str | Tenant = "acme",
    body: dict[str, Any] | None = None,
    *,
    pool: str | None = "fast",
    usage: Usage | None = None,
    cost_usd: float = 0.0,
) -> RequestContext:
    """A request context as the api and tenancy stages leave it (plus settle-time fields); a tenant given by id
    has no limits and the default reference price (`tenant_of` builds one as tenancy does)."""
    body = body if body is not None else {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ctx = RequestContext(
        request_id=uuid.uuid4().hex,
        surface=CHAT,
        path="/v1/chat/completions",
        prompt=CHAT.view(body),
        body=body,
        model="m",
        stream=False,
        client_wants_usage=False,
        headers={},
    )
    ctx.tenant = Tenant(tenant) if isinstance(tenant, str) else tenant
    if pool is not None:
        ctx.route = RouteDecision(pool=pool, replica="http://127.0.0.1:9", policy="round_robin", reason="test")
    if usage is not None:
        ctx.usage = usage
    ctx.cost_usd = cost_usd
    return ctx
