"""Every metric the gateway emits: OTel name, unit, buckets — one table the exporters and dashboards share.

Prometheus names follow from these (dots → underscores, unit `s` → `_seconds`, `usd` appended, `{…}`
dropped, counters get `_total`); `PROMETHEUS_NAMES` states the expected result and the tests hold the
exporter to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, Observation


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """Name, unit, description and (for histograms) bucket boundaries of one instrument."""

    name: str
    unit: str
    description: str
    buckets: tuple[float, ...] | None = None


# Bucket boundaries of the GenAI semantic conventions (v1.41).
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1 … 67108864
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
# The gateway's own time is sub-millisecond when healthy: resolve 50 µs steps there, coarser up to 1 s.
OVERHEAD_BUCKETS = (
    0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003,
    0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip

TENANT_COST = MetricSpec("gateway.tenant.cost", "usd", "USD charged to tenants at their pool's prices")
TENANT_SAVINGS = MetricSpec(
    "gateway.tenant.savings", "usd", "USD saved against the tenant's reference price (requests that saved)"
)
POOL_IDLE_COST = MetricSpec("gateway.pool.idle_cost", "usd", "Pool GPU USD not covered by charges (high-water)")
POOL_GPU_COST = MetricSpec("gateway.pool.gpu_cost", "usd", "Pool GPU USD since this gateway started")
TENANT_TOKENS = MetricSpec("gateway.tenant.tokens", "{token}", "Tokens by tenant, pool and type")
REQUESTS = MetricSpec("gateway.requests", "{request}", "Requests by tenant, pool, class and HTTP status")
RATE_LIMITED = MetricSpec("gateway.rate_limited", "{request}", "Requests over a limit, by limit and action")
ROUTE_DECISIONS = MetricSpec("gateway.route.decisions", "{decision}", "Routing decisions by pool and reason")
NORMALIZE_MOVED = MetricSpec("gateway.normalize.moved_spans", "{span}", "Volatile spans moved, by rule")
OVERHEAD = MetricSpec("gateway.overhead", "s", "Gateway time per request excluding upstream", OVERHEAD_BUCKETS)
TOKEN_USAGE = MetricSpec("gen_ai.client.token.usage", "{token}", "Tokens per upstream call", TOKEN_BUCKETS)
OPERATION_DURATION = MetricSpec(
    "gen_ai.client.operation.duration", "s", "Upstream call duration", DURATION_BUCKETS
)
TIME_TO_FIRST_TOKEN = MetricSpec("gen_ai.server.time_to_first_token", "s", "Time to first token", TTFT_BUCKETS)
TIME_PER_OUTPUT_TOKEN = MetricSpec(
    "gen_ai.server.time_per_output_token", "s", "Time per output token after the first", TPOT_BUCKETS
)

ALL_METRICS = (
    TENANT_COST, TENANT_SAVINGS, POOL_IDLE_COST, POOL_GPU_COST, TENANT_TOKENS, REQUESTS, RATE_LIMITED,
    ROUTE_DECISIONS, NORMALIZE_MOVED, OVERHEAD, TOKEN_USAGE, OPERATION_DURATION, TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
)  # fmt: skip

# The Prometheus family name of each metric (histograms expose _bucket/_sum/_count under it).
PROMETHEUS_NAMES = {
    TENANT_COST.name: "gateway_tenant_cost_usd_total",
    TENANT_SAVINGS.name: "gateway_tenant_savings_usd_total",
    POOL_IDLE_COST.name: "gateway_pool_idle_cost_usd_total",
    POOL_GPU_COST.name: "gateway_pool_gpu_cost_usd_total",
    TENANT_TOKENS.name: "gateway_tenant_tokens_total",
    REQUESTS.name: "gateway_requests_total",
    RATE_LIMITED.name: "gateway_rate_limited_total",
    ROUTE_DECISIONS.name: "gateway_route_decisions_total",
    NORMALIZE_MOVED.name: "gateway_normalize_moved_spans_total",
    OVERHEAD.name: "gateway_overhead_seconds",
    TOKEN_USAGE.name: "gen_ai_client_token_usage",
    OPERATION_DURATION.name: "gen_ai_client_operation_duration_seconds",
    TIME_TO_FIRST_TOKEN.name: "gen_ai_server_time_to_first_token_seconds",
    TIME_PER_OUTPUT_TOKEN.name: "gen_ai_server_time_per_output_token_seconds",
}

ObservableCallback = Callable[[CallbackOptions], Iterable[Observation]]


def _counter(meter: Meter, spec: MetricSpec) -> Counter:
    return meter.create_counter(spec.name, unit=spec.unit, description=spec.description)


def _histogram(meter: Meter, spec: MetricSpec) -> Histogram:
    return meter.create_histogram(
        spec.name,
        unit=spec.unit,
        description=spec.description,
        explicit_bucket_boundaries_advisory=list(spec.buckets or ()),
    )


class Instruments:
    """The instruments, created once per MeterProvider (never per request)."""

    def __init__(self, meter: Meter, idle_cost: ObservableCallback, gpu_cost: ObservableCallback) -> None:
        self.tenant_cost = _counter(meter, TENANT_COST)
        self.tenant_savings = _counter(meter, TENANT_SAVINGS)
        self.tenant_tokens = _counter(meter, TENANT_TOKENS)
        self.requests = _counter(meter, REQUESTS)
        self.rate_limited = _counter(meter, RATE_LIMITED)
        self.route_decisions = _counter(meter, ROUTE_DECISIONS)
        self.normalize_moved = _counter(meter, NORMALIZE_MOVED)
        self.overhead = _histogram(meter, OVERHEAD)
        self.token_usage = _histogram(meter, TOKEN_USAGE)
        self.operation_duration = _histogram(meter, OPERATION_DURATION)
        self.time_to_first_token = _histogram(meter, TIME_TO_FIRST_TOKEN)
        self.time_per_output_token = _histogram(meter, TIME_PER_OUTPUT_TOKEN)
        meter.create_observable_counter(
            POOL_IDLE_COST.name, callbacks=[idle_cost], unit=POOL_IDLE_COST.unit,
            description=POOL_IDLE_COST.description,
        )  # fmt: skip
        meter.create_observable_counter(
            POOL_GPU_COST.name, callbacks=[gpu_cost], unit=POOL_GPU_COST.unit,
            description=POOL_GPU_COST.description,
        )  # fmt: skip
