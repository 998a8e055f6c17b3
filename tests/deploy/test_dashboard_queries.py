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

import math
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from tests.deploy.files import DASHBOARDS, ROOT, dashboard_targets, dashboard_variables, prometheus_name
from tests.servers import free_port
from tests.store.redis_fixtures import RedisServer
from tests.telemetry.otlp_receiver import Received, otlp_receiver

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (apt-get install prometheus)"),
]

MODEL = "smollm2-135m"
SCRAPE_S = 1
# Values Grafana would put in; every range must hold several 1 s scrapes of the burst.
SUBSTITUTIONS = {"$__rate_interval": "1m", "$__range": "10m", "$__interval": "15s", "$tenant": ".*", "$pool": ".*"}
KEYS = {"acme": "sk-acme-test", "globex": "sk-globex-test", "tiny": "sk-tiny-test"}


@dataclass
class Stack:
    """The running processes' endpoints and what the gateway pushed over OTLP."""

    gateway: str
    prometheus: str
    otlp: Received
    logs: Path


def _events(ports: dict[str, int], sim: str) -> tuple[str, str]:
    """The KV-event PUB and replay ports of a sim, as the gateway connects to them."""
    return f"tcp://127.0.0.1:{ports[sim + '-kv']}", f"tcp://127.0.0.1:{ports[sim + '-replay']}"


def _gateway_config(ports: dict[str, int], otlp: str, store: dict[str, Any]) -> dict[str, Any]:
    price = {"gpu_hour_usd": 2.50, "gpus": 1}
    fast = [
        {"url": f"http://127.0.0.1:{ports[sim]}", "kv_events": _events(ports, sim)[0],
         "kv_replay": _events(ports, sim)[1], "kv_topic": "kv"}
        for sim in ("vllm-fast", "vllm-fast-2")
    ]  # fmt: skip
    return {
        "listen": {"host": "127.0.0.1", "port": ports["gateway"]},
        "store": store,
        "models": [{"name": MODEL, "pools": ["fast", "bulk"]}],
        "pools": {
            "fast": {
                "role": "interactive",
                "served_model": MODEL,
                # The second replica's engine starts after the traffic: it joins, and is pre-warmed.
                "replicas": fast,
                "priority_scheduling": True,
                "price": {**price, "capacity_tokens_per_s": 1500},
            },
            "bulk": {
                "role": "bulk",
                "served_model": MODEL,
                # Found by discovery (an address resolves to itself), for the discovery panels.
                "discovery": {
                    "dns": f"127.0.0.1:{ports['vllm-bulk']}",
                    "interval_s": 0.5,
                    "kv_events": {
                        "endpoint": f"tcp://{{host}}:{ports['vllm-bulk-kv']}",
                        "replay": f"tcp://{{host}}:{ports['vllm-bulk-replay']}",
                        "topic": "kv",
                    },
                },
                # Unattainable TTFT SLO: once bulk has a TTFT estimate it counts as saturated, so bulk
                # requests borrow the idle fast pool and the spill-over panel has something to show.
                "ttft_slo_ms": 0.001,
                "admission": {"enabled": True},  # the queue panels need its metrics (fast path here)
                "price": {**price, "capacity_tokens_per_s": 6000},
            },
        },
        "tenants": [
            {"id": "acme", "api_keys": [KEYS["acme"]], "default_class": "interactive", "normalize": "on"},
            {"id": "globex", "api_keys": [KEYS["globex"]], "default_class": "bulk", "normalize": "observe"},
            {"id": "tiny", "api_keys": [KEYS["tiny"]], "limits": {"rpm": 2}},
        ],
        "auth": {"required": True},
        "telemetry": {"otlp_endpoint": otlp, "service_name": "kvgate", "metric_export_interval_s": 1},
        "routing": {"probe_interval_s": 0.2, "healthy_after": 1, "unhealthy_after": 2},
    }


def _prometheus_config(ports: dict[str, int]) -> dict[str, Any]:
    """config/prometheus.yml with each compose hostname pointed at the loopback port standing in for it."""
    cfg = yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = f"{SCRAPE_S}s"
    cfg["global"]["evaluation_interval"] = f"{SCRAPE_S}s"
    for job in cfg["scrape_configs"]:
        for sc in job["static_configs"]:
            sc["targets"] = [f"127.0.0.1:{ports[t.split(':')[0]]}" for t in sc["targets"]]
    return cfg


def _spawn(es: ExitStack, logs: Path, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    log = (logs / f"{name}.log").open("wb")
    es.callback(log.close)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ})

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    es.callback(stop)
    return proc


def _wait_http(url: str, proc: subprocess.Popen[bytes], logs: Path, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{(logs / f'{name}.log').read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{name} not ready at {url}:\n{(logs / f'{name}.log').read_text()[-3000:]}")


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
        )  # fmt: skip
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


def _join_a_replica(es: ExitStack, logs: Path, kvgate: list[str], ports: dict[str, int], gateway: str) -> None:
    """Start the fast pool's second engine after more distinct prefixes were routed (under prefix affinity it is
    warmed with those it becomes the home of, about half), and wait for its pre-warm to end."""
    for i in range(8):
        _chat(gateway, "acme", "interactive", 20 + i, stream=False)
    proc = _spawn(es, logs, "sim-fast-2", _sim_argv(kvgate, ports, "vllm-fast-2", []))
    _wait_http(f"http://127.0.0.1:{ports['vllm-fast-2']}/health", proc, logs, "sim-fast-2")
    deadline = time.monotonic() + 30
    while "gateway_prewarm_runs_total{" not in httpx.get(f"{gateway}/metrics", timeout=5).text:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no pre-warm run:\n{(logs / 'gateway.log').read_text()[-3000:]}")
        time.sleep(0.5)


def _sim_argv(kvgate: list[str], ports: dict[str, int], sim: str, extra: list[str]) -> list[str]:
    """A sim that publishes KV events and answers replays, as the shipped engines do."""
    return [
        *kvgate, "sim", "--port", str(ports[sim]), "--model", MODEL, "--profile", "h100-8b", *extra,
        "--kv-events", f"tcp://*:{ports[sim + '-kv']}", "--kv-replay", f"tcp://*:{ports[sim + '-replay']}",
        "--kv-topic", "kv",
    ]  # fmt: skip


def _query(prom: str, expr: str) -> dict[str, Any]:
    r = httpx.post(f"{prom}/api/v1/query", data={"query": expr}, timeout=10)
    body: dict[str, Any] = r.json()
    return body


@contextmanager
def _redis(workdir: Path) -> Iterator[dict[str, Any]]:
    """The gateway's store as in compose: Redis (REDIS_URL under a key prefix of our own, else a
    throwaway redis-server with AOF on); our keys are deleted afterwards."""
    url = os.environ.get("REDIS_URL")
    server = None
    if not url:
        server = RedisServer(workdir, appendonly=True)
        server.start()
        url = server.url
    prefix = f"kvgate-deploy-test:{uuid.uuid4().hex[:12]}:"
    try:
        yield {"url": url, "key_prefix": prefix}
    finally:
        client = redis.Redis.from_url(url)
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            client.delete(key)
        client.close()
        if server is not None:
            server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("deploy-stack")
    sims = ("vllm-fast", "vllm-fast-2", "vllm-bulk")
    names = ("gateway", "localhost", *sims, *(f"{n}-kv" for n in sims), *(f"{n}-replay" for n in sims))
    ports = {name: free_port() for name in names}
    ports["otel-collector"] = ports["gateway"]  # the gateway's /metrics stands in for the collector exporter
    kvgate = [sys.executable, "-m", "app.cli"]
    with ExitStack() as es, otlp_receiver() as (otlp_url, received), _redis(logs) as store:
        running = {}
        for pool, extra in (
            ("fast", ["--speculative", "ngram:3:0.7", "--scheduling-policy", "priority"]),
            ("bulk", []),
        ):
            argv = _sim_argv(kvgate, ports, f"vllm-{pool}", extra)
            running[pool] = (_spawn(es, logs, f"sim-{pool}", argv), ports[f"vllm-{pool}"])
        for pool, (proc, port) in running.items():
            _wait_http(f"http://127.0.0.1:{port}/health", proc, logs, f"sim-{pool}")
        cfg_path = logs / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(_gateway_config(ports, otlp_url, store)))
        gw = _spawn(es, logs, "gateway", [*kvgate, "serve", "--config", str(cfg_path)])
        gateway = f"http://127.0.0.1:{ports['gateway']}"
        _wait_http(f"{gateway}/ready", gw, logs, "gateway")
        prom_cfg = logs / "prometheus.yml"
        prom_cfg.write_text(yaml.safe_dump(_prometheus_config(ports)))
        prom_argv = [
            "prometheus", f"--config.file={prom_cfg}", f"--storage.tsdb.path={logs / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{ports['localhost']}", "--log.level=warn",
        ]  # fmt: skip
        prom = _spawn(es, logs, "prometheus", prom_argv)
        prometheus = f"http://127.0.0.1:{ports['localhost']}"
        _wait_http(f"{prometheus}/-/ready", prom, logs, "prometheus")
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


def _substitute(expr: str) -> str:
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    return expr


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


def test_every_dashboard_query_parses_and_returns_data(stack: Stack) -> None:
    failures = []
    evaluated = 0
    for path in DASHBOARDS:
        for title, expr in dashboard_targets(path):
            body = _query(stack.prometheus, _substitute(expr))
            evaluated += 1
            if body.get("status") != "success":
                failures.append(f"{path.name} / {title}: {body.get('error')}\n    {expr}")
            elif not body["data"]["result"]:
                failures.append(f"{path.name} / {title}: no data\n    {expr}")
            elif not _finite(body["data"]["result"]):
                failures.append(f"{path.name} / {title}: only NaN/Inf\n    {expr}")
    assert evaluated > 30
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
    }  # fmt: skip
    # One gateway process on Redis: it shares, finds no other process, and keeps its own view.
    alone = _query(stack.prometheus, 'sum(gateway_peer_load_exchanges_total{outcome="alone"})')["data"]["result"]
    assert alone and float(alone[0]["value"][1]) >= 1
    processes = _query(stack.prometheus, "max(gateway_peer_load_processes)")["data"]["result"]
    assert processes[0]["value"][1] == "1"


def test_prewarm_and_kv_event_panels_show_a_real_run_and_real_events(stack: Stack) -> None:
    # A zero rate is data too: these pin that the stack really pre-warmed a replica and streamed events.
    runs = _query(stack.prometheus, "sum by (pool, result) (gateway_prewarm_runs_total)")["data"]["result"]
    assert {(s["metric"]["pool"], s["metric"]["result"]) for s in runs} == {("fast", "done")}
    replays = _query(stack.prometheus, 'sum(gateway_prewarm_requests_total{outcome="ok"})')["data"]["result"]
    assert replays and float(replays[0]["value"][1]) >= 1
    events = _query(stack.prometheus, "sum by (replica) (gateway_kv_events_received_total) > 0")["data"]["result"]
    assert len(events) == 3, "every engine's events reached the gateway"
    found = _query(stack.prometheus, "gateway_discovery_replicas")["data"]["result"]
    assert [(s["metric"]["pool"], s["value"][1]) for s in found] == [("bulk", "1")]
