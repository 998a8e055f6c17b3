"""What a request costs on its pool, what it would have cost at the tenant's reference price, and idle GPU $.

Pure arithmetic plus one small stateful meter (IdleCostMeter). Prices are kept per token in USD so a request's
cost is three multiply-adds; the $/M figures of the config are divided once, at load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from app.config import PriceConfig, ReferencePrice
from app.context import Usage
from app.headers import COST_USD
from app.records import TokenPrices

_PER_M = 1_000_000.0
_SECONDS_PER_HOUR = 3600.0

COST_HEADER = COST_USD


def gpu_cost_per_s(price: PriceConfig) -> float | None:
    """The pool's GPU spend in USD per second, or None when only token prices are configured."""
    if price.gpu_hour_usd is None:
        return None
    return price.gpu_hour_usd * price.gpus / _SECONDS_PER_HOUR


def pool_prices(price: PriceConfig) -> TokenPrices:
    """Per-token prices of a pool: explicit $/M where given, else derived from GPU $/s ÷ capacity tokens/s.

    A derived price charges uncached input and output alike (the operator's capacity figure is one tokens/s
    number); a cached input token costs `cached_input_per_m` if given, else `cached_ratio` times the input price.
    """
    derived: float | None = None
    gpu_per_s = gpu_cost_per_s(price)
    if gpu_per_s is not None and price.capacity_tokens_per_s is not None:
        derived = gpu_per_s / price.capacity_tokens_per_s
    input_pt = price.input_per_m / _PER_M if price.input_per_m is not None else derived
    output_pt = price.output_per_m / _PER_M if price.output_per_m is not None else derived
    if input_pt is None or output_pt is None:
        # PriceConfig's validator rules this out; kept for callers that build the model unvalidated.
        raise ValueError("price needs input_per_m and output_per_m, or gpu_hour_usd and capacity_tokens_per_s")
    if price.cached_input_per_m is not None:
        cached_pt = price.cached_input_per_m / _PER_M
    else:
        cached_pt = price.cached_ratio * input_pt
    return TokenPrices(input_pt, cached_pt, output_pt)


def reference_prices(ref: ReferencePrice) -> TokenPrices:
    """Per-token prices of a tenant's reference (a hosted API's list price)."""
    return TokenPrices.per_million(ref.input_per_m, ref.cached_input_per_m, ref.output_per_m)


def request_cost(usage: Usage, prices: TokenPrices) -> float:
    """USD for one request: uncached input, cached input and output tokens at their prices."""
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return (
        usage.uncached_tokens * prices.input_per_token
        + cached * prices.cached_input_per_token
        + usage.completion_tokens * prices.output_per_token
    )


def request_savings(usage: Usage, prices: TokenPrices, reference: TokenPrices) -> float:
    """The same tokens at the reference price minus their cost here (negative when the pool is dearer)."""
    return request_cost(usage, reference) - request_cost(usage, prices)


def format_usd(usd: float) -> str:
    """A USD amount as the `x-kvgate-cost-usd` header shows it: fixed-point, 10 decimals (no exponent)."""
    return f"{usd:.10f}"


class IdleCostMeter:
    """A pool's idle GPU money: cumulative GPU $ since start minus cumulative $ charged to requests.

    Exposed as a monotone counter, so a read returns the larger of the current difference and the last
    value returned (never below 0). While charges keep below the GPU spend — every pool that is not run past
    its configured capacity — the counter's increase between two reads is exactly "GPU $ in between minus $
    charged in between". When charges outrun the GPU spend (more tokens/s than the configured capacity), the
    counter holds still and that surplus is paid back before idle grows again. Charges count as soon as they
    land: a request's tokens used GPU time before it settled.

    Several gateway replicas: each replica's meter counts the whole pool's GPU $ but only the charges that
    replica settled, so each replica's idle figure is too high and summing them counts the GPU N times.
    Fleet-wide idle is `max by (pool) (gateway_pool_gpu_cost_usd_total)` minus
    `sum by (pool) (gateway_tenant_cost_usd_total)` (increases of both over the same window), not a sum of
    this counter; with one replica both give the same answer.

    Thread-safe: charges come from the event loop, reads from the metric export thread.
    """

    def __init__(self, gpu_usd_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = gpu_usd_per_s
        self._clock = clock
        self._start = clock()
        self._charged = 0.0
        self._high = 0.0
        self._lock = threading.Lock()

    def charge(self, usd: float) -> None:
        """Account `usd` charged to a request this pool served."""
        if usd <= 0.0:
            return
        with self._lock:
            self._charged += usd

    def gpu_cost(self) -> float:
        """GPU $ spent since the meter started."""
        return max(self._clock() - self._start, 0.0) * self._rate

    def charged(self) -> float:
        """$ charged to requests since the meter started."""
        return self._charged

    def idle_cost(self) -> float:
        """Idle $ so far (monotone non-decreasing)."""
        with self._lock:
            diff = (self._clock() - self._start) * self._rate - self._charged
            if diff > self._high:
                self._high = diff
            return self._high
