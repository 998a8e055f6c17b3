"""Issue 15: a light tenant next to a heavy one (10x its rate) on one saturated pool of h100-8b sims.

Arms, each on freshly started sims, same seeded arrivals:
  alone       the light tenant only (its TTFT is the baseline)
  no_queue    both tenants sent straight to the sims (today: vLLM's FCFS queue)
  priority    both, sims run --scheduling-policy priority, light sends priority 0 and heavy 10 (the most
              vLLM priority alone can do, and it needs the operator to know in advance who is light)
  fair_queue  both, through app.admission.AdmissionQueue in this process: the queue sees the sims' /metrics
              scraped every probe interval (modeled time) and admits by virtual token counter, keeping
              a demand-sized reserve of slots for tenants under their share (fair_queue_no_reserve: none) and
              over-share starts paced (fair_queue_unpaced: not)
  below_no_queue / below_fair_queue   both tenants at --below-load of the saturating rates: the fast path
              must add nothing there (optional, --arms)

By default the queue runs here, in front of the sims (a small asyncio client calls queue.admit before sending
each request straight to a sim, least in-flight replica first). With `--via-gateway` every arm starts its sims
and a `kvgate serve` in front of them (one bulk pool, tenants light and heavy) and sends the load through it:
  alone / no_queue      the pool as today (admission off)
  priority              the pool has priority_scheduling, sims --scheduling-policy priority, the light tenant's
                        default_class is interactive (priority 0) and the heavy one's bulk (10)
  default               the pool without an admission key (the queue is on by default with two tenants);
                        every other arm but fair_queue* runs with admission: {enabled: false}
  fair_queue            pools.bulk.admission enabled (--reserve slots per replica)
  fair_queue_priority   fair_queue on priority-scheduling sims: the queue releases in fair order and a request
                        started over its tenant's fair share is sent with a lower priority (10 -> 15)
  below_no_queue / below_fair_queue   the same at --below-load of the saturating rates

Sims run at --time-scale X (their clock X times real time); every time below is modeled time. Open-loop Poisson
arrivals for --duration modeled seconds; requests still running --drain seconds after that are cut off, and a
light request cut off before its first token counts with TTFT = its wait so far (a lower bound). Tokens/s are
the sims' own counters (prompt + generation) between --warmup and --duration.

    .venv/bin/python experiments/fair_queue_eval.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fair_queue_trace import Sample, breakdown, engine_means, timeline, trace_loop
from procs import MODEL, Proc, gateway_config, gateway_proc, metric_sum, scrape, sim_proc

from app.admission import AdmissionConfig, AdmissionQueue, AdmissionRejected
from app.bench.report import percentile
from app.routing.promtext import parse_metrics
from app.sim.tokenizer import FallbackTokenizer

LIGHT, HEAVY = "light", "heavy"
PRIORITY = {LIGHT: 0, HEAVY: 10}


@dataclass
class Record:
    """One request as the client saw it (seconds, real time; converted when reported)."""

    tenant: str
    arrival: float
    ttft: float | None = None
    e2e: float | None = None
    waited: float = 0.0
    rejected: bool = False
    cut_off: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    gateway_wait: float | None = None  # the gateway's own `queued=` (x-kvgate-route), seconds real
    rid: str = ""  # x-request-id, which the gateway forwards and the sim's step trace keys on
    sent_at: float = 0.0  # perf_counter (CLOCK_MONOTONIC, the sims' clock too) when the client sent it


@dataclass
class ScrapedReplica:
    """A sim as the queue sees it: last scrape + this client's in-flight count (ReplicaState's queued())."""

    url: str
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0
    in_flight_at_scrape: int = 0
    capacity: int = 0  # not declared: the queue learns it

    def queued(self) -> int:
        """The scraped queue moved by our sends since the scrape, when it was queueing."""
        if self.waiting <= 0:
            return 0
        return max(self.waiting + self.in_flight - self.in_flight_at_scrape, 0)


@dataclass
class ArmResult:
    """One arm's records and the sims' token counters over the measured window."""

    name: str
    records: list[Record]
    tokens_per_s: float | None
    queue: AdmissionQueue | None = None
    samples: list[tuple[int, int]] = field(default_factory=list)  # (sims' waiting, gateway queue) per scrape
    gateway_metrics: dict[str, float] = field(default_factory=dict)  # the gateway's /metrics after the arm
    trace: list[Sample] = field(default_factory=list)
    engine: str = ""  # the sims' mean queue and prefill time over the window


# ------------------------------------------------------------------------------------------------ workload


def arrivals(rate: float, duration: float, rng: random.Random) -> list[float]:
    """Poisson arrival times in [0, duration) at `rate` per second."""
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append(t)


def make_prompt(rng: random.Random, tokens: int, tok: FallbackTokenizer) -> str:
    """Random words of `tokens` tokens in the sim's tokenizer (random, so no prefix-cache hits)."""
    # Up to 6 letters after a space is one piece, so one token, in the sim's fallback scheme.
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = " ".join("".join(rng.choices(letters, k=5)) for _ in range(tokens))
    assert len(tok.encode(text)) == tokens
    return text


# ------------------------------------------------------------------------------------------------ client


class Client:
    """Streams chat completions; optional admission queue and priority in front."""

    def __init__(self, session: aiohttp.ClientSession, replicas: list[ScrapedReplica], *,
                 queue: AdmissionQueue | None, priority: bool, keys: dict[str, str] | None,
                 output_tokens: int) -> None:  # fmt: skip
        self.session = session
        self.replicas = replicas
        self.queue = queue
        self.priority = priority
        self.keys = keys
        self.output_tokens = output_tokens

    async def request(self, rec: Record, prompt: str, prompt_tokens: int, t0: float) -> None:
        """One request from arrival to its last token (queue wait included in its TTFT)."""
        body: dict[str, object] = {
            "model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": self.output_tokens, "ignore_eos": True,
        }  # fmt: skip
        if self.priority:
            body["priority"] = PRIORITY[rec.tenant]
        start = rec.sent_at = time.perf_counter()
        if self.queue is None:
            await self._send(rec, body, start, t0)
            return
        predicted = prompt_tokens + self.output_tokens
        try:
            async with self.queue.admit(rec.tenant, "bulk", predicted) as ticket:
                rec.waited = ticket.waited_s
                await self._send(rec, body, start, t0)
                ticket.settle(rec.prompt_tokens + rec.output_tokens if rec.error is None else predicted)
        except AdmissionRejected:
            rec.rejected = True
            rec.e2e = time.perf_counter() - start

    async def _send(self, rec: Record, body: dict[str, object], start: float, t0: float) -> None:
        replica = min(self.replicas, key=lambda r: r.in_flight)
        headers = {"Content-Type": "application/json", "x-request-id": rec.rid}
        if self.keys is not None:
            headers["Authorization"] = f"Bearer {self.keys[rec.tenant]}"
        replica.in_flight += 1
        try:
            async with self.session.post(replica.url + "/v1/chat/completions", data=orjson.dumps(body),
                                         headers=headers) as resp:  # fmt: skip
                if resp.status == 429:
                    rec.rejected = True
                    return
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}"
                    return
                rec.gateway_wait = route_wait_s(resp.headers.get("x-kvgate-route"))
                await self._read(resp, rec, start)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            rec.error = type(e).__name__
        finally:
            replica.in_flight -= 1
            rec.e2e = time.perf_counter() - start

    @staticmethod
    async def _read(resp: aiohttp.ClientResponse, rec: Record, start: float) -> None:
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            if b"\n" not in chunk:
                continue
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                if rec.ttft is None and b'"content":"' in line and b'"content":""' not in line:
                    rec.ttft = time.perf_counter() - start
                elif b'"usage"' in line and b'"choices":[]' in line:
                    usage = orjson.loads(line[5:]).get("usage") or {}
                    rec.prompt_tokens = int(usage.get("prompt_tokens", 0))
                    rec.output_tokens = int(usage.get("completion_tokens", 0))


def route_wait_s(route: str | None) -> float | None:
    """The gateway's queue wait from x-kvgate-route (`;queued=<ms>`, absent = started at once); None: no gateway."""
    if route is None:
        return None
    for part in route.split(";"):
        if part.startswith("queued="):
            return float(part[len("queued=") :]) / 1000.0
    return 0.0


# ------------------------------------------------------------------------------------------------ one arm


async def scrape_loop(session: aiohttp.ClientSession, replicas: list[ScrapedReplica], queue: AdmissionQueue | None,
                      every_s: float, stop: asyncio.Event, samples: list[tuple[int, int]]) -> None:  # fmt: skip
    """What the gateway's scraper does: /metrics of each sim every interval, then the queue's state hook."""
    while not stop.is_set():
        for r in replicas:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.get(r.url + "/metrics") as resp:
                    m = parse_metrics(await resp.text())
                r.running = int(m.get("vllm:num_requests_running", 0))
                r.waiting = int(m.get("vllm:num_requests_waiting", 0))
                r.kv_usage = m.get("vllm:kv_cache_usage_perc", 0.0)
                r.in_flight_at_scrape = r.in_flight
        if queue is not None:
            queue.on_state_change(replicas)
        samples.append((sum(r.waiting for r in replicas), queue.queue_len if queue is not None else 0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def run_arm(name: str, urls: Sequence[str], args: argparse.Namespace, *, light_rate: float,
                  heavy_rate: float, queue: AdmissionQueue | None = None, priority: bool = False,
                  keys: dict[str, str] | None = None, gateway: str | None = None) -> ArmResult:  # fmt: skip
    """Drive the load for one arm (rates in modeled req/s) and collect records and counters; with `gateway`
    the requests go there and `urls` (the sims behind it) only give the token counters."""
    ts = args.time_scale
    rng = random.Random(args.seed)
    tok = FallbackTokenizer()
    plan = [(t, LIGHT) for t in arrivals(light_rate, args.duration, rng)]
    if heavy_rate > 0:
        plan += [(t, HEAVY) for t in arrivals(heavy_rate, args.duration, rng)]
    plan.sort()
    prompts = [make_prompt(rng, args.prompt_tokens, tok) for _ in range(min(len(plan), 64))]
    replicas = [ScrapedReplica(u) for u in ([gateway] if gateway else urls)]
    samples: list[tuple[int, int]] = []
    stop = asyncio.Event()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        client = Client(session, replicas, queue=queue, priority=priority, keys=keys,
                        output_tokens=args.output_tokens)  # fmt: skip
        scraper = asyncio.create_task(scrape_loop(session, replicas, queue, args.probe_interval / ts, stop, samples))
        t0 = time.perf_counter()
        trace: list[Sample] = []
        tracer = asyncio.create_task(trace_loop(session, urls, gateway, t0, args.trace_every / ts, ts, stop, trace))
        tasks: list[tuple[Record, asyncio.Task[None]]] = []
        before = after = None
        for i, (at, tenant) in enumerate(plan):
            if before is None and at >= args.warmup:
                before = _counters(urls)
            delay = t0 + at / ts - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            # A unique first word per request: random prompts from a small pool would otherwise hit the cache.
            prompt = f"r{i} " + prompts[i % len(prompts)]
            rec = Record(tenant, at, rid=f"{tenant}-{i}")
            tasks.append((rec, asyncio.create_task(client.request(rec, prompt, args.prompt_tokens, t0))))
        delay = t0 + args.duration / ts - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        after = _counters(urls)
        t_after = (time.perf_counter() - t0) * ts
        pending = [t for _, t in tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=args.drain / ts)
        cut = time.perf_counter()
        for rec, t in tasks:
            if not t.done():
                t.cancel()
                rec.cut_off = True
                if rec.ttft is None:
                    rec.ttft = cut - t0 - rec.arrival / ts  # censored: at least this long
        await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
        stop.set()
        await scraper
        await tracer
    window = t_after - args.warmup
    tokens_per_s = None
    if before is not None and window > 0:
        total = sum(_tokens(after[u]) - _tokens(before[u]) for u in urls)
        if total <= 0:  # a gateway: no engine counters, count what the clients got back instead
            total = sum(r.prompt_tokens + r.output_tokens for r, _ in tasks
                        if args.warmup <= r.arrival and not r.cut_off and r.error is None)  # fmt: skip
        tokens_per_s = total / window
    gw_metrics = scrape(gateway) if gateway else {}
    engine = engine_means(before, after, ts) if before is not None else ""
    return ArmResult(name, [r for r, _ in tasks], tokens_per_s, queue, samples, gw_metrics, trace, engine)


def _counters(urls: Sequence[str]) -> dict[str, dict[str, float]]:
    return {u: scrape(u) for u in urls}


def _tokens(sample: dict[str, float]) -> float:
    return metric_sum(sample, "vllm:prompt_tokens_total") + metric_sum(sample, "vllm:generation_tokens_total")


# ------------------------------------------------------------------------------------------------ report


def tenant_stats(arm: ArmResult, tenant: str, ts: float, warmup: float) -> dict[str, float | int | None]:
    """TTFT percentiles (ms, modeled), counts, for one tenant's requests that arrived after the warm-up."""
    rs = [r for r in arm.records if r.tenant == tenant and r.arrival >= warmup]
    ttft = [r.ttft * ts * 1000 for r in rs if r.ttft is not None and not r.rejected and r.error is None]
    done = [r for r in rs if not r.rejected and r.error is None and not r.cut_off]
    return {
        "n": len(rs), "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
        "rejected": sum(r.rejected for r in rs), "cut_off": sum(r.cut_off for r in rs),
        "errors": sum(r.error is not None for r in rs), "completed": len(done),
        "output_tokens": sum(r.output_tokens for r in done),
    }  # fmt: skip


def _f(v: float | int | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ratio(a: float | int | None, b: float | int | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def print_table(args: argparse.Namespace, results: list[ArmResult], light_rate: float, heavy_rate: float) -> None:
    """Side by side: light TTFT vs alone, total tokens/s vs no_queue, the heavy tenant's lot."""
    ts, w = args.time_scale, args.warmup
    by = {a.name: a for a in results}
    light = {a.name: tenant_stats(a, LIGHT, ts, w) for a in results}
    heavy = {a.name: tenant_stats(a, HEAVY, ts, w) for a in results}
    print()
    print(
        f"{args.replicas} sim(s) h100-8b --max-num-seqs {args.max_num_seqs}, --time-scale {ts:g}; prompts "
        f"{args.prompt_tokens} tokens (uncached), {args.output_tokens} output tokens (ignore_eos); Poisson light "
        f"{light_rate:g} req/s, heavy {heavy_rate:g} req/s; {args.duration:g} s per arm, measured after "
        f"{w:g} s, drain {args.drain:g} s; fair queue: max_waiting_per_replica {args.max_waiting}, reserve "
        f"{args.reserve}..{args.reserve_max} per replica, pace {args.pace:g}, prefill gate {args.prefill_gate}, "
        f"bulk deadline {args.bulk_deadline:g} s, scrape every {args.probe_interval:g} s; times in modeled time, "
        f"seed {args.seed}"
    )
    base_ttft = light.get("alone", {}).get("ttft_p99")
    base_tps = by["no_queue"].tokens_per_s if "no_queue" in by else None
    header = (f"{'arm':18s} {'light p50 ms':>12s} {'light p99 ms':>12s} {'p99/alone':>10s} {'tokens/s':>9s} "
              f"{'vs no_queue':>11s} {'heavy p99 ms':>12s} {'heavy done':>10s} {'heavy 429':>9s} "
              f"{'light done/n':>12s}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for a in results:
        lt, hv = light[a.name], heavy[a.name]
        print(f"{a.name:18s} {_f(lt['ttft_p50']):>12s} {_f(lt['ttft_p99']):>12s} "
              f"{_ratio(lt['ttft_p99'], base_ttft):>10s} {_f(a.tokens_per_s, 0):>9s} "
              f"{_ratio(a.tokens_per_s, base_tps):>11s} {_f(hv['ttft_p99']):>12s} "
              f"{hv['completed']!s:>10s} {hv['rejected']!s:>9s} {lt['completed']!s:>6s}/{lt['n']!s:<5s}")  # fmt: skip
    print()
    print("targets: light p99 within 1.50x of alone; tokens/s >= 0.95x of no_queue; heavy keeps the rest")
    for a in results:
        lt, hv = light[a.name], heavy[a.name]
        extra = ""
        if a.samples:
            peak_w = max(s[0] for s in a.samples)
            peak_q = max(s[1] for s in a.samples)
            extra = f"; peak sims' waiting {peak_w}, peak gateway queue {peak_q}"
        if a.queue is not None:
            shares = {t: round(v, 3) for t, v in sorted(a.queue.shares().items())}
            extra += f"; token shares {shares}; rejected {dict(a.queue.rejected)}"
        if a.gateway_metrics:
            m = a.gateway_metrics
            admitted = {t: metric_sum(m, "gateway_queue_tokens_total", tenant=t) for t in (LIGHT, HEAVY)}
            total = sum(admitted.values())
            if total:
                extra += f"; gateway token shares { {t: round(v / total, 3) for t, v in admitted.items()} }"
            waits = {t: metric_sum(m, "gateway_queue_wait_seconds_count", tenant=t) for t in (LIGHT, HEAVY)}
            queued_s = {t: metric_sum(m, "gateway_queue_wait_seconds_sum", tenant=t) for t in (LIGHT, HEAVY)}
            if any(waits.values()):
                extra += "; mean queue wait ms " + str({t: round(queued_s[t] / waits[t] * 1000 * ts, 1)
                                                         for t in waits if waits[t]})  # fmt: skip
            extra += f"; queue 429s {metric_sum(m, 'gateway_rate_limited_total', limit='queue'):.0f}"
        print(
            f"{a.name}: light cut off {lt['cut_off']}, errors {lt['errors']}; heavy cut off {hv['cut_off']}, "
            f"errors {hv['errors']}{extra}"
        )
        print(f"  {a.engine}")
        for tenant in (LIGHT, HEAVY):
            print("  " + breakdown(a.records, tenant, ts, w))
        if args.timeline:
            print("  running/waiting|limit/in_flight/queued: " + timeline(a.trace, w))


# ------------------------------------------------------------------------------------------------ main


def dump_trace(args: argparse.Namespace, arm: ArmResult, sims: Sequence[str]) -> None:
    """Write the client's records and each sim's step trace (GET /sim/step_trace) to <--step-trace>/<arm>.json."""
    sim_traces = []
    for url in sims:
        with urllib.request.urlopen(url + "/sim/step_trace", timeout=30) as resp:  # the arm is over: nothing to block
            sim_traces.append(orjson.loads(resp.read()))
    clients = [{"rid": r.rid, "tenant": r.tenant, "arrival": r.arrival, "sent_at": r.sent_at, "ttft": r.ttft,
                "gateway_wait": r.gateway_wait, "cut_off": r.cut_off, "error": r.error}
               for r in arm.records]  # fmt: skip
    out = Path(args.step_trace) / f"{arm.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"arm": arm.name, "time_scale": args.time_scale, "warmup": args.warmup,
                                  "clients": clients, "sims": sim_traces}))  # fmt: skip
    print(f"    step trace: {out}", flush=True)


def sims_for(args: argparse.Namespace, tag: str, priority: bool, log_dir: Path) -> list[Proc]:
    """Fresh sims for one arm."""
    sim_args = ["--profile", "h100-8b", "--max-num-seqs", str(args.max_num_seqs), "--seed", "1",
                "--no-enable-prompt-tokens-details"]  # fmt: skip
    if args.step_trace:
        sim_args.append("--step-trace")
    if priority:
        sim_args += ["--scheduling-policy", "priority"]
    return [sim_proc(f"{tag}{i}", sim_args, time_scale=args.time_scale, log_dir=log_dir)
            for i in range(args.replicas)]  # fmt: skip


def queue_config(args: argparse.Namespace, arm: str) -> AdmissionConfig:
    """The fair queue's settings for `arm` (…_no_reserve: no reserve, …_unpaced: no pacing), deadlines in real s."""
    ts = args.time_scale
    reserve = not arm.endswith("no_reserve")
    return AdmissionConfig(enabled=True, max_waiting_per_replica=args.max_waiting,
                           reserve_per_replica=args.reserve if reserve else 0,
                           reserve_max_per_replica=args.reserve_max if reserve else 0,
                           pace_over_share=0.0 if arm.endswith("unpaced") else args.pace,
                           over_share_prefills_per_replica=0 if arm.endswith("unpaced") else args.prefill_gate,
                           deadline_s={"interactive": 2.0 / ts, "bulk": args.bulk_deadline / ts},
                           max_queue_len=args.max_queue_len)  # fmt: skip


def saturating_rates(args: argparse.Namespace) -> tuple[float, float]:
    """The light and heavy tenants' request rates past saturation."""
    return args.light_rate, args.light_rate * args.heavy_factor


def arm_rates(args: argparse.Namespace, name: str) -> tuple[float, float]:
    """The light and heavy tenants' request rates of arm `name` (below_*: scaled down; alone: no heavy tenant)."""
    light, heavy = saturating_rates(args)
    if name.startswith("below_"):
        light, heavy = light * args.below_load, heavy * args.below_load
    return light, 0.0 if name == "alone" else heavy


async def direct(args: argparse.Namespace) -> None:
    """Every arm against sims this script starts."""
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-fair-queue-"))
    results: list[ArmResult] = []
    for name in args.arms.split(","):
        lr, hr = arm_rates(args, name)
        priority = name == "priority"
        sims = sims_for(args, name, priority, log_dir)
        queue = None
        if "fair_queue" in name:
            queue = AdmissionQueue(queue_config(args, name), pool="bulk")
        try:
            for s in sims:
                s.start()
            print(f"[{time.strftime('%H:%M:%S')}] arm {name} ...", flush=True)
            t = time.perf_counter()
            res = await run_arm(name, [s.url for s in sims], args, light_rate=lr, heavy_rate=hr, queue=queue,
                                priority=priority)  # fmt: skip
            print(f"    {time.perf_counter() - t:.0f} s real", flush=True)
            results.append(res)
            if args.step_trace:
                dump_trace(args, res, [s.url for s in sims])
        finally:
            for s in sims:
                s.stop()
    print_table(args, results, *saturating_rates(args))


GATEWAY_KEYS = {LIGHT: "sk-fair-light", HEAVY: "sk-fair-heavy"}


def arm_gateway_config(args: argparse.Namespace, name: str, urls: Sequence[str]) -> dict[str, object]:
    """The gateway in front of one arm's sims: one bulk pool; admission and priority as the arm says."""
    ts = args.time_scale
    priority = "priority" in name or (name == "default" and args.sim_priority)
    pool: dict[str, object] = {"role": "bulk", "replicas": list(urls), "policy": "least_load",
                               "max_num_seqs": args.max_num_seqs, "priority_scheduling": priority}  # fmt: skip
    if "fair_queue" in name:
        pool["admission"] = queue_config(args, name).model_dump()
    elif name == "default":  # the same pool without an admission key: the queue is on by default (two tenants)
        pass
    else:  # the other arms measure the engine without the gateway's queue
        pool["admission"] = {"enabled": False}
    # Only the priority-alone arm tells vLLM who is light (the operator must know in advance).
    light_class = "interactive" if name == "priority" else "bulk"
    tenants = [{"id": LIGHT, "api_keys": [GATEWAY_KEYS[LIGHT]], "default_class": light_class},
               {"id": HEAVY, "api_keys": [GATEWAY_KEYS[HEAVY]], "default_class": "bulk"}]  # fmt: skip
    routing = {"probe_interval_s": args.probe_interval / ts, "healthy_after": 1, "unhealthy_after": 3,
               "allow_spill": False}  # fmt: skip
    cfg = gateway_config({"bulk": pool}, tenants=tenants, routing=routing,
                         upstream={"read_timeout_s": 600, "retries": 0})  # fmt: skip
    # All load comes from one loopback client: the per-client connection cap (256) would refuse it.
    cfg["listen"] = {"max_connections_per_client": 8192}
    return cfg


async def via_gateway(args: argparse.Namespace) -> None:
    """Every arm through a `kvgate serve` this script starts in front of fresh sims."""
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-fair-queue-gw-"))
    results: list[ArmResult] = []
    for name in args.arms.split(","):
        lr, hr = arm_rates(args, name)
        sims = sims_for(args, name, "priority" in name or args.sim_priority, log_dir)
        gw: Proc | None = None
        try:
            for s in sims:
                s.start()
            gw = gateway_proc(f"gw-{name}", arm_gateway_config(args, name, [s.url for s in sims]), log_dir=log_dir)
            gw.start("/ready")
            await asyncio.sleep(2 * args.probe_interval / args.time_scale)  # first scrapes in
            print(f"[{time.strftime('%H:%M:%S')}] arm {name} (via gateway) ...", flush=True)
            t = time.perf_counter()
            res = await run_arm(name, [s.url for s in sims], args, light_rate=lr, heavy_rate=hr,
                                keys=GATEWAY_KEYS, gateway=gw.url)  # fmt: skip
            print(f"    {time.perf_counter() - t:.0f} s real", flush=True)
            results.append(res)
            if args.step_trace:
                dump_trace(args, res, [s.url for s in sims])
        finally:
            if gw is not None:
                gw.stop()
            for s in sims:
                s.stop()
    print_table(args, results, *saturating_rates(args))
    kinds = Counter(r.error for a in results for r in a.records if r.error is not None)
    print(f"errors by kind, all arms: {dict(kinds)}")


def main() -> None:
    """Parse arguments and run."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default="alone,no_queue,priority,fair_queue_no_reserve,fair_queue")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--light-rate", type=float, default=4.0, help="light tenant, req/s modeled")
    p.add_argument("--heavy-factor", type=float, default=10.0)
    p.add_argument("--below-load", type=float, default=0.5, help="rate multiplier of the below_* arms")
    p.add_argument("--duration", type=float, default=40.0, help="modeled seconds of arrivals per arm")
    p.add_argument("--warmup", type=float, default=8.0, help="modeled seconds not measured")
    p.add_argument("--drain", type=float, default=10.0, help="modeled seconds to finish after the arrivals")
    p.add_argument("--probe-interval", type=float, default=1.5, help="scrape interval, modeled seconds")
    p.add_argument("--max-waiting", type=int, default=4, help="fair queue: max_waiting_per_replica")
    p.add_argument("--reserve", type=int, default=0,
                   help="fair queue: reserve_per_replica, the reserve's floor (arm fair_queue)")
    p.add_argument("--reserve-max", type=int, default=AdmissionConfig().reserve_max_per_replica,
                   help="fair queue: reserve_max_per_replica, the demand-sized reserve's ceiling")
    p.add_argument("--pace", type=float, default=AdmissionConfig().pace_over_share,
                   help="fair queue: pace_over_share (0: over-share starts unpaced)")
    p.add_argument("--prefill-gate", type=int, default=AdmissionConfig().over_share_prefills_per_replica,
                   help="fair queue: over_share_prefills_per_replica (0: over-share starts not held for first tokens)")
    p.add_argument("--bulk-deadline", type=float, default=30.0, help="fair queue: bulk deadline, modeled s")
    p.add_argument("--max-queue-len", type=int, default=1024)
    p.add_argument("--time-scale", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace-every", type=float, default=0.5, help="sample sims and gateway, modeled seconds")
    p.add_argument("--timeline", action="store_true", help="print the sampled series of every arm")
    p.add_argument("--step-trace", default=None, metavar="DIR",
                   help="run the sims with --step-trace and write each arm's records and step traces to DIR "
                        "(read them with experiments/fair_queue_replay.py)")
    p.add_argument("--via-gateway", action="store_true", help="every arm through a kvgate serve in front of the sims")
    p.add_argument("--sim-priority", action="store_true",
                   help="every arm's sims run --scheduling-policy priority (and arm default's pool says so)")
    args = p.parse_args()
    if math.isclose(args.time_scale, 0):
        p.error("--time-scale must be > 0")
    asyncio.run(via_gateway(args) if args.via_gateway else direct(args))


if __name__ == "__main__":
    main()
