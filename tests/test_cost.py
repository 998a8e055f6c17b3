"""Cost arithmetic: pool prices (explicit, derived, cached ratio), request cost, savings, idle meter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.config import PriceConfig, ReferencePrice
from app.context import Usage
from app.cost import (
    IdleCostMeter,
    TokenPrices,
    format_usd,
    gpu_cost_per_s,
    pool_prices,
    reference_prices,
    request_cost,
    request_savings,
)


class FakeClock:
    """A settable monotonic clock."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def test_explicit_prices_are_per_million_divided_per_token() -> None:
    prices = pool_prices(PriceConfig(input_per_m=2.0, cached_input_per_m=0.5, output_per_m=8.0))
    assert prices.input_per_token == pytest.approx(2.0 / 1e6)
    assert prices.cached_input_per_token == pytest.approx(0.5 / 1e6)
    assert prices.output_per_token == pytest.approx(8.0 / 1e6)


def test_explicit_prices_without_cached_price_use_cached_ratio() -> None:
    prices = pool_prices(PriceConfig(input_per_m=2.0, output_per_m=8.0, cached_ratio=0.25))
    assert prices.cached_input_per_token == pytest.approx(0.25 * 2.0 / 1e6)


def test_derived_prices_are_gpu_dollars_per_second_over_capacity() -> None:
    price = PriceConfig(gpu_hour_usd=2.5, gpus=2, capacity_tokens_per_s=1500)
    per_token = 2.5 * 2 / 3600 / 1500
    prices = pool_prices(price)
    assert prices.input_per_token == pytest.approx(per_token)
    assert prices.output_per_token == pytest.approx(per_token)
    assert prices.cached_input_per_token == pytest.approx(price.cached_ratio * per_token)


def test_derived_prices_honour_cached_ratio_and_explicit_overrides() -> None:
    per_token = 3.0 / 3600 / 1000
    ratio = pool_prices(PriceConfig(gpu_hour_usd=3.0, capacity_tokens_per_s=1000, cached_ratio=0.0))
    assert ratio.cached_input_per_token == 0.0
    mixed = pool_prices(
        PriceConfig(gpu_hour_usd=3.0, capacity_tokens_per_s=1000, input_per_m=1.0, cached_input_per_m=0.2)
    )
    assert mixed.input_per_token == pytest.approx(1.0 / 1e6)
    assert mixed.cached_input_per_token == pytest.approx(0.2 / 1e6)
    assert mixed.output_per_token == pytest.approx(per_token)


def test_gpu_cost_per_s_is_none_without_gpu_price() -> None:
    assert gpu_cost_per_s(PriceConfig(input_per_m=1.0, output_per_m=2.0)) is None
    assert gpu_cost_per_s(PriceConfig(input_per_m=1.0, output_per_m=2.0, gpu_hour_usd=3.6, gpus=4)) == (
        pytest.approx(3.6 * 4 / 3600)
    )


def test_request_cost_charges_uncached_cached_and_output_separately() -> None:
    prices = TokenPrices(input_per_token=3e-6, cached_input_per_token=0.3e-6, output_per_token=15e-6)
    usage = Usage(prompt_tokens=1000, completion_tokens=50, cached_tokens=640, reported=True)
    expected = (1000 - 640) * 3e-6 + 640 * 0.3e-6 + 50 * 15e-6
    assert request_cost(usage, prices) == pytest.approx(expected)


def test_request_cost_never_counts_more_cached_than_prompt_tokens() -> None:
    prices = TokenPrices(1e-6, 0.5e-6, 2e-6)
    usage = Usage(prompt_tokens=10, completion_tokens=0, cached_tokens=25)
    assert request_cost(usage, prices) == pytest.approx(10 * 0.5e-6)


def test_savings_are_reference_cost_minus_pool_cost_and_can_be_negative() -> None:
    ref = reference_prices(ReferencePrice(input_per_m=3.0, cached_input_per_m=0.3, output_per_m=15.0))
    cheap = pool_prices(PriceConfig(input_per_m=0.1, output_per_m=0.4))
    dear = pool_prices(PriceConfig(input_per_m=30.0, output_per_m=150.0))
    usage = Usage(prompt_tokens=2000, completion_tokens=100, cached_tokens=1500)
    ref_cost = 500 * 3.0 / 1e6 + 1500 * 0.3 / 1e6 + 100 * 15.0 / 1e6
    assert request_savings(usage, cheap, ref) == pytest.approx(ref_cost - request_cost(usage, cheap))
    assert request_savings(usage, dear, ref) < 0


def test_format_usd_has_no_exponent_for_tiny_amounts() -> None:
    text = format_usd(4.6e-8)
    assert "e" not in text.lower()
    assert float(text) == pytest.approx(4.6e-8, abs=1e-10)


def test_idle_meter_counts_gpu_dollars_minus_charges() -> None:
    clock = FakeClock()
    meter = IdleCostMeter(0.01, clock)
    clock.advance(100)
    meter.charge(0.3)
    clock.advance(50)
    assert meter.gpu_cost() == pytest.approx(150 * 0.01)
    assert meter.charged() == pytest.approx(0.3)
    assert meter.idle_cost() == pytest.approx(150 * 0.01 - 0.3)


def test_idle_meter_holds_steady_while_charges_exceed_gpu_spend() -> None:
    clock = FakeClock()
    meter = IdleCostMeter(0.01, clock)
    clock.advance(10)
    before = meter.idle_cost()
    meter.charge(0.5)  # far more than the 0.1 of GPU time so far: the pool ran over capacity
    clock.advance(10)
    assert meter.idle_cost() == pytest.approx(before)
    clock.advance(60)  # 0.8 GPU $ in total against 0.5 charged: past the earlier value again
    assert meter.idle_cost() == pytest.approx(0.8 - 0.5)


def test_idle_meter_counts_a_charge_as_soon_as_it_lands() -> None:
    clock = FakeClock()
    meter = IdleCostMeter(0.01, clock)
    clock.advance(100)
    meter.charge(0.25)
    assert meter.idle_cost() == pytest.approx(100 * 0.01 - 0.25)


def test_idle_meter_ignores_non_positive_charges() -> None:
    clock = FakeClock()
    meter = IdleCostMeter(1.0, clock)
    clock.advance(2)
    meter.charge(-5.0)
    meter.charge(0.0)
    assert meter.idle_cost() == pytest.approx(2.0)


@given(
    st.lists(
        st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 2, allow_nan=False)), min_size=1, max_size=40
    )
)
def test_idle_meter_is_monotone_and_equals_running_max_of_read_differences(
    steps: list[tuple[float, float]],
) -> None:
    rate = 0.01
    clock = FakeClock()
    meter = IdleCostMeter(rate, clock)
    elapsed, charged, high, last = 0.0, 0.0, 0.0, 0.0
    for dt, usd in steps:
        clock.advance(dt)
        elapsed += dt
        meter.charge(usd)
        charged += usd
        value = meter.idle_cost()
        high = max(high, elapsed * rate - charged)
        assert value >= last
        assert value >= 0.0
        assert value == pytest.approx(high, abs=1e-9)
        last = value
