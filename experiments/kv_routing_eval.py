"""Issue 12: routing on vLLM's KV-cache events (`kv_events`) against `prefix_affinity`, `round_robin` and the
Rust routers' `cache_aware`, on the same 4 `kvgate sim --profile h100-8b` replicas under cache pressure.

Every arm: 4 sims (`--kv-blocks 800`, KV events + replay over ZMQ, the SmolLM2 folder as tokenizer, so the sims
hash the same token ids the gateway predicts), reset between arms; the bench's `agent` or `agent-static`
workload over 16 tenants, Poisson 8 req/s (modeled), 300 requests, one seed for all arms; one replica is
SIGKILLed at `--kill-at` of the expected run and started again `--down` s later (same ports: its events restart
at seq 0). Arms:

  kv_events        kvgate, pool policy {type: kv_events, block_size: 16} over replicas that declare kv_events
  prefix_affinity  kvgate, the same pool with policy prefix_affinity (plain replica URLs)
  round_robin      kvgate, policy round_robin
  vllm-router      PyPI vllm-router --policy cache_aware (peer venv, scripts/peer-venvs.sh vllm-router)
  sglang-router    PyPI sglang-router --policy cache_aware (peer venv, scripts/peer-venvs.sh sglang-router)

kvgate arms run with normalize on and either per-tenant salts (`--cache salted`, the default tenant) or
`shared_cache: true` (`--cache shared`, no salt); the routers have neither (no tenants, no normalization).
One invocation runs the arms it is given one after another and appends one JSON line per arm to `--out`;
`table` prints the side-by-side tables from that file.

    .venv/bin/python experiments/kv_routing_eval.py run --workload agent --cache salted \
        --arms kv_events,prefix_affinity,round_robin
    .venv/bin/python experiments/kv_routing_eval.py run --workload agent --arms vllm-router,sglang-router
    .venv/bin/python experiments/kv_routing_eval.py table
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import (
    KVGATE,
    MODEL,
    Proc,
    ascrape,
    free_port,
    gateway_config,
    gateway_proc,
    metric_sum,
    reset_prefix_cache,
    scrape,
)

from app.bench.report import BenchResult
from app.bench.runner import run_bench
from app.bench.spec import BenchSpec

TOKENIZER = str(Path("~/.cache/kvgate/models/smollm2-135m").expanduser())
PROBE_INTERVAL_S = 1.5  # modeled
TTFT_SLO_MS = 500.0
CACHE = Path("~/.cache/kvgate").expanduser()
KVGATE_ARMS = ("kv_events", "prefix_affinity", "round_robin")
ROUTER_ARMS = ("vllm-router", "sglang-router")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "kv_routing_eval.jsonl"


@dataclass
class Sim:
    """One sim replica and its fixed ZMQ ports (a restart reuses them, as a restarted vLLM pod would)."""

    proc: Proc
    events_port: int
    replay_port: int

    @property
    def url(self) -> str:
        """The replica's base URL."""
        return self.proc.url

    def replica(self) -> dict[str, Any]:
        """The gateway's replica object with its event endpoints."""
        return {"url": self.url, "kv_events": f"tcp://127.0.0.1:{self.events_port}",
                "kv_replay": f"tcp://127.0.0.1:{self.replay_port}", "kv_topic": "kv"}


def make_sims(args: argparse.Namespace, log_dir: Path) -> list[Sim]:
    """Four h100-8b sims under cache pressure, each publishing KV events and answering replay."""
    sims = []
    for i in range(args.replicas):
        port, ev, rp = free_port(), free_port(), free_port()
        argv = [*KVGATE, "sim", "--port", str(port), "--model", MODEL, "--time-scale", str(args.time_scale),
                "--log-level", "warning", "--profile", "h100-8b", "--seed", "1", "--kv-blocks", str(args.kv_blocks),
                "--max-num-seqs", str(args.max_num_seqs), "--tokenizer", TOKENIZER,
                "--kv-events", f"tcp://*:{ev}", "--kv-replay", f"tcp://*:{rp}", "--kv-topic", "kv"]
        proc = Proc(f"sim{i}", f"http://127.0.0.1:{port}", argv, log=log_dir / f"sim{i}.log")
        sims.append(Sim(proc, ev, rp))
    return sims


def kvgate_config(arm: str, sims: list[Sim], args: argparse.Namespace) -> dict[str, Any]:
    """One pool `main` over the sims with the arm's policy; 16 tenants with normalize on, salted or shared."""
    ts = args.time_scale
    keys = tenant_keys(args)
    tenants = [{"id": f"t{i}", "api_keys": [k], "normalize": "on", "default_class": "interactive",
                "shared_cache": args.cache == "shared"} for i, k in enumerate(keys)]
    pool: dict[str, Any] = {"role": "interactive", "ttft_slo_ms": TTFT_SLO_MS / ts, "max_num_seqs": args.max_num_seqs}
    if arm == "kv_events":
        policy: dict[str, Any] = {"type": "kv_events", "block_size": 16, "load_bound": args.load_bound}
        if args.load_tokens is not None:
            policy["load_tokens"] = args.load_tokens
        pool.update(replicas=[s.replica() for s in sims], tokenizer=TOKENIZER, policy=policy)
    else:
        bounded = {"type": arm, "load_bound": args.load_bound} if arm == "prefix_affinity" else arm
        pool.update(replicas=[s.url for s in sims], policy=bounded)
    routing = {"probe_interval_s": PROBE_INTERVAL_S / ts}
    return gateway_config({"main": pool}, tenants=tenants, routing=routing)


def tenant_keys(args: argparse.Namespace) -> list[str]:
    """One API key per tenant (the routers forward them; the sims ignore them)."""
    return [f"sk-bench-tenant-{i}" for i in range(args.tenants)]


def router_proc(arm: str, sims: list[Sim], log_dir: Path) -> Proc:
    """vllm-router or sglang-router with its cache_aware policy in front of the sims (peer venv)."""
    venv = CACHE / f"{arm}-venv"
    exe = venv / "bin" / arm
    if not exe.exists():
        raise SystemExit(f"{exe} missing: run scripts/peer-venvs.sh {arm}")
    port, prom = free_port(), free_port()
    # sglang-router's CLI has subcommands and spells the level "warn"; the flags are otherwise the same.
    sub, level = (["launch"], "warn") if arm == "sglang-router" else ([], "warning")
    argv = [str(exe), *sub, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *[s.url for s in sims],
            "--policy", "cache_aware", "--prometheus-port", str(prom), "--log-level", level,
            "--health-check-interval-secs", "2"]
    return Proc(arm, f"http://127.0.0.1:{port}", argv, log=log_dir / f"{arm}.log")


@dataclass
class ArmRun:
    """What one arm measured."""

    arm: str
    bench: BenchResult
    per_replica: list[float]
    hits: float
    queries: float
    peaks: list[dict[str, int]]
    samples: list[tuple[float, list[int]]]
    gateway: dict[str, float] = field(default_factory=dict)
    preemptions: list[float] = field(default_factory=list)
    queue_ms: list[float | None] = field(default_factory=list)
    kill_s: float | None = None
    back_s: float | None = None
    wall_s: float = 0.0
    lateness: float = 0.0


async def _sample(urls: list[str], stop: asyncio.Event, t0: float, into: list[tuple[float, list[int]]],
                  every_s: float) -> None:
    """Per replica (waiting, running, cumulative step lateness in ms) every `every_s` real seconds."""
    async with httpx.AsyncClient(timeout=1.0) as client:
        while not stop.is_set():
            scraped = await asyncio.gather(*(ascrape(client, u) for u in urls))
            row = []
            for s in scraped:
                row.append(int(metric_sum(s, "vllm:num_requests_waiting")) if s else -1)
                row.append(int(metric_sum(s, "vllm:num_requests_running")) if s else -1)
                row.append(int(1000 * metric_sum(s, "kvgate_sim_step_lateness_seconds")) if s else -1)
            into.append((time.perf_counter() - t0, row))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)


_COUNTERS = ("vllm:request_success_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
             "kvgate_sim_step_lateness_seconds", "vllm:num_preemptions_total", "vllm:request_queue_time_seconds_sum",
             "vllm:request_queue_time_seconds_count")


def _counts(sample: dict[str, float]) -> dict[str, float]:
    return {k: metric_sum(sample, k) for k in _COUNTERS}


async def run_arm(arm: str, front: Proc, sims: list[Sim], spec: BenchSpec, args: argparse.Namespace) -> ArmRun:
    """Reset the sims, run the bench through `front`, kill + restart one sim during it, collect counters."""
    urls = [s.url for s in sims]
    reset_prefix_cache(urls)
    before = {u: _counts(scrape(u)) for u in urls}
    victim = sims[args.victim % len(sims)]
    victim_pre: dict[str, float] = {}
    samples: list[tuple[float, list[int]]] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    sampler = asyncio.create_task(_sample(urls, stop, t0, samples, 0.25))
    times: dict[str, float] = {}

    async def fault() -> None:
        expected_real = args.requests / args.rate / args.time_scale
        await asyncio.sleep(args.kill_at * expected_real)
        victim_pre.update(_counts(await asyncio.to_thread(scrape, victim.url)))
        victim.proc.kill()
        times["kill"] = time.perf_counter() - t0
        await asyncio.sleep(args.down / args.time_scale)
        await asyncio.to_thread(victim.proc.start)
        times["back"] = time.perf_counter() - t0

    faulter = asyncio.create_task(fault()) if args.kill_at > 0 else None
    result = await run_bench(spec)
    wall = time.perf_counter() - t0
    if faulter is not None:
        await faulter
    stop.set()
    await sampler
    after = {u: _counts(scrape(u)) for u in urls}

    def delta(u: str, k: str) -> float:
        if u == victim.url and victim_pre:
            return victim_pre[k] - before[u][k] + after[u][k]  # its counters restart at 0
        return after[u][k] - before[u][k]

    gw: dict[str, float] = {}
    if arm in KVGATE_ARMS:
        gw = {k: v for k, v in scrape(front.url).items()
              if k.startswith(("gateway_route_decisions_total", "gateway_kv_events")) and v}
    late = sum(delta(u, "kvgate_sim_step_lateness_seconds") for u in urls) / max(wall * len(urls), 1e-9)
    peaks = [{"waiting": max((row[3 * i] for _, row in samples), default=0),
              "running": max((row[3 * i + 1] for _, row in samples), default=0)} for i in range(len(urls))]
    def queue_ms(u: str) -> float | None:
        n = delta(u, "vllm:request_queue_time_seconds_count")
        return 1000 * delta(u, "vllm:request_queue_time_seconds_sum") / n if n else None

    return ArmRun(arm, result, [delta(u, "vllm:request_success_total") for u in urls],
                  sum(delta(u, "vllm:prefix_cache_hits_total") for u in urls),
                  sum(delta(u, "vllm:prefix_cache_queries_total") for u in urls), peaks, samples, gw,
                  [delta(u, "vllm:num_preemptions_total") for u in urls], [queue_ms(u) for u in urls],
                  times.get("kill"), times.get("back"), wall, late)


def summarize_tail(run: ArmRun, ts: float) -> list[dict[str, Any]]:
    """The slowest 1% of TTFTs (at least 5) with their start (modeled s), each replica's queue then, and how late
    each sim's engine loop ran (real ms) over the request's first second."""
    ok = [r for r in run.bench.records if r.ok and r.ttft_s is not None and not r.warmup]
    ok.sort(key=lambda r: r.ttft_s or 0.0, reverse=True)
    out = []
    for r in ok[: max(5, len(ok) // 100)]:
        start_real = r.start_s / ts  # records are in modeled time; samples in real time
        i = min(range(len(run.samples)), key=lambda j: abs(run.samples[j][0] - start_real)) if run.samples else -1
        row = run.samples[i][1] if i >= 0 else []
        later = next((s[1] for s in run.samples[i:] if s[0] >= start_real + 1.0), run.samples[-1][1]) if i >= 0 else []
        late = [later[k] - row[k] for k in range(2, len(row), 3)] if row and later else []
        out.append({"ttft_ms": round((r.ttft_s or 0.0) * 1000, 1), "start_s": round(r.start_s, 2),
                    "tenant": r.tenant, "turn": r.turn, "prompt": r.prompt_tokens, "cached": r.cached_tokens,
                    "waiting": row[0::3], "running": row[1::3], "sim_late_ms_next_1s": late})
    return out


def to_json(run: ArmRun, args: argparse.Namespace) -> dict[str, Any]:
    """One JSON line for the results file."""
    s = run.bench.summary
    ts = args.time_scale
    return {
        "arm": run.arm, "workload": args.workload,
        "cache": args.cache if run.arm in KVGATE_ARMS else "none (no normalize, no salt)",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": {k: v for k, v in vars(args).items() if k not in ("func",) and not isinstance(v, Path)},
        "cached_ratio": s.cached_ratio, "sim_hit_rate": run.hits / run.queries if run.queries else None,
        "ttft_p50": s.ttft_ms.p50, "ttft_p99": s.ttft_ms.p99, "tpot_p50": s.tpot_ms.p50,
        "tokens_per_s": s.total_tokens_per_s, "errors": s.errors, "n": s.requests,
        "per_replica": run.per_replica, "peaks": run.peaks, "gateway": run.gateway,
        "preemptions": run.preemptions, "queue_ms": run.queue_ms,
        "kill_s": run.kill_s * ts if run.kill_s is not None else None,
        "back_s": run.back_s * ts if run.back_s is not None else None,
        "wall_s": run.wall_s, "lateness": run.lateness, "tail": summarize_tail(run, ts),
        # start (modeled s), TTFT ms, prompt, cached, ok: enough to redo any percentile or plot the tail in time
        "records": [[round(r.start_s, 3), round((r.ttft_s or 0.0) * 1000, 1), r.prompt_tokens, r.cached_tokens,
                     int(r.ok)] for r in run.bench.records],
    }


async def run(args: argparse.Namespace) -> None:
    """Start the sims once, run each arm in turn against them (fresh front per arm), append results."""
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for a in arms:
        if a not in KVGATE_ARMS + ROUTER_ARMS:
            raise SystemExit(f"unknown arm {a}")
    ts = args.time_scale
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-kv-routing-"))
    sims = make_sims(args, log_dir)
    spec = BenchSpec(base_url="", workload=args.workload, model=MODEL, rate=args.rate * ts, requests=args.requests,
                     seed=args.seed, api_keys=tuple(tenant_keys(args)), time_scale=ts, timeout_s=600)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for s in sims:
            s.proc.start()
        for arm in arms:
            if arm in KVGATE_ARMS:
                front = gateway_proc(f"gw-{arm}", kvgate_config(arm, sims, args), log_dir=log_dir)
                front.start(ready_path="/ready")
            else:
                front = router_proc(arm, sims, log_dir)
                front.start(ready_path="/health", timeout_s=60, any_status=True)
            try:
                await asyncio.sleep(2 * PROBE_INTERVAL_S / ts + 0.5)
                print(f"[{time.strftime('%H:%M:%S')}] {args.workload} {args.cache} {arm} ...", flush=True)
                from dataclasses import replace

                r = await run_arm(arm, front, sims, replace(spec, base_url=front.url), args)
            finally:
                front.stop()
            line = to_json(r, args)
            with args.out.open("a") as f:
                f.write(json.dumps(line) + "\n")
            print_rows([line])
    finally:
        for s in sims:
            s.proc.stop()
    print(f"logs in {log_dir}")


def _f(v: Any, d: int = 1) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def print_rows(rows: list[dict[str, Any]]) -> None:
    """One line per arm, then per-replica counts, peaks and the route decisions."""
    hdr = (f"{'arm':16s} {'workload':12s} {'cache':8s} {'cached':>7s} {'sim hit':>7s} {'TTFT p50':>9s} "
           f"{'TTFT p99':>9s} {'TPOT p50':>9s} {'tok/s':>7s} {'err':>4s}  requests per replica")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        cache = r["cache"] if r["arm"] in KVGATE_ARMS else "-"
        print(f"{r['arm']:16s} {r['workload']:12s} {cache:8s} {_f(r['cached_ratio'], 3):>7s} "
              f"{_f(r['sim_hit_rate'], 3):>7s} {_f(r['ttft_p50']):>9s} {_f(r['ttft_p99']):>9s} "
              f"{_f(r['tpot_p50'], 2):>9s} {_f(r['tokens_per_s'], 0):>7s} {r['errors']:>4d}  "
              f"{', '.join(f'{n:.0f}' for n in r['per_replica'])}")


def steady_p99(r: dict[str, Any]) -> float | None:
    """TTFT p99 of requests started outside the first 2 s (every tenant cold) and outside the restart window
    (from 1 s before the kill to 5 s after the victim was back), modeled time; None without records."""
    from app.bench.report import percentile

    recs = r.get("records")
    if not recs:
        return None
    lo = (r["kill_s"] - 1.0) if r.get("kill_s") is not None else None
    hi = (r["back_s"] + 5.0) if r.get("back_s") is not None else None
    keep = [x[1] for x in recs if x[4] and x[0] >= 2.0 and not (lo is not None and hi is not None and lo <= x[0] <= hi)]
    return percentile(keep, 99)


def table(args: argparse.Namespace) -> None:
    """Side-by-side tables per (workload, cache) from the results file, with ratios against prefix_affinity."""
    rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        latest[(r["workload"], r["cache"] if r["arm"] in KVGATE_ARMS else "-", r["arm"])] = r
    for workload in ("agent", "agent-static"):
        routers = [latest[(workload, "-", a)] for a in ROUTER_ARMS if (workload, "-", a) in latest]
        for cache in ("salted", "shared"):
            arms = [latest[(workload, cache, a)] for a in KVGATE_ARMS if (workload, cache, a) in latest]
            if not arms:
                continue
            print(f"\n{workload}, kvgate tenants {cache}" + (" (routers: no normalize, no salt)" if routers else ""))
            sel = arms + routers
            names = [r["arm"] for r in sel]
            hdr = f"{'metric':26s} " + " ".join(f"{n:>15s}" for n in names)
            print(hdr)
            print("-" * len(hdr))
            pa = next((r for r in sel if r["arm"] == "prefix_affinity"), None)

            def line(label: str, key: str, d: int, sel: list[dict[str, Any]] = sel,
                     pa: dict[str, Any] | None = pa) -> None:
                print(f"{label:26s} " + " ".join(f"{_f(r[key], d):>15s}" for r in sel))
                if pa is not None and pa[key]:
                    print(f"{'  / prefix_affinity':26s} " + " ".join(
                        f"{r[key] / pa[key]:>14.2f}x" if r[key] is not None else f"{'-':>15s}" for r in sel))

            line("cached-token ratio", "cached_ratio", 3)
            print(f"{'prefix hit rate (sims)':26s} " + " ".join(f"{_f(r['sim_hit_rate'], 3):>15s}" for r in sel))
            line("TTFT p50 ms", "ttft_p50", 1)
            line("TTFT p99 ms", "ttft_p99", 1)
            for r in sel:
                r["ttft_p99_steady"] = steady_p99(r)
            line("TTFT p99 ms, steady", "ttft_p99_steady", 1)
            print(f"{'TPOT p50 ms':26s} " + " ".join(f"{_f(r['tpot_p50'], 2):>15s}" for r in sel))
            print(f"{'tokens/s':26s} " + " ".join(f"{_f(r['tokens_per_s'], 0):>15s}" for r in sel))
            print(f"{'failed':26s} " + " ".join(f"{r['errors']:>15d}" for r in sel))
            print(f"{'requests per replica':26s} " + " ".join(
                f"{'/'.join(f'{n:.0f}' for n in r['per_replica']):>15s}" for r in sel))
            print(f"{'peak waiting per replica':26s} " + " ".join(
                f"{'/'.join(str(p['waiting']) for p in r['peaks']):>15s}" for r in sel))
            print(f"{'preemptions per replica':26s} " + " ".join(
                f"{'/'.join(f'{n:.0f}' for n in r.get('preemptions', [])):>15s}" for r in sel))
            print(f"{'mean queue ms per replica':26s} " + " ".join(
                f"{'/'.join(_f(q, 0) for q in r.get('queue_ms', [])):>15s}" for r in sel))
            print(f"{'sim lateness':26s} " + " ".join(f"{100 * r['lateness']:>14.1f}%" for r in sel))
    if args.tails:
        for r in rows:
            print(f"\n{r['arm']} {r['workload']} {r['cache']}: killed {_f(r['kill_s'])} s, back {_f(r['back_s'])} s "
                  f"(modeled); gateway {json.dumps(r['gateway'])}")
            for t in r["tail"]:
                print(f"    {t}")


def main() -> None:
    """Parse arguments and run or tabulate."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("run", help="run arms (one after another) and append their results")
    a.add_argument("--arms", default=",".join(KVGATE_ARMS))
    a.add_argument("--workload", choices=("agent", "agent-static"), default="agent")
    a.add_argument("--cache", choices=("salted", "shared"), default="salted", help="kvgate tenants' cache salts")
    a.add_argument("--replicas", type=int, default=4)
    a.add_argument("--tenants", type=int, default=16)
    a.add_argument("--rate", type=float, default=8.0, help="Poisson req/s in modeled time")
    a.add_argument("--requests", type=int, default=300)
    a.add_argument("--kv-blocks", type=int, default=800)
    a.add_argument("--max-num-seqs", type=int, default=8, help="per sim; also the pool's max_num_seqs")
    a.add_argument("--load-bound", type=float, default=1.25)
    a.add_argument("--load-tokens", type=int, default=None, help="kv_events load_tokens (default: the policy's)")
    a.add_argument("--kill-at", type=float, default=0.4, help="share of the expected run; 0 = no restart")
    a.add_argument("--down", type=float, default=3.0, help="modeled seconds the victim stays down")
    a.add_argument("--victim", type=int, default=3)
    a.add_argument("--time-scale", type=float, default=0.25)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--out", type=Path, default=DEFAULT_OUT)
    t = sub.add_parser("table", help="print the tables from the results file")
    t.add_argument("--out", type=Path, default=DEFAULT_OUT)
    t.add_argument("--tails", action="store_true", help="also each arm's slowest TTFTs and gateway counters")
    args = p.parse_args()
    if args.cmd == "run":
        asyncio.run(run(args))
    else:
        table(args)


if __name__ == "__main__":
    main()
