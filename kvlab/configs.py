"""Gateway configs for tests and experiments: one public model over named pools, as raw mappings (what a YAML file
holds; app.config.parse_config validates them, `kvgate serve --config` reads them dumped)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# A price every pool needs; its value matters only to tests of cost.
PRICE = {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0}


def gateway_config(
    pools: Mapping[str, Mapping[str, Any]],
    *,
    model: str = "m",
    served_model: str | None = None,
    tenants: Iterable[Mapping[str, Any]] = (),
    price: Mapping[str, Any] = PRICE,
    **sections: Any,
) -> dict[str, Any]:
    """`model` over `pools` (name → role, replicas, policy, …; `served_model` defaults to the model, `price` to
    `price`), `tenants` (auth required when there are any), and any other top-level sections as given."""
    full = {name: {"served_model": served_model or model, "price": dict(price), **p} for name, p in pools.items()}
    tenant_list = [dict(t) for t in tenants]
    return {
        "models": [{"name": model, "pools": list(pools)}],
        "pools": full,
        "tenants": tenant_list,
        "auth": {"required": bool(tenant_list)},
        **sections,
    }
