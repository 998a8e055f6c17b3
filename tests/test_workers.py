"""`kvgate serve --workers N`: refused without a shared store; one port served by N processes that enforce one
limit through Redis; one /metrics holding every worker's series (labelled `worker`, each family once, accepted
by promtool); a crashed worker replaced; SIGTERM drains (a stream open at the signal ends whole) and exits 0."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.sim.testing import running_sim
from app.telemetry.workers import add_label, merge
from tests.gateway_process import KVGATE, GatewayProcess
from tests.servers import free_port

# Real processes and seconds-long waits: the slow tier (scripts/test.sh runs it after the fast one).
pytestmark = pytest.mark.slow

KEY, RPM = "sk-workers", 10
KEY2 = "sk-workers-streamer"


def config(sim: str, store: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "store": store or {"url": None},
        "models": [{"name": "m", "pools": ["main"]}],
        "pools": {"main": {"role": "interactive", "served_model": "served", "replicas": [sim],
                           "price": {"input_per_m": 0.8, "output_per_m": 2.4}}},
        "tenants": [{"id": "limited", "api_keys": [KEY], "limits": {"rpm": RPM}},
                    {"id": "streamer", "api_keys": [KEY2]}],
        "listen": {"drain_s": 5, "drain_notice_s": 0.2},
    }


# --- refusals -----------------------------------------------------------------------------------------


def test_workers_on_the_in_memory_store_are_refused_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config("http://127.0.0.1:9", None)))
    run = subprocess.run([KVGATE, "serve", "--config", str(path), "--workers", "2"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2
    assert "shared store" in run.stderr and "store.url" in run.stderr


def test_listen_workers_on_the_in_memory_store_fail_check_config(tmp_path: Path) -> None:
    raw = config("http://127.0.0.1:9", None)
    raw["listen"]["workers"] = 3
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(raw))
    run = subprocess.run([KVGATE, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "listen.workers" in run.stderr and "store.url" in run.stderr


# --- the merged exposition ----------------------------------------------------------------------------


def test_the_worker_label_goes_first_on_every_sample_whatever_its_labels() -> None:
    text = b'# HELP a_total A\n# TYPE a_total counter\na_total{reason="x}y",pool="p"} 1.0\nb 2.0\nc{} 3\n'
    assert add_label(text, "worker", "1") == [
        b"# HELP a_total A", b"# TYPE a_total counter",
        b'a_total{worker="1",reason="x}y",pool="p"} 1.0', b'b{worker="1"} 2.0', b'c{worker="1"} 3',
    ]


def test_merge_writes_each_family_once_with_every_workers_samples() -> None:
    one = b'# HELP r_total R\n# TYPE r_total counter\nr_total{t="a"} 1.0\n# HELP g G\n# TYPE g gauge\ng 5.0\n'
    two = b'# HELP r_total R\n# TYPE r_total counter\nr_total{t="a"} 2.0\nr_total{t="b"} 4.0\n'
    merged = merge([("0", one), ("1", two)]).decode()
    assert merged.count("# TYPE r_total counter") == 1
    fams = {f.name: f for f in text_string_to_metric_families(merged)}
    assert {(s.labels["worker"], s.labels["t"], s.value) for s in fams["r"].samples} == {
        ("0", "a", 1.0),
        ("1", "a", 2.0),
        ("1", "b", 4.0),
    }
    assert [(s.labels, s.value) for s in fams["g"].samples] == [({"worker": "0"}, 5.0)]


# --- real processes -----------------------------------------------------------------------------------


def _workers_seen(url: str) -> set[str]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.labels["worker"] for f in text_string_to_metric_families(text) for s in f.samples if "worker" in s.labels}


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-ww", "-o", "pid=,cmd=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line]


@pytest.fixture(scope="module")
def two_workers(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, GatewayProcess]]:
    prefix = f"kvgate-workers:{uuid.uuid4().hex[:8]}:"
    workdir = tmp_path_factory.mktemp("workers")
    # Real-time h100-8b steps: a 300-token stream lasts seconds, long enough to be open across a SIGTERM.
    with running_sim(model="served", time_scale=1.0, profile="h100-8b") as sim:
        path = workdir / "gw.yaml"
        path.write_text(yaml.safe_dump(config(sim, {"url": redis_url, "key_prefix": prefix})))
        port = free_port()
        gateway = GatewayProcess.start(["serve", "--config", str(path), "--port", str(port), "--workers", "2"],
                                       workdir / "gw.log")
        proc = gateway.proc
        url = f"http://127.0.0.1:{port}"
        try:
            gateway.wait_ready(url, timeout=90)
            deadline = time.monotonic() + 30
            while _workers_seen(url) != {"0", "1"} and time.monotonic() < deadline:
                time.sleep(0.2)
            yield url, gateway
        finally:
            if proc.poll() is None:
                children = _children(proc.pid)  # before the kill: orphans are re-parented and ps loses them
                proc.kill()
                for child in children:
                    os.kill(child, signal.SIGKILL)
            proc.wait(timeout=10)
            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(match=f"{prefix}*", count=500):
                client.delete(key)
            client.close()


async def test_the_workers_enforce_one_rpm_limit_and_share_the_connections(
    two_workers: tuple[str, GatewayProcess],
) -> None:
    url, _ = two_workers

    async def one(i: int) -> int:
        # A client per request: a new connection each, so the kernel spreads them over both workers.
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=30) as sdk:
            try:
                await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": f"hi {i}"}],
                                                  max_tokens=2)
                return 200
            except openai.RateLimitError:
                return 429

    outcomes = await asyncio.gather(*(one(i) for i in range(3 * RPM)))
    assert outcomes.count(200) == RPM and outcomes.count(429) == 2 * RPM
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics", timeout=10)).text
    per_worker: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "gateway_requests":
            for s in fam.samples:
                per_worker[s.labels["worker"]] = per_worker.get(s.labels["worker"], 0) + s.value
    assert sum(per_worker.values()) == 3 * RPM, per_worker
    assert set(per_worker) == {"0", "1"} and min(per_worker.values()) > 0, f"one worker took all: {per_worker}"


def test_every_scrape_holds_both_workers_once_per_family(two_workers: tuple[str, GatewayProcess]) -> None:
    url, _ = two_workers
    for _ in range(6):  # new connections: scrapes land on either worker
        text = httpx.get(f"{url}/metrics", timeout=10, headers={"connection": "close"}).text
        types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
        assert len(types) == len(set(types)), "a family written twice"
        assert _workers_seen(url) == {"0", "1"}
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert "error" not in (lint.stdout + lint.stderr).lower(), lint.stdout + lint.stderr


def test_a_killed_worker_is_replaced_then_sigterm_drains_all(two_workers: tuple[str, GatewayProcess]) -> None:
    url, proc = two_workers
    first = _children(proc.pid)
    assert len(first) == 2
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = _children(proc.pid)
        if len(now) == 2 and first[0] not in now and _workers_seen(url) == {"0", "1"}:
            break
        time.sleep(0.3)
    else:
        raise AssertionError("the killed worker was not replaced")
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    # A stream open when the supervisor gets SIGTERM runs to its end: every worker drains, none is cut.
    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY2, max_retries=0, timeout=60)
    stream = sdk.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "tell a long story"}], max_tokens=300, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    next(chunks)
    proc.proc.send_signal(signal.SIGTERM)
    rest = list(chunks)
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == 300
    assert proc.wait(timeout=30) == 0
    assert not _children(proc.pid)


# --- dashboards ---------------------------------------------------------------------------------------

_AGG = re.compile(
    r"\b(sum|max|min|avg|count|topk|bottomk|quantile|group|stddev|stdvar)\s*(?:(by|without)\s*\(([^)]*)\))?\s*$"
)
_METRIC = re.compile(r"\b(?:gateway|gen_ai)_[a-z0-9_]+")


def _aggregations_around(expr: str, pos: int) -> list[tuple[str, str | None, set[str]]]:
    """(operator, by/without, labels) of every aggregation whose parentheses enclose `pos`, innermost first."""
    out, depth = [], 0
    for i in range(pos - 1, -1, -1):
        if expr[i] == ")":
            depth += 1
        elif expr[i] == "(":
            if depth:
                depth -= 1
                continue
            m = _AGG.search(expr[:i])
            if m:
                mode, labels = m.group(2), m.group(3)
                if mode is None:  # `sum(...) by (labels)`: the clause after the closing parenthesis
                    close, d = i, 0
                    for j in range(i, len(expr)):
                        d += {"(": 1, ")": -1}.get(expr[j], 0)
                        if d == 0:
                            close = j
                            break
                    after = re.match(r"\s*(by|without)\s*\(([^)]*)\)", expr[close + 1 :])
                    if after:
                        mode, labels = after.group(1), after.group(2)
                out.append((m.group(1), mode, {s.strip() for s in (labels or "").split(",") if s.strip()}))
    return out


def test_every_dashboard_query_aggregates_the_worker_label_away() -> None:
    from tests.deploy.files import DASHBOARDS, dashboard_targets

    checked, bad = 0, []
    for path in DASHBOARDS:
        for title, expr in dashboard_targets(path):
            for m in _METRIC.finditer(expr):
                checked += 1
                aggs = _aggregations_around(expr, m.start())
                # The outermost aggregation decides what a panel shows: it must drop worker and instance.
                if not aggs or aggs[-1][1] == "without" or aggs[-1][2] & {"worker", "instance"}:
                    bad.append(f"{path.name} / {title}: {m.group(0)} in {expr}")
    assert checked > 30
    assert not bad, "\n".join(bad)


def test_the_dashboard_check_catches_a_query_split_by_worker() -> None:
    expr = "sum by (tenant, worker) (rate(gateway_requests_total[1m]))"
    assert _aggregations_around(expr, expr.index("gateway_"))[-1] == ("sum", "by", {"tenant", "worker"})
    assert _aggregations_around("rate(gateway_requests_total[1m])", 5) == []
    inner = "sum(rate(gateway_x_total[1m])) by (pool)"
    assert _aggregations_around(inner, inner.index("gateway_")) == [("sum", "by", {"pool"})]
