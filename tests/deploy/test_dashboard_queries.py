"""Every dashboard query, evaluated by a real Prometheus scraping a real gateway (on a Redis store, as in
compose) in front of `kvgate sim` engines publishing KV events after traffic: each must parse and return data.
A panel on a metric nobody exports fails. The bulk pool is discovered (DNS), and a second fast engine starts
after the traffic, so the cluster panels see a discovered pool, a joining replica's pre-warm and event streams.

Prometheus runs with config/prometheus.yml itself, targets rewritten to loopback ports: the collector's
exporter is stood in for by the gateway's own /metrics (same instruments, same OTel → Prometheus naming;
`test_otlp_path_carries_the_names_and_labels_of_the_metrics_path` checks that equivalence on the OTLP the
gateway pushes). Needs the `prometheus` binary (Debian: `apt-get install prometheus`).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvlab.net import free_port
from kvlab.procs import spawn, wait_ready
from kvlab.stack import (
    FAST_SIM,
    KEYS,
    MODEL,
    gateway_config,
    prometheus_argv,
    prometheus_config,
    redis_store,
    sim_argv,
    sim_ports,
)
from tests.deploy.dashboard_eval import dashboard_outcomes
from tests.deploy.dashboard_eval import prometheus_query as _query
from tests.deploy.dashboard_eval import substitute as _substitute
from tests.deploy.files import DASHBOARDS, dashboard_variables, prometheus_name
from tests.telemetry.otlp_receiver import Received, otlp_receiver

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (apt-get install prometheus)"),
]

SCRAPE_S = 1


@dataclass
class Stack:
    """The running processes' endpoints and what the gateway pushed over OTLP."""

    gateway: str
    prometheus: str
    otlp: Received
    logs: Path


def _chat(base: str, tenant: str, cls: str, i: int, stream: bool) -> None:
    system = "You are the support assistant of ACME. " + "Policy: be brief and exact. " * 40
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEYS[tenant], max_retries=0, timeout=30)
    messages = [
        # The volatile line at the top of a long static prompt is what normalization moves to the tail.
        {"role": "system", "content": f"Current time: 2026-11-30T02:{i:02d}:17Z\n{system}"},
        {"role": "user", "content": f"Question {i}: where is my order #{1000 + i}?"},
    ]
    headers = {"x-kvgate-class": cls}
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, stream=True, extra_headers=headers,
            stream_options={"include_usage": True},
        )
        assert any(chunk.usage for chunk in chunks)
    else:
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, extra_headers=headers)
        assert reply.usage and reply.usage.completion_tokens > 0


def _over_the_limit(base: str, n: int) -> int:
    tiny = openai.OpenAI(base_url=f"{base}/v1", api_key=KEYS["tiny"], max_retries=0, timeout=30)
    limited = 0
    for _ in range(n):
        try:
            tiny.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        except openai.RateLimitError:
            limited += 1
    return limited


def _traffic(base: str) -> None:
    """Both classes, streaming and not, shared prefixes with volatile lines, and a tenant over its rpm.

    Spread over several scrapes: Prometheus sees a new series' first sample as its start, so a burst that
    fits between two scrapes would leave every rate() at zero.
    """
    for i in range(8):
        for tenant, cls in (("acme", "interactive"), ("globex", "bulk")):
            _chat(base, tenant, cls, i, stream=bool(i % 2))
        if i in (0, 5):
            assert _over_the_limit(base, 3) >= 1, "the rpm limit never triggered"
        time.sleep(0.5 * SCRAPE_S)


def _prewarm_runs_done(metrics: str) -> float:
    """Finished pre-warm runs in a /metrics text (the series exist from 0 before any run)."""
    return sum(s.value for f in text_string_to_metric_families(metrics) if f.name == "gateway_prewarm_runs"
               for s in f.samples if s.labels.get("result") == "done")


def _join_a_replica(es: ExitStack, logs: Path, kvgate: list[str], ports: dict[str, int], gateway: str) -> None:
    """Start the fast pool's second engine after more distinct prefixes were routed (under prefix affinity it is
    warmed with those it becomes the home of, about half), and wait for its pre-warm to end."""
    for i in range(8):
        _chat(gateway, "acme", "interactive", 20 + i, stream=False)
    proc = spawn(es, logs, "sim-fast-2", sim_argv(kvgate, ports, "vllm-fast-2", []))
    wait_ready(f"http://127.0.0.1:{ports['vllm-fast-2']}/health", proc, logs, "sim-fast-2")
    deadline = time.monotonic() + 30
    while _prewarm_runs_done(httpx.get(f"{gateway}/metrics", timeout=5).text) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no pre-warm run:\n{(logs / 'gateway.log').read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("deploy-stack")
    ports = {"gateway": free_port(), "localhost": free_port(), **sim_ports(("vllm-fast", "vllm-fast-2", "vllm-bulk"))}
    kvgate = [sys.executable, "-m", "app.cli"]
    with ExitStack() as es, otlp_receiver() as (otlp_url, received), redis_store(logs) as store:
        running = {}
        for pool, extra in (("fast", FAST_SIM), ("bulk", [])):
            argv = sim_argv(kvgate, ports, f"vllm-{pool}", extra)
            running[pool] = (spawn(es, logs, f"sim-{pool}", argv), ports[f"vllm-{pool}"])
        for pool, (proc, port) in running.items():
            wait_ready(f"http://127.0.0.1:{port}/health", proc, logs, f"sim-{pool}")
        cfg_path = logs / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(gateway_config(ports, store, otlp=otlp_url)))
        gw = spawn(es, logs, "gateway", [*kvgate, "serve", "--config", str(cfg_path)])
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        wait_ready(f"{gateway}/ready", gw, logs, "gateway")
        prom_cfg = logs / "prometheus.yml"
        # The gateway's /metrics stands in for the collector's exporter.
        targets = {host: [ports[host]] for host in ("gateway", "localhost", "vllm-fast", "vllm-bulk")}
        targets["otel-collector"] = [ports["gateway"]]
        prom_cfg.write_text(yaml.safe_dump(prometheus_config(targets, SCRAPE_S)))
        prom = spawn(es, logs, "prometheus", prometheus_argv(prom_cfg, logs / "tsdb", ports["localhost"]))
        prometheus = f"http://127.0.0.1:{ports['localhost']}"
        wait_ready(f"{prometheus}/-/ready", prom, logs, "prometheus")
        time.sleep(2 * SCRAPE_S)  # a baseline scrape before traffic, so rate() sees the increase
        _traffic(gateway)
        _join_a_replica(es, logs, kvgate, ports, gateway)
        # Wait until a scrape after the burst is in, then for two more.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            res = _query(prometheus, 'sum(gateway_rate_limited_total{tenant="tiny"})')["data"]["result"]
            if res:
                break
            time.sleep(0.5)
        time.sleep(3 * SCRAPE_S)
        yield Stack(gateway, prometheus, received, logs)


def test_every_dashboard_query_parses_and_returns_data(stack: Stack) -> None:
    outcomes = dashboard_outcomes(stack.prometheus)
    failures = [f"{name} / {title}: {result}\n    {expr}" for name, title, expr, result in outcomes if result != "data"]
    assert len(outcomes) > 30
    assert not failures, "\n".join(failures)


def test_every_template_variable_has_values(stack: Stack) -> None:
    for path in DASHBOARDS:
        for var in dashboard_variables(path):
            query = var["query"]["query"]
            metric, label = query.removeprefix("label_values(").removesuffix(")").split(", ")
            r = httpx.get(f"{stack.prometheus}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=10)
            values = r.json()["data"]
            assert values, f"{path.name}: ${var['name']} ({query}) has no values"
            if var["name"] == "tenant":
                assert {"acme", "globex"} <= set(values)
            if var["name"] == "pool":
                assert {"fast", "bulk"} <= set(values)


def test_a_query_on_a_metric_nobody_exports_is_caught(stack: Stack) -> None:
    body = _query(
        stack.prometheus,
        _substitute('sum by (pool) (rate(gateway_pool_cost_usd_total{pool=~"$pool"}[$__rate_interval]))'),
    )
    assert body["status"] == "success" and body["data"]["result"] == []


def _metrics_path_families(gateway: str) -> dict[str, set[str]]:
    """Family → label names, from the gateway's /metrics text (histogram suffixes folded)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{gateway}/metrics", timeout=10).text):
        if fam.name == "target":
            continue
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = out.setdefault(name, set())
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
    return out


def test_otlp_path_carries_the_names_and_labels_of_the_metrics_path(stack: Stack) -> None:
    import re

    from opentelemetry.proto.metrics.v1 import metrics_pb2

    deadline = time.monotonic() + 10
    while not stack.otlp.metric_names() and time.monotonic() < deadline:
        time.sleep(0.2)
    otlp: dict[str, set[str]] = {}
    with stack.otlp.lock:
        requests = list(stack.otlp.metrics)
    for req in requests:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    if kind == "sum":
                        prom_kind = "counter" if m.sum.is_monotonic else "gauge"
                        points = m.sum.data_points
                    elif kind == "histogram":
                        prom_kind, points = "histogram", m.histogram.data_points
                    else:
                        prom_kind, points = "gauge", m.gauge.data_points
                    name = prometheus_name(m.name, m.unit, prom_kind)
                    labels = otlp.setdefault(name, set())
                    for p in points:
                        labels |= {re.sub(r"[^a-zA-Z0-9]", "_", a.key) for a in p.attributes}
                    assert m.histogram.aggregation_temporality != metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    scrape = _metrics_path_families(stack.gateway)
    # The Python exporter adds the scope as labels on every series; the collector does the same.
    scope = {"otel_scope_name", "otel_scope_version", "otel_scope_schema_url"}
    scrape = {k: v - scope for k, v in scrape.items() if k.startswith(("gateway_", "gen_ai_"))}
    assert set(otlp) == set(scrape), "metric families differ between the OTLP and /metrics paths"
    for name in otlp:
        assert otlp[name] == scrape[name], f"{name}: labels differ (OTLP {otlp[name]} vs /metrics {scrape[name]})"


def test_spill_panel_shows_real_borrows_not_only_its_zero_line(stack: Stack) -> None:
    # The panel's `or … * 0` arm hides "No data"; here bulk borrows the idle fast pool (see the config).
    body = _query(stack.prometheus, 'sum by (reason) (gateway_route_decisions_total{reason=~"spill.*|borrow.*"})')
    assert {s["metric"]["reason"] for s in body["data"]["result"]} >= {"borrow_idle_interactive"}


def test_replica_and_peer_load_panels_show_the_stack_s_replicas_and_its_lone_process(stack: Stack) -> None:
    states = _query(stack.prometheus, "max by (pool, state) (gateway_pool_replicas) > 0")["data"]["result"]
    assert {(s["metric"]["pool"], s["metric"]["state"], s["value"][1]) for s in states} == {
        ("fast", "serving", "2"), ("bulk", "serving", "1"),
    }
    # One gateway process on Redis: it shares, finds no other process, and keeps its own view.
    alone = _query(stack.prometheus, 'sum(gateway_peer_load_exchanges_total{outcome="alone"})')["data"]["result"]
    assert alone and float(alone[0]["value"][1]) >= 1
    processes = _query(stack.prometheus, "max(gateway_peer_load_processes)")["data"]["result"]
    assert processes[0]["value"][1] == "1"


def test_prewarm_and_kv_event_panels_show_a_real_run_and_real_events(stack: Stack) -> None:
    # A zero rate is data too: these pin that the stack really pre-warmed a replica and streamed events.
    runs = _query(stack.prometheus, "sum by (pool, result) (gateway_prewarm_runs_total) > 0")["data"]["result"]
    assert {(s["metric"]["pool"], s["metric"]["result"]) for s in runs} == {("fast", "done")}
    replays = _query(stack.prometheus, 'sum(gateway_prewarm_requests_total{outcome="ok"})')["data"]["result"]
    assert replays and float(replays[0]["value"][1]) >= 1
    events = _query(stack.prometheus, "sum by (replica) (gateway_kv_events_received_total) > 0")["data"]["result"]
    assert len(events) == 3, "every engine's events reached the gateway"
    found = _query(stack.prometheus, "gateway_discovery_replicas")["data"]["result"]
    assert [(s["metric"]["pool"], s["value"][1]) for s in found] == [("bulk", "1")]
