"""Reading the price config: gateway-config shape, small shape, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.bench.pricing import PriceConfigError, load_pricing, pricing_from_mapping


def test_reads_pool_price_and_tenant_reference_from_a_gateway_config(tmp_path: Path) -> None:
    cfg = {
        "pools": {
            "fast": {"role": "interactive", "price": {"gpu_hour_usd": 2.5, "gpus": 1}},
            "bulk": {"role": "bulk", "price": {"gpu_hour_usd": 4.0, "gpus": 2}},
        },
        "tenants": [
            {"id": "acme", "reference_price": {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 4.0}},
            {"id": "beta", "reference_price": {"input_per_m": 2.0, "output_per_m": 8.0}},
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    first = load_pricing(path)
    assert (first.gpu_hour_usd, first.gpus, first.reference_output_per_m) == (2.5, 1, 4.0)
    chosen = load_pricing(path, pool="bulk", tenant="beta")
    assert (chosen.gpu_hour_usd, chosen.gpus) == (4.0, 2)
    assert (chosen.reference_input_per_m, chosen.reference_output_per_m) == (2.0, 8.0)
    assert chosen.reference_cached_input_per_m == 0.30  # the default where the tenant gives none


def test_reads_the_small_shape() -> None:
    p = pricing_from_mapping({"price": {"gpu_hour_usd": 1.2, "gpus": 8},
                              "reference_price": {"output_per_m": 10.0}})
    assert (p.gpu_hour_usd, p.gpus, p.reference_output_per_m) == (1.2, 8, 10.0)
    flat = pricing_from_mapping({"gpu_hour_usd": 2.0})
    assert flat.gpu_hour_usd == 2.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"pools": {"a": {"price": {"gpu_hour_usd": 1}}}, "x": 1}, None),
        ({"price": {"gpu_hour_usd": -1}}, "gpu_hour_usd"),
        ({"price": {"gpu_hour_usd": 1, "gpus": 0}}, "gpus"),
        ({"price": {"gpu_hour_usd": "cheap"}}, "gpu_hour_usd"),
    ],
)
def test_rejects_bad_numbers_with_their_key(raw: dict, message: str | None) -> None:
    if message is None:
        assert pricing_from_mapping(raw).gpu_hour_usd == 1
        return
    with pytest.raises(PriceConfigError, match=message):
        pricing_from_mapping(raw)


def test_unknown_pool_or_tenant_is_an_error() -> None:
    cfg = {"pools": {"a": {"price": {"gpu_hour_usd": 1}}}, "tenants": [{"id": "t"}]}
    with pytest.raises(PriceConfigError, match="no pool"):
        pricing_from_mapping(cfg, pool="b")
    with pytest.raises(PriceConfigError, match="no tenant"):
        pricing_from_mapping(cfg, tenant="u")


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PriceConfigError, match="cannot read"):
        load_pricing(tmp_path / "missing.yaml")
