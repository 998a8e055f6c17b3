"""Write kvgate's Grafana dashboards (grafana/dashboards/*.json) from the panel lists below.

The JSON is generated so that layout, datasource references and template-variable filters stay uniform
across ~50 panels; tests/deploy/ checks the committed JSON is this script's output and evaluates every
query against a real Prometheus.   Run:  python grafana/build_dashboards.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "kvgate-prometheus"}
OUT_DIR = Path(__file__).resolve().parent / "dashboards"
SCHEMA_VERSION = 39

# Label selectors shared by the queries. The gateway's own counters label tenant/pool; the GenAI
# histograms carry them as kvgate_pool/kvgate_class; vLLM series get `pool` from the
# Prometheus scrape config (config/prometheus.yml).
T = 'tenant=~"$tenant"'
P = 'pool=~"$pool"'
TP = f"{T}, {P}"
# The GenAI latency histograms carry pool and class but not tenant (bounded cardinality).
GENAI = 'kvgate_pool=~"$pool"'
RI = "$__rate_interval"


def gpu_cost(fn: str, window: str) -> str:
    """A pool's GPU USD over `window` (`fn`: increase or rate). Every gateway process counts the whole pool's
    GPU spend since it started, so the fleet's is the max over processes, never their sum."""
    return f"max by (pool) ({fn}(gateway_pool_gpu_cost_usd_total{{{P}}}[{window}]))"


def idle_cost(fn: str, window: str) -> str:
    """A pool's GPU USD not charged to any tenant over `window`: its GPU cost minus the charges of every process.

    Not a sum of gateway_pool_idle_cost_usd_total: each process's counter is the whole pool's GPU spend minus
    only its own charges (app/cost.py, IdleCostMeter). A pool nobody was charged on is wholly idle (`or … * 0`).
    """
    gpu = gpu_cost(fn, window)
    charged = f"sum by (pool) ({fn}(gateway_tenant_cost_usd_total{{{P}}}[{window}]))"
    return f"clamp_min({gpu} - ({charged} or {gpu} * 0), 0)"


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A panel: its kind, queries, unit and width (24 = full row)."""

    title: str
    kind: str  # timeseries | stat | bargauge
    targets: tuple[Target, ...]
    unit: str = "short"
    width: int = 12
    height: int = 8
    description: str = ""
    stack: bool = False
    decimals: int | None = None
    overrides: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Row:
    """A titled row of panels, laid out left to right and wrapped at 24 columns."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A query template variable (multi-select, All = `.*`)."""

    name: str
    label: str
    query: str


@dataclass(frozen=True)
class Dashboard:
    """A whole dashboard."""

    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    links: tuple[dict[str, Any], ...] = field(default_factory=tuple)


def q(level: float, metric: str, selector: str, by: str) -> str:
    """histogram_quantile over a `_bucket` series, grouped by `by` (plus le)."""
    return f"histogram_quantile({level}, sum by (le, {by}) (rate({metric}{{{selector}}}[{RI}])))"


def p50_p99(metric: str, selector: str, by: str) -> tuple[Target, Target]:
    """The p50 and p99 targets of one histogram, one line per `by` value."""
    legend = "{{" + by + "}}"
    return (
        Target(q(0.5, metric, selector, by), f"p50 {legend}"),
        Target(q(0.99, metric, selector, by), f"p99 {legend}"),
    )


def ratio(num: str, den: str, by: str) -> str:
    """sum by (by) of rate(num) / the same of rate(den)."""
    return f"sum by ({by}) (rate({num}[{RI}])) / sum by ({by}) (rate({den}[{RI}]))"


def _target_json(t: Target, ref: str, instant: bool) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "refId": ref,
        "expr": t.expr,
        "legendFormat": t.legend or "__auto",
        "range": not instant,
        "instant": instant,
        "editorMode": "code",
    }


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    instant = p.kind in ("stat", "bargauge")
    defaults: dict[str, Any] = {"unit": p.unit, "color": {"mode": "palette-classic"}}
    if p.decimals is not None:
        defaults["decimals"] = p.decimals
    options: dict[str, Any]
    if p.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if p.stack else 0,
            "showPoints": "never",
            "spanNulls": True,
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
        }
        options = {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif p.kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        }
    elif p.kind == "bargauge":
        defaults["color"] = {"mode": "continuous-GrYlRd"}
        defaults["min"] = 0
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
        }
    else:
        raise ValueError(f"unknown panel kind {p.kind!r}")
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": list(p.overrides)},
        "options": options,
        "targets": [_target_json(t, chr(ord("A") + i), instant) for i, t in enumerate(p.targets)],
    }


def _variable_json(v: Variable) -> dict[str, Any]:
    return {
        "name": v.name,
        "label": v.label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": v.query,
        "query": {"query": v.query, "refId": f"{v.name}-variable"},
        "refresh": 2,  # on time-range change: new tenants appear without a reload
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "regex": "",
        "skipUrlSync": False,
    }


def render(d: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana JSON (schemaVersion 39)."""
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in d.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x, line_h = pid + 1, y + 1, 0, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y, line_h = 0, y + line_h, 0
            panels.append(_panel_json(p, pid, x, y))
            pid, x, line_h = pid + 1, x + p.width, max(line_h, p.height)
        y += line_h
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": list(d.tags),
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": list(d.links),
        "templating": {"list": [_variable_json(v) for v in d.variables]},
        "panels": panels,
    }


_SPILL = 'reason=~"spill.*|borrow.*"'

COST = Dashboard(
    uid="kvgate-cost",
    title="kvgate — cost and routing",
    description="Per-tenant cost, savings against the cloud reference, idle GPU money, cache and routing.",
    tags=("kvgate", "cost"),
    links=({"title": "vLLM engines", "type": "link", "url": "/d/kvgate-vllm", "icon": "dashboard"},),
    variables=(
        Variable("tenant", "Tenant", "label_values(gateway_tenant_cost_usd_total, tenant)"),
        Variable("pool", "Pool", "label_values(gateway_pool_gpu_cost_usd_total, pool)"),
    ),
    rows=(
        Row(
            "Spend",
            (
                Panel(
                    "Spend in range",
                    "stat",
                    (Target(f"sum(increase(gateway_tenant_cost_usd_total{{{TP}}}[$__range]))"),),
                    unit="currencyUSD",
                    width=6,
                    height=4,
                    decimals=2,
                    description="USD charged to the selected tenants at their pool's prices over the time range.",
                ),
                Panel(
                    "Saved vs cloud reference",
                    "stat",
                    (Target(f"sum(increase(gateway_tenant_savings_usd_total{{{TP}}}[$__range]))"),),
                    unit="currencyUSD",
                    width=6,
                    height=4,
                    decimals=2,
                    description="What the same tokens would have cost at each tenant's reference (cloud API) "
                    "price, minus what they were charged.",
                ),
                Panel(
                    "Idle GPU cost in range",
                    "stat",
                    (Target(f"sum({idle_cost('increase', '$__range')})"),),
                    unit="currencyUSD",
                    width=6,
                    height=4,
                    decimals=2,
                    description="GPU money not covered by tenant charges: capacity paid for and not used "
                    "(pool GPU cost minus the charges of every gateway process).",
                ),
                Panel(
                    "GPU cost recovered",
                    "stat",
                    (
                        Target(
                            f"sum(increase(gateway_tenant_cost_usd_total{{{P}}}[$__range])) / "
                            f"sum({gpu_cost('increase', '$__range')})"
                        ),
                    ),
                    unit="percentunit",
                    width=6,
                    height=4,
                    decimals=1,
                    description="Charged to tenants ÷ what the pools' GPUs cost over the range "
                    "(all tenants of the selected pools).",
                ),
                Panel(
                    "Cost rate by tenant",
                    "timeseries",
                    (
                        Target(
                            f"sum by (tenant) (rate(gateway_tenant_cost_usd_total{{{TP}}}[{RI}])) * 3600", "{{tenant}}"
                        ),
                    ),
                    unit="currencyUSD",
                    stack=True,
                    description="USD per hour charged, by tenant (stacked).",
                ),
                Panel(
                    "Spend by tenant",
                    "bargauge",
                    (
                        Target(
                            f"sort_desc(sum by (tenant) (increase(gateway_tenant_cost_usd_total{{{TP}}}[$__range])))",
                            "{{tenant}}",
                        ),
                    ),
                    unit="currencyUSD",
                    decimals=2,
                    description="USD charged over the time range, by tenant.",
                ),
                Panel(
                    "Savings rate by tenant",
                    "timeseries",
                    (
                        Target(
                            f"sum by (tenant) (rate(gateway_tenant_savings_usd_total{{{TP}}}[{RI}])) * 3600",
                            "{{tenant}}",
                        ),
                    ),
                    unit="currencyUSD",
                    stack=True,
                    description="USD per hour saved against each tenant's reference price.",
                ),
                Panel(
                    "Saved by tenant",
                    "bargauge",
                    (
                        Target(
                            f"sort_desc(sum by (tenant) (increase(gateway_tenant_savings_usd_total{{{TP}}}"
                            f"[$__range])))",
                            "{{tenant}}",
                        ),
                    ),
                    unit="currencyUSD",
                    decimals=2,
                    description="USD saved over the time range against the reference price, by tenant.",
                ),
                Panel(
                    "GPU cost and idle cost by pool",
                    "timeseries",
                    (
                        Target(f"{gpu_cost('rate', RI)} * 3600", "{{pool}} GPU"),
                        Target(f"{idle_cost('rate', RI)} * 3600", "{{pool}} idle"),
                    ),
                    unit="currencyUSD",
                    width=24,
                    description="USD per hour each pool's GPUs cost, and the part of it no tenant was "
                    "charged for (idle).",
                ),
            ),
        ),
        Row(
            "Tokens and prefix cache",
            (
                Panel(
                    "Tokens by type",
                    "timeseries",
                    (Target(f"sum by (type) (rate(gateway_tenant_tokens_total{{{TP}}}[{RI}]))", "{{type}}"),),
                    unit="short",
                    stack=True,
                    width=8,
                    description="Tokens per second: uncached input, cached input (prefix-cache hits, "
                    "charged at the cached price) and output.",
                ),
                Panel(
                    "Cached share of input by tenant",
                    "timeseries",
                    (
                        Target(
                            f'sum by (tenant) (rate(gateway_tenant_tokens_total{{{TP}, type="cached"}}[{RI}])) / '
                            f'sum by (tenant) (rate(gateway_tenant_tokens_total{{{TP}, type=~"cached|uncached"}}'
                            f"[{RI}]))",
                            "{{tenant}}",
                        ),
                    ),
                    unit="percentunit",
                    width=8,
                    description="Gateway view: cached ÷ all input tokens, from vLLM's usage "
                    "(prompt_tokens_details.cached_tokens). Prompt normalization raises it.",
                ),
                Panel(
                    "Prefix-cache hit ratio by pool (vLLM)",
                    "timeseries",
                    (
                        Target(
                            ratio(
                                f"vllm:prefix_cache_hits_total{{{P}}}",
                                f"vllm:prefix_cache_queries_total{{{P}}}",
                                "pool",
                            ),
                            "{{pool}}",
                        ),
                    ),
                    unit="percentunit",
                    width=8,
                    description="Engine view: prefix-cache hit tokens ÷ queried tokens, per pool.",
                ),
                Panel(
                    "Speculative decoding acceptance rate",
                    "timeseries",
                    (
                        Target(
                            ratio(
                                f"vllm:spec_decode_num_accepted_tokens_total{{{P}}}",
                                f"vllm:spec_decode_num_draft_tokens_total{{{P}}}",
                                "pool",
                            ),
                            "{{pool}}",
                        ),
                    ),
                    unit="percentunit",
                    description="Accepted ÷ proposed draft tokens on pools that speculate (the fast pool).",
                ),
                Panel(
                    "Mean acceptance length",
                    "timeseries",
                    (
                        Target(
                            "1 + "
                            + ratio(
                                f"vllm:spec_decode_num_accepted_tokens_total{{{P}}}",
                                f"vllm:spec_decode_num_drafts_total{{{P}}}",
                                "pool",
                            ),
                            "{{pool}}",
                        ),
                    ),
                    unit="short",
                    description="Tokens produced per target-model step with speculation (1 = no gain).",
                ),
            ),
        ),
        Row(
            "Latency",
            (
                Panel(
                    "Time to first token by class and pool",
                    "timeseries",
                    (
                        Target(
                            q(
                                0.5,
                                "gen_ai_server_time_to_first_token_seconds_bucket",
                                GENAI,
                                "kvgate_class, kvgate_pool",
                            ),
                            "p50 {{kvgate_class}} → {{kvgate_pool}}",
                        ),
                        Target(
                            q(
                                0.99,
                                "gen_ai_server_time_to_first_token_seconds_bucket",
                                GENAI,
                                "kvgate_class, kvgate_pool",
                            ),
                            "p99 {{kvgate_class}} → {{kvgate_pool}}",
                        ),
                    ),
                    unit="s",
                    description="TTFT seen by the gateway (streaming requests), p50 and p99, by latency "
                    "class and the pool that served it.",
                ),
                Panel(
                    "Time per output token by class and pool",
                    "timeseries",
                    (
                        Target(
                            q(
                                0.5,
                                "gen_ai_server_time_per_output_token_seconds_bucket",
                                GENAI,
                                "kvgate_class, kvgate_pool",
                            ),
                            "p50 {{kvgate_class}} → {{kvgate_pool}}",
                        ),
                        Target(
                            q(
                                0.99,
                                "gen_ai_server_time_per_output_token_seconds_bucket",
                                GENAI,
                                "kvgate_class, kvgate_pool",
                            ),
                            "p99 {{kvgate_class}} → {{kvgate_pool}}",
                        ),
                    ),
                    unit="s",
                    description="TPOT after the first token, p50 and p99. Speculative decoding lowers it "
                    "on the fast pool.",
                ),
                Panel(
                    "Upstream call duration by pool",
                    "timeseries",
                    p50_p99("gen_ai_client_operation_duration_seconds_bucket", GENAI, "kvgate_pool"),
                    unit="s",
                    description="Whole upstream call (gen_ai.client.operation.duration), p50 and p99.",
                ),
                Panel(
                    "Gateway overhead",
                    "timeseries",
                    p50_p99("gateway_overhead_seconds_bucket", P, "pool"),
                    unit="s",
                    description="Time the gateway itself adds per request (parse, limits, normalize, route, "
                    "settle), excluding the upstream.",
                ),
            ),
        ),
        Row(
            "Routing and limits",
            (
                Panel(
                    "Route decisions",
                    "timeseries",
                    (
                        Target(
                            f"sum by (pool, class, reason) (rate(gateway_route_decisions_total{{{P}}}[{RI}]))",
                            "{{class}} → {{pool}} ({{reason}})",
                        ),
                    ),
                    unit="reqps",
                    stack=True,
                    description="Where requests went and why (class default, header, prefix affinity, "
                    "spill, borrow …).",
                ),
                Panel(
                    "Spill-overs and borrows",
                    "timeseries",
                    (
                        # The `or … * 0` arm draws a zero line per pool instead of "No data" when
                        # nothing spilled; it still needs the decision counter to exist.
                        Target(
                            f"sum by (pool, reason) (rate(gateway_route_decisions_total{{{P}, {_SPILL}}}[{RI}])) "
                            f"or sum by (pool) (rate(gateway_route_decisions_total{{{P}}}[{RI}])) * 0",
                            "{{pool}} {{reason}}",
                        ),
                    ),
                    unit="reqps",
                    description="Requests sent outside their class's pool: interactive spilled to bulk "
                    "when fast is saturated or down, bulk borrowing an idle fast pool.",
                ),
                Panel(
                    "Requests by status",
                    "timeseries",
                    (Target(f"sum by (status) (rate(gateway_requests_total{{{TP}}}[{RI}]))", "{{status}}"),),
                    unit="reqps",
                    stack=True,
                    description="Requests per second by HTTP status.",
                ),
                Panel(
                    "429s by tenant",
                    "timeseries",
                    (
                        Target(
                            f'sum by (tenant) (rate(gateway_requests_total{{{T}, status="429"}}[{RI}]))',
                            "{{tenant}}",
                        ),
                    ),
                    unit="reqps",
                    description="Requests the gateway answered with 429 (rate limit or budget), by tenant.",
                ),
                Panel(
                    "Limit hits by tenant and limit",
                    "timeseries",
                    (
                        Target(
                            f"sum by (tenant, limit, action) (rate(gateway_rate_limited_total{{{T}}}[{RI}]))",
                            "{{tenant}} {{limit}} {{action}}",
                        ),
                    ),
                    unit="reqps",
                    description="Requests over a limit (rpm, tpm, concurrent, budget; queue: the pool's "
                    "admission queue), rejected with 429 or degraded to bulk.",
                ),
                Panel(
                    "Volatile spans moved by rule",
                    "timeseries",
                    (Target(f"sum by (rule) (rate(gateway_normalize_moved_spans_total{{{T}}}[{RI}]))", "{{rule}}"),),
                    unit="short",
                    description="Prompt normalization: volatile spans (timestamps, ids …) moved out of the "
                    "cacheable prefix, per second, by rule.",
                ),
                Panel(
                    "Admission queue wait by pool",
                    "timeseries",
                    p50_p99("gateway_queue_wait_seconds_bucket", TP, "pool"),
                    unit="s",
                    width=8,
                    description="Time requests waited in their pool's fair admission queue before starting "
                    "(0 below saturation: the queue only engages when every replica is saturated).",
                ),
                Panel(
                    "Requests waiting by tenant",
                    "timeseries",
                    # Little's law: seconds waited per second = mean number of requests waiting.
                    (Target(f"sum by (tenant) (rate(gateway_queue_wait_seconds_sum{{{TP}}}[{RI}]))", "{{tenant}}"),),
                    unit="short",
                    width=8,
                    stack=True,
                    description="Mean admission-queue length per tenant over the interval (wait seconds per "
                    "second); the instantaneous length is gateway_queue_length on /metrics.",
                ),
                Panel(
                    "Fair share of admitted tokens by tenant",
                    "timeseries",
                    (
                        Target(
                            f"sum by (pool, tenant) (rate(gateway_queue_tokens_total{{{TP}}}[{RI}])) / on (pool) "
                            f"group_left sum by (pool) (rate(gateway_queue_tokens_total{{{P}}}[{RI}]))",
                            "{{pool}} {{tenant}}",
                        ),
                    ),
                    unit="percentunit",
                    width=8,
                    description="Each tenant's share of the tokens (uncached prompt + output) its pool admitted: "
                    "the currency the fair queue equalizes (by weight) while the pool is saturated.",
                ),
            ),
        ),
        Row(
            "Speculation where it pays: interactive pool by predicted TPOT",
            (
                Panel(
                    "Routed by predicted TPOT",
                    "timeseries",
                    (
                        Target(
                            f"sum by (pool, kind, outcome) (rate(gateway_tpot_decisions_total{{{P}}}[{RI}]))",
                            "→ {{pool}} {{kind}} ({{outcome}})",
                        ),
                    ),
                    unit="reqps",
                    stack=True,
                    width=8,
                    description="Interactive requests whose pool the predicted TTFT + output x TPOT chose "
                    "(routing.tpot), by the pool chosen, request kind and outcome: kept (its pool was fastest or "
                    "within the hysteresis), moved (the other pool ends it sooner), affinity (it would have moved "
                    "but its session's cached prefix is worth more).",
                ),
                Panel(
                    "Predicted vs observed TPOT",
                    "timeseries",
                    (
                        Target(
                            f"sum by (pool) (rate(gateway_tpot_predicted_seconds_total{{{P}}}[{RI}])) / "
                            f"clamp_min(sum by (pool) (rate(gateway_tpot_compared_total{{{P}}}[{RI}])), 1e-9)",
                            "predicted {{pool}}",
                        ),
                        Target(
                            f"sum by (pool) (rate(gateway_tpot_observed_seconds_total{{{P}}}[{RI}])) / "
                            f"clamp_min(sum by (pool) (rate(gateway_tpot_compared_total{{{P}}}[{RI}])), 1e-9)",
                            "observed {{pool}}",
                        ),
                        Target(
                            f"max by (pool) (gateway_tpot_error_ratio{{{P}}}) "
                            f"or max by (pool) (gateway_tpot_compared_total{{{P}}}) * 0",
                            "median |error| {{pool}}",
                        ),
                    ),
                    unit="s",
                    width=8,
                    description="Mean predicted and observed TPOT of the requests the prediction routed, per "
                    "pool chosen (0 while none was routed), and the median relative error over the last 256 "
                    "(a ratio, read on the same axis).",
                ),
                Panel(
                    "Speculative acceptance: pool and tenant",
                    "timeseries",
                    (
                        Target(f"max by (pool) (gateway_spec_acceptance_ratio{{{P}}})", "acceptance {{pool}}"),
                        Target(
                            f"max by (pool, tenant, kind) (gateway_spec_tokens_per_step{{{TP}}})",
                            "tokens/step {{pool}} {{tenant}} {{kind}}",
                        ),
                    ),
                    unit="short",
                    width=8,
                    description="The gateway's view of speculation: accepted ÷ proposed draft tokens per pool "
                    "(engine counters) and the tokens per decode step it expects, for the pool (tenant empty) "
                    "and per tenant and request kind (learned from its streams).",
                ),
            ),
        ),
        Row(
            "Cluster: replicas, peer load, KV events, discovery and pre-warm",
            (
                Panel(
                    "Replicas by state",
                    "timeseries",
                    (Target(f"max by (pool, state) (gateway_pool_replicas{{{P}}}) > 0", "{{pool}} {{state}}"),),
                    unit="short",
                    width=8,
                    decimals=0,
                    description="Replicas of each pool by routing state, the most any gateway process counts: "
                    "serving; warming (held while pre-warmed); breaker_open / breaker_half_open (failures took it "
                    "out, one trial decides); unhealthy (probes fail); joining (discovered, not yet probed good).",
                ),
                Panel(
                    "Gateway processes sharing load",
                    "timeseries",
                    (
                        Target("max(gateway_peer_load_processes)", "in the snapshot (most)"),
                        Target("min(gateway_peer_load_processes)", "in the snapshot (fewest)"),
                        Target("min(gateway_peer_load_in_force)", "shared snapshot deciding (0/1, worst)"),
                    ),
                    unit="short",
                    width=8,
                    decimals=0,
                    description="Gateway processes (workers included) in the last per-round load snapshot, as "
                    "the processes see it: most and fewest differ while one lags. The last line is 0 while some "
                    "process decides bounded load on its own view (alone, or the store failed).",
                ),
                Panel(
                    "Load exchanges by outcome",
                    "timeseries",
                    (Target(f"sum by (outcome) (rate(gateway_peer_load_exchanges_total[{RI}]))", "{{outcome}}"),),
                    unit="short",
                    width=8,
                    stack=True,
                    description="Per-round load exchanges per second over all processes: shared, alone (no "
                    "other process published), late (read after the instant every process switches at: that "
                    "process decided differently for a moment), store_unavailable, failed.",
                ),
                Panel(
                    "Host clocks against Redis' clock",
                    "timeseries",
                    (
                        Target("max(gateway_peer_load_clock_offset_seconds)", "most ahead of the hosts"),
                        Target("min(gateway_peer_load_clock_offset_seconds)", "most behind"),
                    ),
                    unit="s",
                    width=8,
                    description="Each gateway process's estimate of Redis' clock minus its host's (from the "
                    "load exchanges' round trips). Rounds switch on Redis' clock, so host skew does not split "
                    "the snapshot; a spread here is NTP drift between the gateway hosts.",
                ),
                # The KV-event series carry the replica (its URL), not the pool: these panels show every pool.
                Panel(
                    "KV-event view complete by replica",
                    "timeseries",
                    (Target("min by (replica) (gateway_kv_events_whole)", "{{replica}}"),),
                    unit="none",
                    width=8,
                    decimals=0,
                    description="1 while a replica's KV-event stream is whole (connected, caught up, no unfilled "
                    "gap) in every gateway process; 0: kv_events routing falls back to prefix affinity for it.",
                ),
                Panel(
                    "KV-event lag by replica",
                    "timeseries",
                    (Target("max by (replica) (gateway_kv_events_lag_seconds)", "{{replica}}"),),
                    unit="s",
                    width=8,
                    description="Age of the newest event batch when it arrived, worst gateway process.",
                ),
                Panel(
                    "KV events applied by replica",
                    "timeseries",
                    (Target(f"sum by (replica) (rate(gateway_kv_events_received_total[{RI}]))", "{{replica}}"),),
                    unit="short",
                    width=8,
                    description="KV-cache events (blocks stored, removed, cleared) applied to the gateways' "
                    "indexes per second, summed over the gateway processes.",
                ),
                Panel(
                    "KV-event gaps and replays by replica",
                    "timeseries",
                    (
                        Target(f"sum by (replica) (rate(gateway_kv_events_gaps_total[{RI}]))", "{{replica}} gaps"),
                        Target(
                            f"sum by (replica) (rate(gateway_kv_events_replays_total[{RI}]))", "{{replica}} replays"
                        ),
                    ),
                    unit="short",
                    width=8,
                    description="Sequence gaps seen in a replica's stream per second, and catch-ups from its "
                    "replay endpoint; gaps without replays mean its view stays incomplete.",
                ),
                Panel(
                    "KV index size",
                    "timeseries",
                    (
                        Target("max(gateway_kv_events_index_blocks)", "largest"),
                        Target("min(gateway_kv_events_index_blocks)", "smallest"),
                    ),
                    unit="short",
                    width=8,
                    description="Blocks in the gateway processes' KV indexes (each process and worker keeps "
                    "its own, of every replica it subscribes to): the largest and the smallest.",
                ),
                Panel(
                    "kv_events picks that fell back",
                    "timeseries",
                    (Target(f"sum(rate(gateway_kv_events_fallbacks_total[{RI}]))", "fallbacks"),),
                    unit="reqps",
                    width=8,
                    description="Picks of the kv_events policy that fell back to prefix affinity per second "
                    "(a replica's view incomplete, or no tokenizer render), over all gateway processes.",
                ),
                Panel(
                    "Replicas discovered by pool",
                    "timeseries",
                    (Target(f"max by (pool) (gateway_discovery_replicas{{{P}}})", "{{pool}}"),),
                    unit="short",
                    width=8,
                    decimals=0,
                    description="Replicas each discovering pool's source (DNS, EndpointSlices) lists now; "
                    "pools with a static replica list have no series.",
                ),
                Panel(
                    "Discovery read errors and changes by pool",
                    "timeseries",
                    (
                        Target(f"sum by (pool) (rate(gateway_discovery_errors_total{{{P}}}[{RI}]))", "{{pool}} errors"),
                        Target(
                            f"sum by (pool) (rate(gateway_discovery_changes_total{{{P}}}[{RI}]))", "{{pool}} changes"
                        ),
                    ),
                    unit="short",
                    width=8,
                    description="Discovery reads that failed per second (the pool kept its last replicas), and "
                    "changes of its replica set.",
                ),
                Panel(
                    "Pre-warm runs by result",
                    "bargauge",
                    (
                        Target(
                            f"sort_desc(sum by (pool, result) (increase(gateway_prewarm_runs_total{{{P}}}[$__range])))",
                            "{{pool}} {{result}}",
                        ),
                    ),
                    unit="short",
                    width=8,
                    decimals=0,
                    description="Pre-warms of joining replicas over the time range: done, budget (ran out of "
                    "time), failed, aborted (bad probe, replica left), skipped (the pool needed it at once).",
                ),
                Panel(
                    "Pre-warm replays by outcome",
                    "timeseries",
                    (
                        Target(
                            f"sum by (pool, outcome) (rate(gateway_prewarm_requests_total{{{P}}}[{RI}]))",
                            "{{pool}} {{outcome}}",
                        ),
                    ),
                    unit="reqps",
                    width=8,
                    stack=True,
                    description="Prefix replays sent to joining replicas: ok, skipped (a 4xx for that prefix), "
                    "failed (ends the pre-warm), capped (not sent: the run reached routing.prewarm.run_max_chars).",
                ),
                Panel(
                    "Pre-warm tokens cached vs uncached",
                    "timeseries",
                    (
                        Target(
                            f"sum by (pool, type) (rate(gateway_prewarm_tokens_total{{{P}}}[{RI}]))",
                            "{{pool}} {{type}}",
                        ),
                    ),
                    unit="short",
                    width=8,
                    stack=True,
                    description="Replayed prompt tokens per second: uncached ones are the prefill the joining "
                    "replica did ahead of its traffic, cached ones were already there.",
                ),
                Panel(
                    "Mean time held for pre-warm",
                    "bargauge",
                    (
                        # Cumulative, not over the range: pre-warms are rare and a rate of one run is empty.
                        Target(
                            f"sum by (pool, result) (gateway_prewarm_duration_seconds_sum{{{P}}}) / "
                            f"sum by (pool, result) (gateway_prewarm_duration_seconds_count{{{P}}})",
                            "{{pool}} {{result}}",
                        ),
                    ),
                    unit="s",
                    width=8,
                    description="Mean time a joining replica was held out of rotation while prefixes were "
                    "replayed, since the gateway processes started (at most routing.prewarm.budget_s).",
                ),
            ),
        ),
    ),
)

VP = 'pool=~"$pool"'

VLLM = Dashboard(
    uid="kvgate-vllm",
    title="kvgate — vLLM engines",
    description="The two vLLM pools as the engines report them (pool label from the Prometheus scrape config).",
    tags=("kvgate", "vllm"),
    links=({"title": "Cost and routing", "type": "link", "url": "/d/kvgate-cost", "icon": "dashboard"},),
    variables=(Variable("pool", "Pool", "label_values(vllm:num_requests_running, pool)"),),
    rows=(
        Row(
            "Load",
            (
                Panel(
                    "Requests running",
                    "timeseries",
                    (Target(f"sum by (pool) (vllm:num_requests_running{{{VP}}})", "{{pool}}"),),
                    width=8,
                    description="Requests in the engine's running batch.",
                ),
                Panel(
                    "Requests waiting",
                    "timeseries",
                    (Target(f"sum by (pool) (vllm:num_requests_waiting{{{VP}}})", "{{pool}}"),),
                    width=8,
                    description="Requests queued in the engine (not yet scheduled).",
                ),
                Panel(
                    "KV cache usage",
                    "timeseries",
                    (Target(f"max by (pool) (vllm:kv_cache_usage_perc{{{VP}}})", "{{pool}}"),),
                    unit="percentunit",
                    width=8,
                    description="Fraction of KV-cache blocks in use.",
                ),
                Panel(
                    "Engines up",
                    "stat",
                    (Target(f'up{{job="vllm", {VP}}}', "{{pool}} {{instance}}"),),
                    unit="none",
                    width=24,
                    height=4,
                    description="1 when Prometheus' last scrape of the engine succeeded.",
                ),
            ),
        ),
        Row(
            "Cache and speculation",
            (
                Panel(
                    "Prefix-cache hit ratio",
                    "timeseries",
                    (
                        Target(
                            ratio(
                                f"vllm:prefix_cache_hits_total{{{VP}}}",
                                f"vllm:prefix_cache_queries_total{{{VP}}}",
                                "pool",
                            ),
                            "{{pool}}",
                        ),
                    ),
                    unit="percentunit",
                    width=8,
                    description="Hit tokens ÷ queried tokens.",
                ),
                Panel(
                    "Speculative acceptance rate",
                    "timeseries",
                    (
                        Target(
                            ratio(
                                f"vllm:spec_decode_num_accepted_tokens_total{{{VP}}}",
                                f"vllm:spec_decode_num_draft_tokens_total{{{VP}}}",
                                "pool",
                            ),
                            "{{pool}}",
                        ),
                    ),
                    unit="percentunit",
                    width=8,
                    description="Accepted ÷ proposed draft tokens.",
                ),
                Panel(
                    "Draft tokens per second",
                    "timeseries",
                    (
                        Target(
                            f"sum by (pool) (rate(vllm:spec_decode_num_draft_tokens_total{{{VP}}}[{RI}]))",
                            "{{pool}} proposed",
                        ),
                        Target(
                            f"sum by (pool) (rate(vllm:spec_decode_num_accepted_tokens_total{{{VP}}}[{RI}]))",
                            "{{pool}} accepted",
                        ),
                    ),
                    width=8,
                    description="Draft tokens proposed and accepted per second.",
                ),
            ),
        ),
        Row(
            "Engine latency",
            (
                Panel(
                    "Time to first token",
                    "timeseries",
                    p50_p99("vllm:time_to_first_token_seconds_bucket", VP, "pool"),
                    unit="s",
                    description="Engine-side TTFT (queue + prefill), p50 and p99.",
                ),
                Panel(
                    "End-to-end request latency",
                    "timeseries",
                    p50_p99("vllm:e2e_request_latency_seconds_bucket", VP, "pool"),
                    unit="s",
                    description="Engine-side request latency, p50 and p99.",
                ),
            ),
        ),
    ),
)

DASHBOARDS = {"kvgate-cost.json": COST, "kvgate-vllm.json": VLLM}


def rendered() -> dict[str, str]:
    """File name → JSON text, exactly as committed."""
    return {name: json.dumps(render(d), indent=2, ensure_ascii=False) + "\n" for name, d in DASHBOARDS.items()}


def main() -> int:
    """Write every dashboard into grafana/dashboards/."""
    OUT_DIR.mkdir(exist_ok=True)
    for name, text in rendered().items():
        (OUT_DIR / name).write_text(text)
        print(f"wrote {OUT_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
