"""Prices for the bench: read from a gateway-config-shaped YAML or flags; the dollar arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.bench.spec import Pricing


class PriceConfigError(ValueError):
    """The price config cannot be read."""


def _num(node: dict[str, Any], key: str, where: str) -> float | None:
    value = node.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise PriceConfigError(f"{where}.{key}: must be a non-negative number")
    return float(value)


def pricing_from_mapping(raw: dict[str, Any], pool: str | None = None, tenant: str | None = None) -> Pricing:
    """Pricing from a full gateway config (pools.<pool>.price, tenants[].reference_price) or a small file
    with top-level `price:` and `reference_price:` (or just the price keys)."""
    where = "price"
    if isinstance(raw.get("pools"), dict) and raw["pools"]:
        pools: dict[str, Any] = raw["pools"]
        name = pool or next(iter(pools))
        if name not in pools:
            raise PriceConfigError(f"pools: no pool {name!r} (have {', '.join(pools)})")
        price = (pools[name] or {}).get("price") or {}
        where = f"pools.{name}.price"
    else:
        price = raw.get("price", raw)
    reference: dict[str, Any] = raw.get("reference_price") or {}
    tenants = raw.get("tenants")
    if isinstance(tenants, list) and tenants:
        chosen = next((t for t in tenants if isinstance(t, dict) and t.get("id") == tenant), None) \
            if tenant else tenants[0]
        if chosen is None:
            raise PriceConfigError(f"tenants: no tenant {tenant!r}")
        reference = chosen.get("reference_price") or reference
    if not isinstance(price, dict) or not isinstance(reference, dict):
        raise PriceConfigError("price and reference_price must be mappings")
    defaults = Pricing()
    gpus = price.get("gpus", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise PriceConfigError(f"{where}.gpus: must be a positive integer")
    ref_in = _num(reference, "input_per_m", "reference_price")
    ref_cached = _num(reference, "cached_input_per_m", "reference_price")
    ref_out = _num(reference, "output_per_m", "reference_price")
    return Pricing(
        gpu_hour_usd=_num(price, "gpu_hour_usd", where),
        gpus=gpus,
        input_per_m=_num(price, "input_per_m", where),
        cached_input_per_m=_num(price, "cached_input_per_m", where),
        output_per_m=_num(price, "output_per_m", where),
        reference_input_per_m=defaults.reference_input_per_m if ref_in is None else ref_in,
        reference_cached_input_per_m=defaults.reference_cached_input_per_m if ref_cached is None else ref_cached,
        reference_output_per_m=defaults.reference_output_per_m if ref_out is None else ref_out,
    )


def load_pricing(path: str | Path, pool: str | None = None, tenant: str | None = None) -> Pricing:
    """Read a price config YAML file."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as err:
        raise PriceConfigError(f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise PriceConfigError(f"{path}: invalid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise PriceConfigError(f"{path}: top level must be a mapping")
    return pricing_from_mapping(raw, pool, tenant)


@dataclass(frozen=True, slots=True)
class CostSummary:
    """What the run's tokens cost self-hosted and at the reference price."""

    run_cost_usd: float | None
    usd_per_m_output: float | None
    usd_per_m_total: float | None
    reference_cost_usd: float
    savings_usd: float | None
    savings_ratio: float | None


def usd_per_m(gpu_hour_usd: float, gpus: int, tokens_per_s: float) -> float | None:
    """The operator's reckoning: GPU $/h ÷ measured tokens/s, per million tokens."""
    if tokens_per_s <= 0:
        return None
    return gpu_hour_usd * gpus / (3600.0 * tokens_per_s) * 1e6


def cost_summary(p: Pricing, wall_s: float, uncached: int, cached: int, output: int) -> CostSummary:
    """Self-hosted cost of the run (GPU time, else explicit token prices) against the reference price."""
    reference = (uncached * p.reference_input_per_m + cached * p.reference_cached_input_per_m
                 + output * p.reference_output_per_m) / 1e6
    run_cost: float | None = None
    if p.gpu_hour_usd is not None:
        run_cost = p.gpu_hour_usd * p.gpus * wall_s / 3600.0
    elif p.input_per_m is not None and p.output_per_m is not None:
        cached_price = p.cached_input_per_m if p.cached_input_per_m is not None else p.input_per_m
        run_cost = (uncached * p.input_per_m + cached * cached_price + output * p.output_per_m) / 1e6
    total = uncached + cached + output
    per_out = run_cost / output * 1e6 if run_cost is not None and output else None
    per_total = run_cost / total * 1e6 if run_cost is not None and total else None
    savings = reference - run_cost if run_cost is not None else None
    ratio = savings / reference if savings is not None and reference > 0 else None
    return CostSummary(run_cost, per_out, per_total, reference, savings, ratio)
