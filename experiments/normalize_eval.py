"""Issue 4: prompt normalization off vs on vs the no-volatile ceiling, side by side, through the gateway.

Four arms, each run through one `kvgate serve` the script starts (one pool holding every upstream,
`prefix_affinity`), each after POST /reset_prefix_cache on every upstream:

  off      the bench's `agent` workload (timestamp + ids on top of the system prompt, tools with shuffled key
           order), tenant normalize: off
  on       the same requests, tenant normalize: on, its volatility memory cold (a new tenant)
  on-warm  the same, after one request of an unmeasured session taught the tenant's memory (sent before the
           cache reset): a tenant in steady state, e.g. one that ran in `observe` first
  ceiling  `agent-static` (no volatile header, tools byte-identical), tenant normalize: off. Off, so the
           ceiling measures the workload, not the gateway: it is what a cache-friendly client sends.

Every arm replays the same sessions (same bench seed) in the same issue order: a closed loop of
`--concurrency` slots whose order is fixed up front (round robin over the active sessions, a new session
taking the place of a finished one), a turn waiting for its session's previous reply. Output lengths are
pinned (`ignore_eos`, `temperature: 0`), so the arms generate the same number of tokens.

Per arm it prints: the prefix-cache hit ratio from each upstream's own /metrics (Δvllm:prefix_cache_hits /
Δvllm:prefix_cache_queries, summed over upstreams), Σcached/Σprompt from the responses' usage, TTFT p50/p99,
throughput, $/M tokens (GPU $/h over the run's time, the bench's reckoning), the ratio of each to the
ceiling, the gateway's gateway_normalize_moved_spans_total (Δ per arm) and the `x-kvgate-normalized` header
of one probe request sent after the arm's counters were read.

Targets:
  vllm  the real vLLM-CPU servers already running (scripts/vllm-cpu.sh: :8001 and :8002). Keep it small:
        they do ~25 tok/s single stream and others use them too. The Δqueries - Σprompt column shows
        prompt tokens of other clients that landed in the window (0 = the counters are ours alone).
  sim   four `kvgate sim --profile h100-8b` processes the script starts; their clock runs at
        --sim-time-scale, and every duration is converted back to modeled (H100) time.

    .venv/bin/python experiments/normalize_eval.py --offline         # both targets + decomposition (about 9 min)
    .venv/bin/python experiments/normalize_eval.py --target vllm --json /tmp/normalize-eval.json
    .venv/bin/python experiments/normalize_eval.py --target sim --sim-sessions 16 --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.bench.client import BenchClient  # noqa: E402
from app.bench.report import BenchResult, rescaled, summarize  # noqa: E402
from app.bench.spec import BenchSpec, Pricing, RequestRecord  # noqa: E402
from app.bench.workloads import Session, Workload, WorkloadOptions  # noqa: E402
from kvlab.net import free_port  # noqa: E402

GPU_HOUR_USD = 2.50  # per replica, the gateway config's example price
VLLM_REPLICAS = ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
_SAMPLE_RX = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|\+Inf|-Inf)$")


@dataclass(frozen=True)
class Arm:
    """One arm: which workload, the tenant's normalize mode, and whether its memory starts warm."""

    name: str
    workload: str
    normalize: str
    warm: bool = False  # one request of an unmeasured session goes first (a tenant in steady state)
    attempt: int = 0  # a rerun gets a fresh tenant, so its volatility memory starts as cold as the first

    @property
    def tenant(self) -> str:
        """The gateway tenant this arm runs as (its own cache_salt and volatility memory)."""
        return f"eval-{self.name}-{self.attempt}"

    @property
    def api_key(self) -> str:
        """The tenant's dev key."""
        return f"sk-eval-{self.name}-{self.attempt}"


ARMS = (
    Arm("off", "agent", "off"),
    Arm("on", "agent", "on"),
    Arm("on-warm", "agent", "on", warm=True),
    Arm("ceiling", "agent-static", "off"),
)
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Target:
    """Where the arms run and how much load they send."""

    name: str
    model: str
    sessions: int
    max_turns: int
    max_tokens: int
    concurrency: int
    time_scale: float = 1.0  # the upstream clock runs this many times faster than real time
    capacity_tokens_per_s: float = 1500.0  # only to satisfy the pool price schema; the bench prices GPU time


@dataclass
class ArmResult:
    """What one arm measured."""

    arm: Arm
    result: BenchResult
    hits: float
    queries: float
    foreign_queries: float  # Δqueries beyond our own Σprompt (other clients' traffic)
    moved: dict[str, float]
    header: str
    per_turn: dict[int, tuple[int, int]]  # turn -> (Σcached, Σprompt)
    per_upstream: dict[str, tuple[float, float]]  # url -> (Δhits, Δqueries)
    sim_lateness_s: float | None = None
    real_wall_s: float = 0.0
    resets: list[str] = field(default_factory=list)

    @property
    def hit_ratio(self) -> float | None:
        """Δhits/Δqueries over every upstream."""
        return self.hits / self.queries if self.queries else None


# -- processes -------------------------------------------------------------------------------------



def _wait_healthy(proc: subprocess.Popen[bytes], url: str, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"{what} exited: {err[-800:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not healthy after {timeout_s:.0f} s")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def sim_processes(n: int, model: str, time_scale: float) -> Iterator[list[str]]:
    """`n` x `kvgate sim --profile h100-8b` in child processes; yields their base URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for _ in range(n):
            port = free_port()
            cmd = [sys.executable, "-m", "app.cli", "sim", "--port", str(port), "--profile", "h100-8b",
                   "--model", model, "--time-scale", str(time_scale)]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls, strict=True):
            _wait_healthy(proc, url + "/health", "kvgate sim")
        yield urls
    finally:
        for proc in procs:
            _stop(proc)


def gateway_config(target: Target, replicas: list[str]) -> dict[str, Any]:
    """One model, one pool over every upstream (prefix_affinity), one tenant per arm."""
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": target.model, "pools": ["main"]}],
        "pools": {"main": {
            "role": "interactive", "served_model": target.model, "replicas": replicas, "policy": "prefix_affinity",
            "price": {"gpu_hour_usd": GPU_HOUR_USD, "gpus": 1, "capacity_tokens_per_s": target.capacity_tokens_per_s},
        }},
        "tenants": [{"id": a.tenant, "api_keys": [a.api_key], "default_class": "interactive",
                     "normalize": a.normalize}
                    for arm in ARMS for a in (replace(arm, attempt=k) for k in range(MAX_ATTEMPTS))],
        "auth": {"required": True},
        "upstream": {"read_timeout_s": 600},
    }


@contextlib.contextmanager
def gateway_process(cfg: dict[str, Any]) -> Iterator[str]:
    """`kvgate serve` on a free port with `cfg`; yields its base URL once every replica is healthy."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        cmd = [sys.executable, "-m", "app.cli", "serve", "--config", str(path), "--port", str(port)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, base + "/ready", "kvgate serve")
            yield base
        finally:
            _stop(proc)


# -- metrics ---------------------------------------------------------------------------------------


def parse_samples(text: str) -> list[tuple[str, str, float]]:
    """(name, labels, value) of every sample in a Prometheus text body."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE_RX.match(line)
        if m:
            out.append((m.group(1), m.group(2) or "", float(m.group(3))))
    return out


def counter_sum(samples: list[tuple[str, str, float]], name: str) -> float:
    """A counter summed over its label sets."""
    return sum(v for n, _, v in samples if n == name)


def moved_by_rule(samples: list[tuple[str, str, float]], tenant: str) -> dict[str, float]:
    """gateway_normalize_moved_spans_total of one tenant, by rule."""
    out: dict[str, float] = {}
    for n, labels, v in samples:
        if n == "gateway_normalize_moved_spans_total" and f'tenant="{tenant}"' in labels:
            m = re.search(r'rule="([^"]*)"', labels)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


async def scrape(http: aiohttp.ClientSession, url: str) -> list[tuple[str, str, float]]:
    """One /metrics body, parsed."""
    async with http.get(url + "/metrics") as resp:
        return parse_samples(await resp.text())


async def upstream_counters(http: aiohttp.ClientSession, replicas: list[str]) -> dict[str, float]:
    """Prefix-cache counters and sim lateness summed over the upstreams (and hits/queries of each)."""
    totals = {"hits": 0.0, "queries": 0.0, "lateness": 0.0}
    for url in replicas:
        s = await scrape(http, url)
        hits = counter_sum(s, "vllm:prefix_cache_hits_total")
        queries = counter_sum(s, "vllm:prefix_cache_queries_total")
        totals["hits"] += hits
        totals["queries"] += queries
        totals[f"hits {url}"] = hits
        totals[f"queries {url}"] = queries
        totals["lateness"] += counter_sum(s, "kvgate_sim_step_lateness_seconds")
    return totals


async def reset_prefix_caches(http: aiohttp.ClientSession, replicas: list[str], wait_s: float = 60) -> list[str]:
    """POST /reset_prefix_cache on every upstream, retrying while the engine refuses (blocks in use)."""
    notes = []
    for url in replicas:
        deadline = time.monotonic() + wait_s
        tries = 0
        while True:
            tries += 1
            async with http.post(url + "/reset_prefix_cache") as resp:
                raw = await resp.read()
            ok = resp.status == 200
            with contextlib.suppress(orjson.JSONDecodeError):
                doc = orjson.loads(raw) if raw else None
                if isinstance(doc, dict) and doc.get("success") is False:
                    ok = False
            if ok:
                notes.append(f"{url}: reset ok" + (f" after {tries} tries" if tries > 1 else ""))
                break
            if time.monotonic() > deadline:
                notes.append(f"{url}: reset REFUSED ({resp.status} {raw[:80]!r})")
                break
            await asyncio.sleep(1.0)
    return notes


# -- the driver ------------------------------------------------------------------------------------


def make_sessions(arm: Arm, target: Target, seed: int) -> list[Session]:
    """The arm's sessions, at most `max_turns` turns each (the same sessions in every arm, bar the workload)."""
    options = WorkloadOptions(seed=seed, api_key=arm.api_key, max_tokens=target.max_tokens)
    # Sessions come from `agent` in every arm: `agent-static` seeds its RNG by its own name, so it would draw
    # other user turns and turn counts. The ceiling is the same sessions with agent-static's two switches off.
    workload = Workload("agent", options)
    sessions = []
    for i in range(target.sessions):
        s = workload.session(i)
        s.user_turns = s.user_turns[: target.max_turns]
        if arm.workload == "agent-static":
            s.volatile_header = s.shuffle_tools = False
        s.extra_body = {**s.extra_body, "ignore_eos": True, "temperature": 0}
        sessions.append(s)
    return sessions


def issue_order(turns: list[int], concurrency: int) -> list[tuple[int, int]]:
    """(session, turn) in the order a closed loop of `concurrency` slots issues them when every request
    takes as long: round robin over the active sessions, the next session replacing a finished one."""
    active: deque[int] = deque(range(min(concurrency, len(turns))))
    upcoming = iter(range(len(active), len(turns)))
    sent = [0] * len(turns)
    order = []
    while active:
        s = active.popleft()
        order.append((s, sent[s]))
        sent[s] += 1
        if sent[s] < turns[s]:
            active.append(s)
        else:
            nxt = next(upcoming, None)
            if nxt is not None:
                active.append(nxt)
    return order


async def drive(base: str, target: Target, sessions: list[Session]) -> tuple[list[RequestRecord], float]:
    """Send every turn in the fixed issue order, at most `concurrency` in flight; records and wall time."""
    client = BenchClient(base, target.concurrency + 2, timeout_s=600)
    order = issue_order([len(s.user_turns) for s in sessions], target.concurrency)
    slots = asyncio.Semaphore(target.concurrency)
    done = {i: asyncio.Event() for i in range(len(sessions))}
    for e in done.values():
        e.set()
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []
    t0 = time.perf_counter()

    async def one(s: Session, rec: RequestRecord) -> None:
        try:
            req = s.next_request(target.model, stream=True)
            text = await client.send(req, rec, t0)
            s.record_reply(text)
        finally:
            slots.release()
            done[s.index].set()

    try:
        for index, (si, turn) in enumerate(order):
            s = sessions[si]
            await done[si].wait()  # the previous turn's reply is part of this turn's history
            await slots.acquire()
            done[si].clear()
            assert s.turn == turn
            rec = RequestRecord(index=index, session=si, turn=turn, tenant=0, route_class="interactive")
            records.append(rec)
            tasks.append(asyncio.create_task(one(s, rec)))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    return records, time.perf_counter() - t0


async def send_one(
    http: aiohttp.ClientSession, base: str, arm: Arm, target: Target, seed: int, index: int
) -> str:
    """Send the first turn of session `index` (max_tokens 1, not streamed); its x-kvgate-normalized header."""
    s = make_sessions(arm, replace(target, sessions=index + 1), seed)[index]
    body = s.next_request(target.model, stream=False).body
    body["max_tokens"] = 1
    headers = {"Authorization": f"Bearer {arm.api_key}"}
    async with http.post(base + "/v1/chat/completions", json=body, headers=headers) as resp:
        await resp.read()
        return resp.headers.get("x-kvgate-normalized", "(absent)") + f" (HTTP {resp.status})"


async def wait_idle(http: aiohttp.ClientSession, replicas: list[str], wait_s: float = 60) -> bool:
    """Wait until no upstream runs or queues a request (other clients share the real servers)."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = 0.0
        for url in replicas:
            s = await scrape(http, url)
            busy += counter_sum(s, "vllm:num_requests_running") + counter_sum(s, "vllm:num_requests_waiting")
        if busy == 0:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1.0)


async def run_arm(
    http: aiohttp.ClientSession, base: str, replicas: list[str], arm: Arm, target: Target, seed: int
) -> ArmResult:
    """Reset every upstream's prefix cache, replay the sessions, and read the counters around it."""
    if arm.warm:  # before the reset: only the tenant's volatility memory keeps anything of it
        await send_one(http, base, arm, target, seed, target.sessions)
    idle = await wait_idle(http, replicas)
    resets = await reset_prefix_caches(http, replicas)
    if not idle:
        resets.append("upstreams still busy with other clients after 60 s")
    before = await upstream_counters(http, replicas)
    moved0 = moved_by_rule(await scrape(http, base), arm.tenant)
    started = time.perf_counter()
    records, wall = await drive(base, target, make_sessions(arm, target, seed))
    real_wall = time.perf_counter() - started
    await asyncio.sleep(0.5)  # let the engines' counters catch up with the last request
    after = await upstream_counters(http, replicas)
    moved1 = moved_by_rule(await scrape(http, base), arm.tenant)
    header = await send_one(http, base, arm, target, seed, 0)  # after the counters: a probe for the header
    spec = BenchSpec(base_url=base, workload=arm.workload, model=target.model, concurrency=target.concurrency,
                     requests=len(records), seed=seed, max_tokens=target.max_tokens,
                     pricing=Pricing(gpu_hour_usd=GPU_HOUR_USD, gpus=len(replicas)))
    result = rescaled(BenchResult(spec=spec, records=records, summary=summarize(records, wall, spec)),
                      target.time_scale)
    ok = [r for r in records if r.ok]
    per_turn: dict[int, tuple[int, int]] = {}
    for r in ok:
        c, p = per_turn.get(r.turn, (0, 0))
        per_turn[r.turn] = (c + r.cached_tokens, p + r.prompt_tokens)
    queries = after["queries"] - before["queries"]
    return ArmResult(
        arm=arm, result=result, hits=after["hits"] - before["hits"], queries=queries,
        foreign_queries=queries - sum(r.prompt_tokens for r in ok),
        moved={k: v - moved0.get(k, 0.0) for k, v in moved1.items() if v - moved0.get(k, 0.0)},
        header=header, per_turn=per_turn,
        per_upstream={u: (after[f"hits {u}"] - before[f"hits {u}"], after[f"queries {u}"] - before[f"queries {u}"])
                      for u in replicas},
        sim_lateness_s=(after["lateness"] - before["lateness"]) if target.name.startswith("sim") else None,
        real_wall_s=real_wall, resets=resets,
    )


# -- output ----------------------------------------------------------------------------------------


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _of(v: float | None, ceiling: float | None) -> str:
    return "-" if v is None or not ceiling else f"{v / ceiling * 100:.0f}%"


def markdown_table(target: Target, results: list[ArmResult], replicas: int) -> str:
    """One target's table (every arm against the ceiling) plus the notes that explain it."""
    ceil = next(r for r in results if r.arm.name == "ceiling")
    cs = ceil.result.summary
    rows = [
        "| arm | requests | hit ratio (vLLM /metrics) | of ceiling | Σcached / Σprompt | of ceiling "
        "| Σcached tokens | of ceiling | TTFT p50 / p99 ms | total tok/s | $/M tokens | vs ceiling |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        s = r.result.summary
        per_m = s.cost.usd_per_m_total
        rows.append(
            f"| {r.arm.name} | {s.ok}/{s.requests} | {_pct(r.hit_ratio)} | {_of(r.hit_ratio, ceil.hit_ratio)} "
            f"| {_pct(s.cached_ratio)} | {_of(s.cached_ratio, cs.cached_ratio)} "
            f"| {s.cached_tokens:,} / {s.prompt_tokens:,} | {_of(s.cached_tokens, cs.cached_tokens)} "
            f"| {_ms(s.ttft_ms.p50)} / {_ms(s.ttft_ms.p99)} | {s.total_tokens_per_s:,.0f} "
            f"| {'-' if per_m is None else f'${per_m:,.3f}'} | {_of(per_m, cs.cost.usd_per_m_total)} |"
        )
    head = (f"**{target.name}** — {replicas} upstream(s) in one `prefix_affinity` pool, {target.sessions} sessions "
            f"x up to {target.max_turns} turns, {target.concurrency} concurrent, {target.max_tokens} output tokens "
            f"(ignore_eos, temperature 0)" + (f", sim clock x{target.time_scale:g} (times converted back to modeled "
                                             f"time)" if target.time_scale != 1.0 else "") + "\n\n")
    notes = []
    for r in results:
        turns = ", ".join(f"t{t}: {_pct(c / p if p else None)}" for t, (c, p) in sorted(r.per_turn.items()))
        moved = ", ".join(f"{k}={v:.0f}" for k, v in sorted(r.moved.items())) or "none"
        extra = f"; Δqueries - Σprompt = {r.foreign_queries:+,.0f}"
        if r.sim_lateness_s is not None and r.real_wall_s:
            extra += f"; sim lag {r.sim_lateness_s / (r.real_wall_s * replicas) * 100:.0f}% of wall per replica"
        spread = ", ".join(f"{u.rsplit(':', 1)[-1]} {h:,.0f}/{q:,.0f}" for u, (h, q) in r.per_upstream.items())
        notes.append(f"- {r.arm.name}: `x-kvgate-normalized: {r.header}`; moved spans (gateway /metrics): {moved}; "
                     f"cached by turn: {turns}; hits/queries by upstream port: {spread}{extra}")
    return head + "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


# -- offline decomposition -------------------------------------------------------------------------

SMOLLM2_TOKENIZER = Path.home() / ".cache" / "kvgate" / "models" / "smollm2-135m" / "tokenizer.json"
_REPLY = "I checked the service logs, updated the ticket and will report back shortly."  # same in every arm


def _bodies(variant: str, sessions: int, turns: int, seed: int, order: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The bodies the gateway sends upstream for one arm, in issue order, with a fixed reply per turn.

    variant: off | on | on-warm (the tenant's memory has seen one earlier session) | ceiling.
    """
    from app.config import ModelConfig
    from app.context import Tenant
    from app.normalize import VolatilityMemory, normalize

    arm = ARMS[3] if variant == "ceiling" else ARMS[0]
    target = Target("offline", "m", sessions, turns, 16, 1)
    sess = make_sessions(arm, target, seed)
    memory = VolatilityMemory()
    tenant = Tenant(id="t", normalize="on")
    model = ModelConfig(name="m", pools=["p"])
    now = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    if variant == "on-warm":
        warm = make_sessions(arm, replace(target, sessions=sessions + 1), seed)[-1]
        normalize(warm.next_request("m", stream=True).body, operation="chat", tenant=tenant, model=model,
                  memory=memory, opt_out=False, now=now)
    out = []
    for si, _turn in order:
        body = sess[si].next_request("m", stream=True).body
        if variant.startswith("on"):
            body, _ = normalize(body, operation="chat", tenant=tenant, model=model, memory=memory, opt_out=False,
                                now=now)
        out.append(body)
        sess[si].record_reply(_REPLY)
    return out


def offline_hits(variant: str, sessions: int, turns: int, seed: int, block: int, *, tools: bool,
                 tokenizer: str | None) -> tuple[int, int]:
    """(Σcached, Σprompt) tokens for one arm on one unlimited prefix cache of chained `block`-token hashes:
    full blocks only, lookup capped at n - 1 tokens, as vLLM's V1 block pool (generated blocks not counted)."""
    from app.sim.template import render_chat
    from app.sim.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    order = issue_order([min(turns, len(s.user_turns)) for s in
                         make_sessions(ARMS[0], Target("offline", "m", sessions, turns, 16, 1), seed)], 1)
    cache: set[int] = set()
    cached = total = 0
    for body in _bodies(variant, sessions, turns, seed, order):
        ids = tok.encode(render_chat(body["messages"], tools=body.get("tools") if tools else None))
        total += len(ids)
        parent = 0
        matching = True
        for b in range(len(ids) // block):
            parent = hash((parent, tuple(ids[b * block : (b + 1) * block])))
            if matching and (b + 1) * block <= len(ids) - 1 and parent in cache:
                cached += block
            else:
                matching = False
            cache.add(parent)
    return cached, total


def offline_table(sessions: int, turns: int, seed: int) -> str:
    """Hit ratios of every arm with the real template (no tools, SmolLM2 tokenizer) at 128- and 16-token
    blocks, and with the sim's template (tools rendered, its tokenizer) at 16: what the block size, the
    tenant's first request and the tail block each cost."""
    tokenizer = str(SMOLLM2_TOKENIZER) if SMOLLM2_TOKENIZER.exists() else None
    setups = [("SmolLM2 template+tokenizer, 128-token blocks (vLLM-CPU)", 128, False, tokenizer),
              ("SmolLM2 template+tokenizer, 16-token blocks (vLLM on GPU)", 16, False, tokenizer),
              ("sim template (tools rendered) + sim tokenizer, 16-token blocks", 16, True, None)]
    rows = ["| setup | off | on | on, warm tenant | ceiling | on / ceiling (ratio) | on / ceiling (cached tokens) "
            "| on-warm / ceiling (cached tokens) |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for name, block, tools, tk in setups:
        res = {v: offline_hits(v, sessions, turns, seed, block, tools=tools, tokenizer=tk)
               for v in ("off", "on", "on-warm", "ceiling")}
        ratio = {v: c / t for v, (c, t) in res.items()}
        rows.append(f"| {name} | {_pct(ratio['off'])} | {_pct(ratio['on'])} | {_pct(ratio['on-warm'])} "
                    f"| {_pct(ratio['ceiling'])} | {_of(ratio['on'], ratio['ceiling'])} "
                    f"| {_of(res['on'][0], res['ceiling'][0])} | {_of(res['on-warm'][0], res['ceiling'][0])} |")
    return (f"**offline** — the exact bodies the gateway sends ({sessions} sessions x up to {turns} turns, one "
            f"unlimited cache, a fixed reply per turn)\n\n" + "\n".join(rows) + "\n")


# -- main ------------------------------------------------------------------------------------------


async def evaluate(
    base: str, replicas: list[str], target: Target, seed: int, foreign_retries: int
) -> list[ArmResult]:
    """The three arms, one after the other, against one gateway; an arm whose counter window caught other
    clients' prompts runs again (at most `foreign_retries` times)."""
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        for arm in ARMS:
            for attempt in range(min(1 + foreign_retries, MAX_ATTEMPTS)):
                print(f"[{datetime.now(UTC):%H:%M:%S}] {target.name}: arm {arm.name} ...", file=sys.stderr)
                r = await run_arm(http, base, replicas, replace(arm, attempt=attempt), target, seed)
                for note in r.resets:
                    print(f"    {note}", file=sys.stderr)
                if r.foreign_queries == 0:
                    break
                # Another client's prompts landed in our window: its hits and misses are in the counters.
                print(f"    {r.foreign_queries:+,.0f} foreign prompt tokens in the window"
                      + ("; running the arm again" if attempt + 1 < min(1 + foreign_retries, MAX_ATTEMPTS)
                         else "; kept (flagged)"),
                      file=sys.stderr)
            results.append(r)
    return results


def run_target(
    target: Target, replicas: list[str] | None, seed: int, foreign_retries: int = 2
) -> tuple[str, list[ArmResult]]:
    """Start the gateway (and sims), run the arms, return the markdown table."""
    with contextlib.ExitStack() as stack:
        if replicas is None:
            replicas = stack.enter_context(sim_processes(4, target.model, target.time_scale))
        base = stack.enter_context(gateway_process(gateway_config(target, replicas)))
        results = asyncio.run(evaluate(base, replicas, target, seed, foreign_retries))
    return markdown_table(target, results, len(replicas)), results


def main() -> int:
    """CLI entry."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=["vllm", "sim", "both", "none"], default="both")
    p.add_argument("--offline", action="store_true",
                   help="also print the offline decomposition (tokenized bodies, chained block hashes)")
    p.add_argument("--foreign-retries", type=int, default=2,
                   help="rerun an arm when other clients' prompts landed in its counter window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm-sessions", type=int, default=6)
    p.add_argument("--vllm-turns", type=int, default=4)
    p.add_argument("--vllm-max-tokens", type=int, default=16)
    p.add_argument("--vllm-concurrency", type=int, default=2)
    p.add_argument("--sim-sessions", type=int, default=64)
    p.add_argument("--sim-turns", type=int, default=6)
    p.add_argument("--sim-max-tokens", type=int, default=64)
    p.add_argument("--sim-concurrency", type=int, default=16)
    p.add_argument("--sim-time-scale", type=float, default=0.25,
                   help="the sims' clock speed (< 1: slower than real time, so this host keeps up)")
    p.add_argument("--json", default=None, help="write every arm's summary here")
    args = p.parse_args()

    started = datetime.now(UTC)
    blocks: list[str] = []
    dump: list[dict[str, Any]] = []
    plan: list[tuple[Target, list[str] | None]] = []
    if args.target in ("vllm", "both"):
        plan.append((Target("vllm-cpu", "smollm2-135m", args.vllm_sessions, args.vllm_turns, args.vllm_max_tokens,
                            args.vllm_concurrency), list(VLLM_REPLICAS)))
    if args.target in ("sim", "both"):
        plan.append((Target("sim h100-8b", "llama-3.1-8b", args.sim_sessions, args.sim_turns, args.sim_max_tokens,
                            args.sim_concurrency, time_scale=args.sim_time_scale, capacity_tokens_per_s=6000),
                     None))
    errors = 0
    for target, replicas in plan:
        block, results = run_target(target, replicas, args.seed, args.foreign_retries)
        print(block, flush=True)
        blocks.append(block)
        for r in results:
            errors += r.result.summary.errors
            d = r.result.to_dict(records=True)
            d["extra"] = {"target": target.name, "arm": r.arm.name, "hits": r.hits, "queries": r.queries,
                          "foreign_queries": r.foreign_queries, "moved": r.moved, "header": r.header,
                          "per_turn": {str(k): v for k, v in r.per_turn.items()},
                          "per_upstream": r.per_upstream, "real_wall_s": r.real_wall_s, "resets": r.resets}
            dump.append(d)
    if args.offline:
        for sessions, turns in ((args.vllm_sessions, args.vllm_turns), (args.sim_sessions, args.sim_turns)):
            block = offline_table(sessions, turns, args.seed)
            print(block, flush=True)
    print(f"Run {started:%Y-%m-%d %H:%M} UTC, {(datetime.now(UTC) - started).total_seconds():.0f} s wall; "
          f"$/M = {GPU_HOUR_USD:.2f} $/h per upstream x run time / all tokens.")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(dump, option=orjson.OPT_INDENT_2))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
