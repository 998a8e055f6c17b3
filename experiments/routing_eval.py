"""Issue 5, parts 1 and 2: kvgate routing against round robin on the same sim replicas, side by side in one run.

  pools     two pools (fast: 2 speculative-decoding sims, role interactive; bulk: 2 high-batch sims, role bulk,
            default policies) vs ONE pool of the same 4 sims with policy round_robin; bench workload `mixed`
            (class header), open-loop Poisson arrivals. Interactive TTFT/TPOT per class from the bench's
            per-request records; total tokens/s over the run.
  affinity  4 sims in one pool, policy prefix_affinity vs round_robin; bench workload `agent` (volatile
            header, shuffled tool keys) over several tenants with normalize on in both arms. Cached-token
            ratio from the bench (usage) and from each sim's /metrics (Δprefix_cache_hits/Δqueries); each sim's
            running+waiting sampled during the run against the load bound ceil(c x mean).

Same sims, same bench seed; /reset_prefix_cache on every sim between arms. Sims run `--time-scale X` (their
clock X times real time); every latency and rate below is converted to the sims' modeled time, and the
gateway's timers (probe interval, TTFT SLO) are scaled the same way, so routing sees what it would see at 1x.

    .venv/bin/python experiments/routing_eval.py pools
    .venv/bin/python experiments/routing_eval.py affinity
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from procs import (
    MODEL,
    Counters,
    Proc,
    ascrape,
    gateway_config,
    gateway_proc,
    metric_sum,
    reset_prefix_cache,
    scrape,
    sim_proc,
)

from app.bench.report import BenchResult, percentile
from app.bench.runner import run_bench
from app.bench.spec import BenchSpec, RequestRecord

PROBE_INTERVAL_S = 1.5  # the gateway's default, in modeled time
TTFT_SLO_MS = 500.0


@dataclass
class ArmResult:
    """One arm: the bench result (modeled time), per-replica counter deltas, and load samples."""

    name: str
    bench: BenchResult
    counters: Counters
    samples: list[dict[str, int]] = field(default_factory=list)
    decisions: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


def _ms(values: list[float], p: float) -> float | None:
    v = percentile([x * 1000.0 for x in values], p)
    return v


def class_stats(records: list[RequestRecord], route_class: str) -> dict[str, Any]:
    """TTFT/TPOT percentiles (ms, modeled time) and counts for one class, from per-request records."""
    rs = [r for r in records if r.route_class == route_class and not r.warmup]
    ok = [r for r in rs if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    return {
        "n": len(rs), "errors": len(rs) - len(ok),
        "ttft_p50": _ms(ttft, 50), "ttft_p99": _ms(ttft, 99),
        "tpot_p50": _ms(tpot, 50), "tpot_p99": _ms(tpot, 99),
        "output_tokens": sum(r.output_tokens for r in ok),
    }


async def _sample_loads(urls: list[str], every_s: float, stop: asyncio.Event, into: list[dict[str, int]]) -> None:
    """Scrape each replica's running+waiting every `every_s` until `stop` is set."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        while not stop.is_set():
            scraped = await asyncio.gather(*(ascrape(client, u) for u in urls))
            row = {}
            for u, s in zip(urls, scraped, strict=True):
                row[u] = int(metric_sum(s, "vllm:num_requests_running") + metric_sum(s, "vllm:num_requests_waiting"))
            into.append(row)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)


async def run_arm(name: str, gateway: Proc, sims: list[Proc], spec: BenchSpec, sample_every_s: float | None
                  ) -> ArmResult:
    """Reset the sims' caches, run the bench through `gateway`, and collect counters around it."""
    urls = [s.url for s in sims]
    reset_prefix_cache(urls)
    counters = Counters(before={u: scrape(u) for u in urls})
    samples: list[dict[str, int]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_loads(urls, sample_every_s, stop, samples)) if sample_every_s else None
    t0 = time.perf_counter()
    result = await run_bench(spec)
    wall = time.perf_counter() - t0
    stop.set()
    if sampler is not None:
        await sampler
    counters.after = {u: scrape(u) for u in urls}
    gw = scrape(gateway.url)
    decisions = {k: v for k, v in gw.items() if k.startswith("gateway_route_decisions_total")}
    return ArmResult(name, result, counters, samples, decisions, wall)


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def _late_share(arm: ArmResult, urls: list[str], scale: float) -> float:
    late = sum(arm.counters.delta(u, "kvgate_sim_step_lateness_seconds") for u in urls)
    return late / max(arm.wall_s * len(urls), 1e-9)


def _decision_lines(arm: ArmResult) -> list[str]:
    out = []
    for k, v in sorted(arm.decisions.items()):
        if v:
            out.append(f"    {k.split('{', 1)[1].rstrip('}')}  {v:.0f}")
    return out


# --------------------------------------------------------------------------------------------------- pools


async def pools(args: argparse.Namespace) -> None:
    """Part 1: two-pool kvgate vs round robin over all four replicas."""
    ts = args.time_scale
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-routing-eval-"))
    common = ["--profile", "h100-8b", "--mean-output-tokens", str(args.mean_output_tokens), "--seed", "1"]
    fast_args = [*common, "--speculative", args.speculative, "--max-num-seqs", str(args.fast_max_num_seqs)]
    bulk_args = [*common, "--max-num-seqs", str(args.bulk_max_num_seqs)]
    fast = [sim_proc(f"fast{i}", fast_args, time_scale=ts, log_dir=log_dir) for i in range(2)]
    bulk = [sim_proc(f"bulk{i}", bulk_args, time_scale=ts, log_dir=log_dir) for i in range(2)]
    sims = fast + bulk
    routing = {"probe_interval_s": PROBE_INTERVAL_S / ts}
    slo = TTFT_SLO_MS / ts
    kv_cfg = gateway_config(
        {"fast": {"role": "interactive", "replicas": [s.url for s in fast], "ttft_slo_ms": slo},
         "bulk": {"role": "bulk", "replicas": [s.url for s in bulk], "ttft_slo_ms": slo}},
        routing=routing)
    rr_cfg = gateway_config(
        {"all": {"role": "interactive", "replicas": [s.url for s in sims], "policy": "round_robin",
                 "ttft_slo_ms": slo}},
        routing=routing)
    arms = [("round_robin", gateway_proc("gw-rr", rr_cfg, log_dir=log_dir)),
            ("kvgate", gateway_proc("gw-kvgate", kv_cfg, log_dir=log_dir))]
    spec = BenchSpec(base_url="", workload="mixed", model=MODEL, rate=args.rate * ts, requests=args.requests,
                     warmup=args.warmup, seed=args.seed, mixed_ratio=args.mixed_ratio, time_scale=ts, timeout_s=600)
    results: list[ArmResult] = []
    try:
        for s in sims:
            s.start()
        for name, gw in arms:
            gw.start(ready_path="/ready")
            await asyncio.sleep(2 * PROBE_INTERVAL_S / ts + 0.5)  # first probes in
            print(f"[{time.strftime('%H:%M:%S')}] arm {name} ...", flush=True)
            results.append(await run_arm(name, gw, sims, _with(spec, base_url=gw.url), None))
            gw.stop()
    finally:
        for _, gw in arms:
            gw.stop()
        for s in sims:
            s.stop()
    print_pools(args, results, fast, bulk, ts)


def _with(spec: BenchSpec, **changes: Any) -> BenchSpec:
    from dataclasses import replace

    return replace(spec, **changes)


def whole_run_tokens_per_s(records: list[RequestRecord]) -> float | None:
    """(prompt + output tokens of every successful request) / (first start to last end), warm-up included."""
    ok = [r for r in records if r.ok and r.e2e_s is not None]
    if not ok:
        return None
    span = max(r.start_s + (r.e2e_s or 0.0) for r in ok) - min(r.start_s for r in ok)
    return sum(r.prompt_tokens + r.output_tokens for r in ok) / span if span > 0 else None


def print_pools(args: argparse.Namespace, results: list[ArmResult], fast: list[Proc], bulk: list[Proc],
                ts: float) -> None:
    """The side-by-side table of part 1."""
    rr, kv = results
    urls = [s.url for s in fast + bulk]
    rows = []
    stats = {a.name: {c: class_stats(a.bench.records, c) for c in ("interactive", "bulk")} for a in results}
    print()
    print(f"mixed workload, {args.requests} measured requests after {args.warmup} warm-up, Poisson {args.rate:g} "
          f"req/s, mixed_ratio {args.mixed_ratio}, seed {args.seed}; sims h100-8b at --time-scale {ts:g} "
          "(times below in modeled time)")
    print(f"fast pool: 2 sims --speculative {args.speculative} --max-num-seqs {args.fast_max_num_seqs}; "
          f"bulk pool: 2 sims --max-num-seqs {args.bulk_max_num_seqs}; --mean-output-tokens {args.mean_output_tokens}")
    print()
    header = f"{'metric':34s} {'round_robin':>12s} {'kvgate':>12s} {'kvgate/rr':>10s}  target"
    print(header)
    print("-" * len(header))

    def row(label: str, a: float | None, b: float | None, target: str = "", digits: int = 1) -> None:
        rows.append((label, a, b))
        print(f"{label:34s} {_fmt(a, digits):>12s} {_fmt(b, digits):>12s} {_ratio(b, a):>10s}  {target}")

    for cls in ("interactive", "bulk"):
        a, b = stats["round_robin"][cls], stats["kvgate"][cls]
        row(f"{cls} TTFT p50 ms", a["ttft_p50"], b["ttft_p50"])
        row(f"{cls} TTFT p99 ms", a["ttft_p99"], b["ttft_p99"], "<= 0.50x" if cls == "interactive" else "")
        row(f"{cls} TPOT p50 ms", a["tpot_p50"], b["tpot_p50"], "< 1.00x" if cls == "interactive" else "", 2)
        row(f"{cls} TPOT p99 ms", a["tpot_p99"], b["tpot_p99"], "", 2)
    row("total tokens/s (steady window)", rr.bench.summary.total_tokens_per_s, kv.bench.summary.total_tokens_per_s,
        ">= 0.95x", 0)
    row("output tokens/s (steady window)", rr.bench.summary.output_tokens_per_s,
        kv.bench.summary.output_tokens_per_s, "", 0)
    row("total tokens/s (whole run + drain)", whole_run_tokens_per_s(rr.bench.records),
        whole_run_tokens_per_s(kv.bench.records), "", 0)
    row("failed requests", rr.bench.summary.errors, kv.bench.summary.errors, "", 0)
    print()
    for arm in results:
        n_req = {u: arm.counters.delta(u, "vllm:request_success_total") for u in urls}
        per = ", ".join(f"{p.name} {n_req[p.url]:.0f}" for p in fast + bulk)
        print(f"{arm.name}: requests per replica: {per}; sim step lateness {100 * _late_share(arm, urls, ts):.1f}% "
              f"of wall; run {arm.wall_s:.0f} s real")
        for line in _decision_lines(arm):
            print(line)


# ------------------------------------------------------------------------------------------------ affinity


async def affinity(args: argparse.Namespace) -> None:
    """Part 2: prefix affinity vs round robin over 4 sims of one pool, agent workload, several tenants."""
    ts = args.time_scale
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-routing-eval-"))
    sim_args = ["--profile", "h100-8b", "--seed", "1"]
    if args.kv_blocks:
        sim_args += ["--kv-blocks", str(args.kv_blocks)]
    sims = [sim_proc(f"sim{i}", sim_args, time_scale=ts, log_dir=log_dir) for i in range(4)]
    keys = [f"sk-bench-tenant-{i}" for i in range(args.tenants)]
    tenants = [{"id": f"t{i}", "api_keys": [k], "normalize": "on", "default_class": "interactive"}
               for i, k in enumerate(keys)]
    routing = {"probe_interval_s": PROBE_INTERVAL_S / ts}
    slo = TTFT_SLO_MS / ts

    def cfg(name: str) -> dict[str, Any]:
        policy = {"type": name, "load_bound": args.load_bound} if name == "prefix_affinity" else name
        return gateway_config({"main": {"role": "interactive", "replicas": [s.url for s in sims], "policy": policy,
                                        "ttft_slo_ms": slo}}, tenants=tenants, routing=routing)

    arms = [("round_robin", gateway_proc("gw-rr", cfg("round_robin"), log_dir=log_dir)),
            ("prefix_affinity", gateway_proc("gw-pa", cfg("prefix_affinity"), log_dir=log_dir))]
    spec = BenchSpec(base_url="", workload="agent", model=MODEL, concurrency=args.concurrency,
                     requests=args.requests, seed=args.seed, api_keys=tuple(keys), time_scale=ts, timeout_s=600)
    results: list[ArmResult] = []
    try:
        for s in sims:
            s.start()
        for name, gw in arms:
            gw.start(ready_path="/ready")
            await asyncio.sleep(2 * PROBE_INTERVAL_S / ts + 0.5)
            print(f"[{time.strftime('%H:%M:%S')}] arm {name} ...", flush=True)
            results.append(await run_arm(name, gw, sims, _with(spec, base_url=gw.url), args.sample_every))
            gw.stop()
    finally:
        for _, gw in arms:
            gw.stop()
        for s in sims:
            s.stop()
    print_affinity(args, results, sims, ts)


def bound_violations(samples: list[dict[str, int]], c: float) -> tuple[int, int, float]:
    """(samples with some replica above ceil(c x mean), samples with any load, worst max/mean)."""
    over = busy = 0
    worst = 0.0
    for row in samples:
        loads = list(row.values())
        total = sum(loads)
        if total == 0:
            continue
        busy += 1
        mean = total / len(loads)
        if max(loads) > math.ceil(c * mean - 1e-9):
            over += 1
        worst = max(worst, max(loads) / mean)
    return over, busy, worst


def print_affinity(args: argparse.Namespace, results: list[ArmResult], sims: list[Proc], ts: float) -> None:
    """The side-by-side table of part 2."""
    rr, pa = results
    urls = [s.url for s in sims]
    print()
    print(f"agent workload (volatile header, shuffled tool keys), {args.tenants} tenants with normalize on, "
          f"{args.requests} requests, closed loop concurrency {args.concurrency}, seed {args.seed}")
    print(f"4 sims h100-8b, one pool, kv-blocks {args.kv_blocks or 'default (25000)'}, load_bound {args.load_bound}, "
          f"--time-scale {ts:g} (times in modeled time)")
    print()
    header = f"{'metric':38s} {'round_robin':>12s} {'affinity':>12s} {'aff/rr':>8s}  target"
    print(header)
    print("-" * len(header))

    def row(label: str, a: float | None, b: float | None, target: str = "", digits: int = 3) -> None:
        print(f"{label:38s} {_fmt(a, digits):>12s} {_fmt(b, digits):>12s} {_ratio(b, a):>8s}  {target}")

    def sim_ratio(arm: ArmResult) -> float | None:
        hits = sum(arm.counters.delta(u, "vllm:prefix_cache_hits_total") for u in urls)
        queries = sum(arm.counters.delta(u, "vllm:prefix_cache_queries_total") for u in urls)
        return hits / queries if queries else None

    row("cached-token ratio (bench usage)", rr.bench.summary.cached_ratio, pa.bench.summary.cached_ratio, ">= 2x")
    row("prefix hit rate (sims' /metrics)", sim_ratio(rr), sim_ratio(pa), ">= 2x")
    row("TTFT p50 ms", rr.bench.summary.ttft_ms.p50, pa.bench.summary.ttft_ms.p50, "", 1)
    row("TTFT p99 ms", rr.bench.summary.ttft_ms.p99, pa.bench.summary.ttft_ms.p99, "", 1)
    row("TPOT p50 ms", rr.bench.summary.tpot_ms.p50, pa.bench.summary.tpot_ms.p50, "", 2)
    row("total tokens/s", rr.bench.summary.total_tokens_per_s, pa.bench.summary.total_tokens_per_s, "", 0)
    row("failed requests", rr.bench.summary.errors, pa.bench.summary.errors, "", 0)
    print()
    for arm in results:
        n_req = [arm.counters.delta(u, "vllm:request_success_total") for u in urls]
        mean = sum(n_req) / len(n_req)
        over, busy, worst = bound_violations(arm.samples, args.load_bound)
        peaks = [max((row[u] for row in arm.samples), default=0) for u in urls]
        print(f"{arm.name}: requests per replica {', '.join(f'{n:.0f}' for n in n_req)} "
              f"(max/mean {max(n_req) / mean if mean else 0:.2f}); load samples {busy}: {over} above "
              f"ceil({args.load_bound} x mean), worst max/mean {worst:.2f}; peak running+waiting "
              f"{', '.join(map(str, peaks))}; sim lateness {100 * _late_share(arm, urls, ts):.1f}%; "
              f"run {arm.wall_s:.0f} s real")
        for line in _decision_lines(arm):
            print(line)


def main() -> None:
    """Parse arguments and run one part."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    a = sub.add_parser("pools", help="part 1: two pools vs round robin")
    a.add_argument("--rate", type=float, default=25.0, help="Poisson arrivals, req/s in modeled time")
    a.add_argument("--requests", type=int, default=400)
    a.add_argument("--warmup", type=int, default=50, help="requests before the measured ones (steady window)")
    a.add_argument("--mixed-ratio", type=float, default=0.5, help="share of interactive sessions")
    a.add_argument("--speculative", default="ngram:4:0.6")
    a.add_argument("--fast-max-num-seqs", type=int, default=4)
    a.add_argument("--bulk-max-num-seqs", type=int, default=512)
    a.add_argument("--mean-output-tokens", type=int, default=512)
    a.add_argument("--time-scale", type=float, default=0.125)
    a.add_argument("--seed", type=int, default=0)
    b = sub.add_parser("affinity", help="part 2: prefix affinity vs round robin")
    b.add_argument("--tenants", type=int, default=16)
    b.add_argument("--concurrency", type=int, default=16)
    b.add_argument("--requests", type=int, default=300)
    b.add_argument("--kv-blocks", type=int, default=800, help="per sim; 0 = the profile's default (25000)")
    b.add_argument("--load-bound", type=float, default=1.25)
    b.add_argument("--sample-every", type=float, default=0.5, help="seconds (real) between load scrapes")
    b.add_argument("--time-scale", type=float, default=0.25)
    b.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    asyncio.run(pools(args) if args.part == "pools" else affinity(args))


if __name__ == "__main__":
    main()
