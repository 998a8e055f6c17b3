"""Every metric the gateway emits: OTel name, unit, labels, buckets — one table exporters and dashboards share.

Prometheus names follow from these (dots → underscores, unit `s` → `_seconds`, `usd` appended, `{…}`
dropped, counters get `_total`); `PROMETHEUS_NAMES` states the expected result and the tests hold the
exporter to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from app.telemetry.aggregate import MetricSpec, MetricStore, Observe

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

# Bucket boundaries of the GenAI semantic conventions (v1.41).
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1 … 67108864
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
# The gateway's own time is sub-millisecond when healthy: resolve 50 µs steps there, coarser up to 1 s.
OVERHEAD_BUCKETS = (
    0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003,
    0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)

# Admission waits: none below saturation, up to a bulk deadline (30 s by default) when saturated.
QUEUE_WAIT_BUCKETS = (0.0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

_GENAI = ("gen_ai.operation.name", "gen_ai.request.model")

TENANT_COST = MetricSpec(
    "gateway.tenant.cost", "usd", "USD charged to tenants at their pool's prices", ("tenant", "pool")
)
TENANT_SAVINGS = MetricSpec(
    "gateway.tenant.savings", "usd", "USD saved against the tenant's reference price (requests that saved)",
    ("tenant", "pool"),
)
POOL_IDLE_COST = MetricSpec(
    "gateway.pool.idle_cost", "usd", "Pool GPU USD not covered by charges (monotone)", ("pool",)
)
POOL_GPU_COST = MetricSpec("gateway.pool.gpu_cost", "usd", "Pool GPU USD since this gateway started", ("pool",))
TENANT_TOKENS = MetricSpec(
    "gateway.tenant.tokens", "{token}", "Tokens by tenant, pool and type (uncached/cached/output)",
    ("tenant", "pool", "type"),
)
REQUESTS = MetricSpec(
    "gateway.requests", "{request}", "Requests by tenant, pool, class, HTTP status and API surface",
    ("tenant", "pool", "class", "status", "api"),
)
RATE_LIMITED = MetricSpec(
    "gateway.rate_limited", "{request}", "Requests over a limit, by limit and action", ("tenant", "limit", "action")
)
ROUTE_DECISIONS = MetricSpec(
    "gateway.route.decisions", "{decision}", "Routing decisions by pool, class, policy and reason",
    ("pool", "class", "policy", "reason"),
)
NORMALIZE_MOVED = MetricSpec(
    "gateway.normalize.moved_spans", "{span}", "Volatile spans moved to the tail, by rule", ("rule", "tenant")
)
MIGRATIONS = MetricSpec(
    "gateway.stream.migrations", "{stream}",
    "Streams whose replica failed midway, by outcome (migrated, or why not: n, logprobs, tool_call, …)",
    ("pool", "outcome"),
)
OVERHEAD = MetricSpec(
    "gateway.overhead", "s", "Gateway time per request excluding upstream time", ("pool", "stream"),
    OVERHEAD_BUCKETS,
)
QUEUE_WAIT = MetricSpec(
    "gateway.queue.wait", "s", "Time a request waited in its pool's admission queue (0: started at once)",
    ("pool", "tenant", "class"), QUEUE_WAIT_BUCKETS,
)
QUEUE_TOKENS = MetricSpec(
    "gateway.queue.tokens", "{token}",
    "Tokens (uncached prompt + output) of requests admitted through a pool's admission queue, by tenant: "
    "the currency of its fair share", ("pool", "tenant"),
)
TOKEN_USAGE = MetricSpec(
    "gen_ai.client.token.usage", "{token}", "Tokens per upstream call",
    ("gen_ai.token.type", *_GENAI, "gen_ai.provider.name", "kvgate.pool", "kvgate.tenant"), TOKEN_BUCKETS,
)
OPERATION_DURATION = MetricSpec(
    "gen_ai.client.operation.duration", "s", "Upstream call duration",
    (*_GENAI, "gen_ai.provider.name", "error.type", "kvgate.pool", "kvgate.class"), DURATION_BUCKETS,
)
TIME_TO_FIRST_TOKEN = MetricSpec(
    "gen_ai.server.time_to_first_token", "s", "Time to first token (streams)",
    (*_GENAI, "kvgate.pool", "kvgate.class"), TTFT_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = MetricSpec(
    "gen_ai.server.time_per_output_token", "s", "Time per output token after the first (streams)",
    (*_GENAI, "kvgate.pool", "kvgate.class"), TPOT_BUCKETS,
)

# Only seen with an admission queue enabled on some pool (pools.<p>.admission).
QUEUE_METRICS = (QUEUE_WAIT, QUEUE_TOKENS)

ALL_METRICS = (
    TENANT_COST, TENANT_SAVINGS, POOL_IDLE_COST, POOL_GPU_COST, TENANT_TOKENS, REQUESTS, RATE_LIMITED,
    ROUTE_DECISIONS, NORMALIZE_MOVED, MIGRATIONS, OVERHEAD, QUEUE_WAIT, QUEUE_TOKENS, TOKEN_USAGE, OPERATION_DURATION,
    TIME_TO_FIRST_TOKEN, TIME_PER_OUTPUT_TOKEN,
)

# Instruments the components owning the state register on the OTel meter themselves (observed at each
# collection, or the pre-warmer's own counters), and their kind: the dashboards query them too. Unit "1" is
# avoided on gauges: the collector appends `_ratio` to those and the SDK's exporter does not.
KV_EVENTS_RECEIVED = MetricSpec(
    "gateway.kv_events.received", "{event}", "KV-cache events applied to the index, per replica", ("replica",)
)
KV_EVENTS_GAPS = MetricSpec(
    "gateway.kv_events.gaps", "{gap}", "Sequence gaps seen in a replica's event stream", ("replica",)
)
KV_EVENTS_REPLAYS = MetricSpec(
    "gateway.kv_events.replays", "{replay}", "Catch-ups from a replica's replay endpoint", ("replica",)
)
KV_EVENTS_LAG = MetricSpec("gateway.kv_events.lag", "s", "Age of the newest event batch when it arrived", ("replica",))
KV_EVENTS_WHOLE = MetricSpec(
    "gateway.kv_events.whole", "", "1 while a replica's event view is complete (else kv_events falls back for it)",
    ("replica",),
)
KV_EVENTS_INDEX_BLOCKS = MetricSpec("gateway.kv_events.index_blocks", "{block}", "Blocks in the gateway's KV index")
KV_EVENTS_FALLBACKS = MetricSpec(
    "gateway.kv_events.fallbacks", "{pick}", "kv_events picks that fell back to prefix affinity"
)
TPOT_DECISIONS = MetricSpec(
    "gateway.tpot.decisions", "{request}",
    "Interactive requests whose pool the predicted TPOT chose, by pool chosen, kind and outcome",
    ("pool", "kind", "outcome"),
)
TPOT_PREDICTED = MetricSpec(
    "gateway.tpot.predicted", "s", "Predicted TPOT summed over the requests the prediction routed", ("pool",)
)
TPOT_OBSERVED = MetricSpec(
    "gateway.tpot.observed", "s", "Observed TPOT summed over the requests the prediction routed", ("pool",)
)
TPOT_COMPARED = MetricSpec(
    "gateway.tpot.compared", "{request}", "Requests whose predicted and observed TPOT were compared", ("pool",)
)
# No unit "1" on the ratios: the collector would append _ratio and the SDK's exporter not; named with it.
TPOT_ERROR = MetricSpec(
    "gateway.tpot.error_ratio", "", "Median |predicted - observed| / observed TPOT, last 256 requests", ("pool",)
)
SPEC_ACCEPTANCE = MetricSpec(
    "gateway.spec.acceptance_ratio", "", "Accepted / proposed draft tokens per speculative pool", ("pool",)
)
SPEC_TOKENS_PER_STEP = MetricSpec(
    "gateway.spec.tokens_per_step", "{token}",
    "Expected tokens per decode step on a speculative pool: the pool's (tenant empty) and per tenant and kind",
    ("pool", "tenant", "kind"),
)
KV_EVENTS_BATCHES = MetricSpec(
    "gateway.kv_events.batches", "{batch}", "Event batches received from a replica's stream", ("replica",)
)
KV_EVENTS_STREAM_ISSUES = MetricSpec(
    "gateway.kv_events.stream_issues", "{issue}",
    "A replica's event stream trouble by kind: duplicate, decode_error, skipped_event, restart, replay_failure, "
    "unrecoverable", ("replica", "kind"),
)
KV_EVENTS_MAX_LAG = MetricSpec(
    "gateway.kv_events.max_lag", "s", "Largest age of an event batch on arrival since start", ("replica",)
)
DISCOVERY_REPLICAS = MetricSpec(
    "gateway.discovery.replicas", "{replica}", "Replicas the pool's discovery source lists now", ("pool",)
)
DISCOVERY_ERRORS = MetricSpec(
    "gateway.discovery.errors", "{read}", "Discovery reads that failed (the pool kept its replicas)", ("pool",)
)
DISCOVERY_CHANGES = MetricSpec(
    "gateway.discovery.changes", "{change}", "Times discovery changed the pool's replica set", ("pool",)
)
PREWARM_REQUESTS = MetricSpec("gateway.prewarm.requests", "{request}", "Replays by outcome", ("pool", "outcome"))
PREWARM_RUNS = MetricSpec("gateway.prewarm.runs", "{run}", "Pre-warms of joining replicas", ("pool", "result"))
# The SDK's default bucket boundaries (its meter, not the MetricStore): the kind below says histogram.
PREWARM_DURATION = MetricSpec("gateway.prewarm.duration", "s", "Time a replica was held", ("pool", "result"))
PREWARM_TOKENS = MetricSpec(
    "gateway.prewarm.tokens", "{token}", "Replayed prompt tokens by type", ("pool", "type")
)
REPLICAS = MetricSpec(
    "gateway.pool.replicas", "{replica}",
    "Replicas of the pool by state in this process: serving, warming, breaker_open, breaker_half_open, "
    "unhealthy, joining", ("pool", "state"),
)
ENGINE_SPECULATIVE = MetricSpec(
    "gateway.engine.speculative", "",
    "1 while the replica publishes vllm:spec_decode_* series (it speculates), 0 when it publishes none",
    ("pool", "replica"),
)
ENGINE_CONFIG_MISMATCHES = MetricSpec(
    "gateway.engine.config_mismatches", "{replica}",
    "Replicas that publish a value the config contradicts (the config's stays in force), by pool and key: "
    "block_size, hash_algo, max_num_seqs, speculative",
    ("pool", "key"),
)
PEER_LOAD_PROCESSES = MetricSpec(
    "gateway.peer_load.processes", "{process}", "Gateway processes in the last load snapshot (this one included)"
)
PEER_LOAD_IN_FORCE = MetricSpec(
    "gateway.peer_load.in_force", "", "1 while a load snapshot shared with other processes decides, else 0"
)
PEER_LOAD_EXCHANGES = MetricSpec(
    "gateway.peer_load.exchanges", "{exchange}",
    "Load exchanges by outcome: shared, alone, late (after the snapshot's instant), store_unavailable, failed",
    ("outcome",),
)
PEER_LOAD_CLOCK_OFFSET = MetricSpec(
    "gateway.peer_load.clock_offset", "s",
    "The store's clock minus this host's, as this process estimates it from its exchanges (0 until the first)",
)

# (spec, kind): kind is counter | gauge | histogram, as the Prometheus exporters type the family.
METER_METRICS = (
    (KV_EVENTS_RECEIVED, "counter"), (KV_EVENTS_GAPS, "counter"), (KV_EVENTS_REPLAYS, "counter"),
    (KV_EVENTS_LAG, "gauge"), (KV_EVENTS_WHOLE, "gauge"), (KV_EVENTS_INDEX_BLOCKS, "gauge"),
    (KV_EVENTS_FALLBACKS, "counter"), (KV_EVENTS_BATCHES, "counter"), (KV_EVENTS_STREAM_ISSUES, "counter"),
    (KV_EVENTS_MAX_LAG, "gauge"), (TPOT_DECISIONS, "counter"), (TPOT_PREDICTED, "counter"),
    (TPOT_OBSERVED, "counter"), (TPOT_COMPARED, "counter"), (TPOT_ERROR, "gauge"), (SPEC_ACCEPTANCE, "gauge"),
    (SPEC_TOKENS_PER_STEP, "gauge"), (DISCOVERY_REPLICAS, "gauge"), (DISCOVERY_ERRORS, "counter"),
    (DISCOVERY_CHANGES, "counter"), (PREWARM_REQUESTS, "counter"), (PREWARM_RUNS, "counter"),
    (PREWARM_DURATION, "histogram"), (PREWARM_TOKENS, "counter"), (REPLICAS, "gauge"),
    (PEER_LOAD_PROCESSES, "gauge"), (PEER_LOAD_IN_FORCE, "gauge"), (PEER_LOAD_EXCHANGES, "counter"),
    (PEER_LOAD_CLOCK_OFFSET, "gauge"), (ENGINE_SPECULATIVE, "gauge"), (ENGINE_CONFIG_MISMATCHES, "counter"),
)
_METER_KINDS = {spec.name: kind for spec, kind in METER_METRICS}


def observe(meter: Meter, spec: MetricSpec, callback: Callable[[CallbackOptions], Iterable[Observation]]) -> None:
    """Register `spec` on the meter as the observable instrument of the kind METER_METRICS gives it."""
    kind = _METER_KINDS[spec.name]
    create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
    create(spec.name, [callback], spec.unit, spec.description)


def instrument(meter: Meter, spec: MetricSpec) -> Any:
    """`spec` on the meter as the synchronous counter or histogram METER_METRICS says it is."""
    kind = _METER_KINDS[spec.name]
    create = meter.create_histogram if kind == "histogram" else meter.create_counter
    return create(spec.name, spec.unit, spec.description)

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
    MIGRATIONS.name: "gateway_stream_migrations_total",
    OVERHEAD.name: "gateway_overhead_seconds",
    QUEUE_WAIT.name: "gateway_queue_wait_seconds",
    QUEUE_TOKENS.name: "gateway_queue_tokens_total",
    TOKEN_USAGE.name: "gen_ai_client_token_usage",
    OPERATION_DURATION.name: "gen_ai_client_operation_duration_seconds",
    TIME_TO_FIRST_TOKEN.name: "gen_ai_server_time_to_first_token_seconds",
    TIME_PER_OUTPUT_TOKEN.name: "gen_ai_server_time_per_output_token_seconds",
    KV_EVENTS_RECEIVED.name: "gateway_kv_events_received_total",
    KV_EVENTS_GAPS.name: "gateway_kv_events_gaps_total",
    KV_EVENTS_REPLAYS.name: "gateway_kv_events_replays_total",
    KV_EVENTS_LAG.name: "gateway_kv_events_lag_seconds",
    KV_EVENTS_WHOLE.name: "gateway_kv_events_whole",
    KV_EVENTS_INDEX_BLOCKS.name: "gateway_kv_events_index_blocks",
    KV_EVENTS_FALLBACKS.name: "gateway_kv_events_fallbacks_total",
    KV_EVENTS_BATCHES.name: "gateway_kv_events_batches_total",
    KV_EVENTS_STREAM_ISSUES.name: "gateway_kv_events_stream_issues_total",
    KV_EVENTS_MAX_LAG.name: "gateway_kv_events_max_lag_seconds",
    TPOT_DECISIONS.name: "gateway_tpot_decisions_total",
    TPOT_PREDICTED.name: "gateway_tpot_predicted_seconds_total",
    TPOT_OBSERVED.name: "gateway_tpot_observed_seconds_total",
    TPOT_COMPARED.name: "gateway_tpot_compared_total",
    TPOT_ERROR.name: "gateway_tpot_error_ratio",
    SPEC_ACCEPTANCE.name: "gateway_spec_acceptance_ratio",
    SPEC_TOKENS_PER_STEP.name: "gateway_spec_tokens_per_step",
    DISCOVERY_REPLICAS.name: "gateway_discovery_replicas",
    DISCOVERY_ERRORS.name: "gateway_discovery_errors_total",
    DISCOVERY_CHANGES.name: "gateway_discovery_changes_total",
    PREWARM_REQUESTS.name: "gateway_prewarm_requests_total",
    PREWARM_RUNS.name: "gateway_prewarm_runs_total",
    PREWARM_DURATION.name: "gateway_prewarm_duration_seconds",
    PREWARM_TOKENS.name: "gateway_prewarm_tokens_total",
    REPLICAS.name: "gateway_pool_replicas",
    ENGINE_SPECULATIVE.name: "gateway_engine_speculative",
    ENGINE_CONFIG_MISMATCHES.name: "gateway_engine_config_mismatches_total",
    PEER_LOAD_PROCESSES.name: "gateway_peer_load_processes",
    PEER_LOAD_IN_FORCE.name: "gateway_peer_load_in_force",
    PEER_LOAD_EXCHANGES.name: "gateway_peer_load_exchanges_total",
    PEER_LOAD_CLOCK_OFFSET.name: "gateway_peer_load_clock_offset_seconds",
}


class Instruments:
    """The metrics, registered once in a store (never per request); label values go in spec order."""

    def __init__(self, store: MetricStore, idle_cost: Observe, gpu_cost: Observe) -> None:
        self.tenant_cost = store.counter(TENANT_COST)
        self.tenant_savings = store.counter(TENANT_SAVINGS)
        self.tenant_tokens = store.counter(TENANT_TOKENS)
        self.requests = store.counter(REQUESTS)
        self.rate_limited = store.counter(RATE_LIMITED)
        self.route_decisions = store.counter(ROUTE_DECISIONS)
        self.normalize_moved = store.counter(NORMALIZE_MOVED)
        self.migrations = store.counter(MIGRATIONS)
        self.overhead = store.histogram(OVERHEAD)
        self.queue_wait = store.histogram(QUEUE_WAIT)
        self.queue_tokens = store.counter(QUEUE_TOKENS)
        self.token_usage = store.histogram(TOKEN_USAGE)
        self.operation_duration = store.histogram(OPERATION_DURATION)
        self.time_to_first_token = store.histogram(TIME_TO_FIRST_TOKEN)
        self.time_per_output_token = store.histogram(TIME_PER_OUTPUT_TOKEN)
        store.observed_counter(POOL_IDLE_COST, idle_cost)
        store.observed_counter(POOL_GPU_COST, gpu_cost)
