"""The Grafana dashboards: generated from grafana/build_dashboards.py, schema 39, tenant/pool variables,
a non-overlapping grid, and every query filtered by the variables that apply to it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from app.telemetry import instruments as inst
from tests.deploy.files import DASHBOARDS, ROOT, dashboard_targets, dashboard_variables, metric_names


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboards", ROOT / "grafana" / "build_dashboards.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((ROOT / "grafana" / "dashboards" / name).read_text()))


def test_committed_dashboards_are_the_generator_output() -> None:
    rendered = _builder().rendered()
    assert sorted(rendered) == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert path.read_text() == rendered[path.name], f"{path.name}: run python grafana/build_dashboards.py"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_schema_ids_and_grid(path: Path) -> None:
    data = json.loads(path.read_text())
    assert data["schemaVersion"] == 39 and data["uid"] and data["title"]
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in data["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["targets"] and p["description"], p["title"]


def test_cost_dashboard_has_tenant_and_pool_variables_from_gateway_metrics() -> None:
    variables = {v["name"]: v for v in dashboard_variables(ROOT / "grafana" / "dashboards" / "kvgate-cost.json")}
    assert set(variables) == {"tenant", "pool"}
    for name, v in variables.items():
        assert v["query"]["query"].startswith("label_values(gateway_") and v["query"]["query"].endswith(f", {name})")
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"


def test_cost_dashboard_rows_cover_the_operator_page() -> None:
    data = _load("kvgate-cost.json")
    rows = [p["title"] for p in data["panels"] if p["type"] == "row"]
    cluster = "Cluster: replicas, peer load, KV events, discovery and pre-warm"
    tpot = "Speculation where it pays: interactive pool by predicted TPOT"
    assert rows == ["Spend", "Tokens and prefix cache", "Latency", "Routing and limits", tpot, cluster]
    targets = dashboard_targets(ROOT / "grafana" / "dashboards" / "kvgate-cost.json")
    queried = set().union(*(metric_names(e) for _, e in targets))
    must = {
        "gateway_tenant_cost_usd_total", "gateway_tenant_savings_usd_total", "gateway_pool_gpu_cost_usd_total",
        "gateway_tenant_tokens_total", "vllm:prefix_cache_hits_total", "vllm:spec_decode_num_accepted_tokens_total",
        "gen_ai_server_time_to_first_token_seconds_bucket", "gen_ai_server_time_per_output_token_seconds_bucket",
        "gateway_route_decisions_total", "gateway_rate_limited_total", "gateway_overhead_seconds_bucket",
        "gateway_kv_events_whole", "gateway_kv_events_lag_seconds", "gateway_kv_events_gaps_total",
        "gateway_kv_events_replays_total", "gateway_kv_events_index_blocks", "gateway_kv_events_fallbacks_total",
        "gateway_discovery_replicas", "gateway_prewarm_runs_total", "gateway_prewarm_requests_total",
        "gateway_prewarm_tokens_total", "gateway_prewarm_duration_seconds_sum", "gateway_pool_replicas",
        "gateway_peer_load_processes", "gateway_peer_load_in_force", "gateway_peer_load_exchanges_total",
        "gateway_peer_load_clock_offset_seconds", "gateway_tpot_decisions_total",
        "gateway_tpot_predicted_seconds_total",
        "gateway_tpot_observed_seconds_total", "gateway_tpot_compared_total", "gateway_tpot_error_ratio",
        "gateway_spec_acceptance_ratio", "gateway_spec_tokens_per_step",
    }
    assert must <= queried


# Metrics without a pool label, panels about whole pools on purpose, and panels about requests answered
# before routing (they have no pool).
NO_POOL_LABEL = {"gateway_rate_limited_total", "gateway_normalize_moved_spans_total"} | {
    inst.PROMETHEUS_NAMES[spec.name] for spec, _ in inst.METER_METRICS if "pool" not in spec.labels
}
PRE_ROUTING_PANELS = {"429s by tenant"}
TENANT_LABELLED = {
    inst.PROMETHEUS_NAMES[spec.name] + suffix
    for spec in inst.ALL_METRICS
    if {"tenant", "kvgate.tenant"} & set(getattr(spec, "labels", ("tenant",)))
    for suffix in (("_bucket", "_sum", "_count") if spec.buckets is not None else ("",))
}
# A pool's GPU money against the charges of all its tenants: a tenant filter would count others' use as idle.
POOL_WIDE_PANELS = {"GPU cost recovered", "Idle GPU cost in range", "GPU cost and idle cost by pool"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_every_query_honours_the_variables_its_metrics_carry(path: Path) -> None:
    names = {v["name"] for v in dashboard_variables(path)}
    for title, expr in dashboard_targets(path):
        metrics = metric_names(expr)
        if "pool" in names and metrics - NO_POOL_LABEL and title not in PRE_ROUTING_PANELS:
            assert "$pool" in expr, f"{title}: ignores $pool"
        tenant_metrics = bool(metrics & TENANT_LABELLED)
        if "tenant" in names and tenant_metrics and title not in POOL_WIDE_PANELS:
            assert "$tenant" in expr, f"{title}: ignores $tenant"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian package prometheus)")
def test_promtool_parses_every_query(tmp_path: Path) -> None:
    # Each query as a recording rule: promtool parses them without a server (the slow test runs them).
    values = {"$__rate_interval": "1m", "$__range": "10m", "$__interval": "15s", "$tenant": ".*", "$pool": ".*"}
    rules = []
    for path in DASHBOARDS:
        for i, (_, expr) in enumerate(dashboard_targets(path)):
            for var, value in values.items():
                expr = expr.replace(var, value)
            rules.append({"record": f"kvgate:{path.stem.replace('-', '_')}:{i}", "expr": expr})
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
