"""Issue 25: interactive pool chosen by predicted TPOT, against class-only routing and "always bulk", on a load ramp.

  sims   h100-8b, one replica per pool: `spec` (role interactive, --speculative ngram:4:0.3, drafts of requests
         holding a code fence accepted at 0.85 each (--spec-accept-when), --max-num-seqs 256) and `bulk` (role
         bulk, --max-num-seqs 512); --time-scale X (every time below is modeled time).
  load   bulk background (workload bulk, max_tokens 256, Poisson) for the whole arm, beside interactive traffic
         (workload code-chat: half code edits that return the fenced function, half chat) stepping up a Poisson
         ramp from light to past the spec pool's saturation.
  arms   spec   class-only routing with spill-over off: every interactive request on the spec pool
         bulk   the model served by the bulk pool alone: every interactive request there
         class  class-only routing as shipped (spill-over on, routing.tpot off): the baseline for tokens/s and CPU
         tpot   the default: routing.tpot on
Per step: interactive TPOT p50/p99 (client-measured), output tokens/s (the sims' generation counters), gateway CPU
per request (/proc/<pid>/stat over the step), and for the tpot arm the share routed to each pool and the median
|predicted - observed| / observed TPOT (x-kvgate-route's tpot= against the client's TPOT of the same request).

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/tpot_eval.py            # ~5 min
    .venv/bin/python experiments/tpot_eval.py --micro                                  # pick() cost, µs per call
    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/tpot_eval.py --cpu      # CPU/request, class vs tpot

--cpu: gateway CPU seconds (user+sys of the `kvgate serve` process, /proc) per request, routing.tpot off (class)
against on (tpot), below saturation: `--cpu-rounds` rounds on the same two sims, each round one gateway per arm
(the order alternating round by round: class-tpot, tpot-class, ...) with the same load (bulk background and
`--cpu-rate` interactive, same seeds), warmed for --warm-s, measured over --step-s. The ratio is per round, so
a machine whose load drifts over minutes weighs on both arms of a round alike; the median and spread are over
rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import cpu_seconds
from procs import MODEL, Proc, gateway_config, gateway_proc, metric_sum, scrape, sim_proc

from app.bench.report import percentile
from app.bench.runner import run_bench
from app.bench.spec import BenchSpec, RequestRecord
from app.bench.workloads import Workload, WorkloadOptions

ARMS = ("spec", "bulk", "class", "tpot")
_TPOT = re.compile(r";tpot=([0-9.]+)ms")
_POOL = re.compile(r"pool=([^;]+)")


@dataclass
class Step:
    """One ramp step of one arm."""

    rate: float
    records: list[RequestRecord]
    out_tokens_per_s: float
    cpu_ms_per_request: float
    requests: float
    seed: int
    lateness_pct: float
    errors: list[float] = field(default_factory=list)  # |pred - obs| / obs per tpot-routed request


def _kinds(seed: int, ratio: float) -> Workload:
    return Workload("code-chat", WorkloadOptions(seed=seed, mixed_ratio=ratio))


def _sims(args: argparse.Namespace, log_dir: Path) -> tuple[Proc, Proc]:
    common = ["--profile", "h100-8b", "--mean-output-tokens", "512", "--seed", "1"]
    spec = sim_proc("spec", [*common, "--speculative", f"ngram:{args.k}:{args.chat_accept}",
                             "--spec-accept-when", f"```={args.code_accept}", "--max-num-seqs", "256"],
                    time_scale=args.time_scale, log_dir=log_dir)
    bulk = sim_proc("bulk", [*common, "--max-num-seqs", "512"], time_scale=args.time_scale, log_dir=log_dir)
    return spec, bulk


def _config(arm: str, spec: Proc, bulk: Proc, ts: float, probe_s: float) -> dict[str, Any]:
    # Bulk never borrows the spec pool in any arm: the arms differ only in where interactive requests go.
    routing: dict[str, Any] = {
        "probe_interval_s": probe_s / ts,
        "tpot": {"enabled": arm == "tpot"},
        "bulk_borrow_below_utilization": 0,
    }
    if arm == "spec":
        routing["allow_spill"] = False
    pools = {
        "spec": {"role": "interactive", "replicas": [spec.url], "speculative": True, "ttft_slo_ms": 500 / ts},
        "bulk": {"role": "bulk", "replicas": [bulk.url], "ttft_slo_ms": 500 / ts},
    }
    if arm == "bulk":
        pools = {"bulk": pools["bulk"]}
    return gateway_config(pools, routing=routing)


def _generated(urls: list[str]) -> float:
    return sum(metric_sum(scrape(u), "vllm:generation_tokens_total") for u in urls)


def _gateway_requests(gw: Proc) -> float:
    return metric_sum(scrape(gw.url), "gateway_requests_total")


async def run_arm(arm: str, args: argparse.Namespace, sims: tuple[Proc, Proc], log_dir: Path) -> list[Step]:
    """Start the arm's gateway, warm it, run the bulk background and the interactive ramp through it."""
    ts = args.time_scale
    gw = gateway_proc(f"gw-{arm}", _config(arm, *sims, ts, args.probe_s), log_dir=log_dir)
    gw.start(ready_path="/ready")
    urls = [s.url for s in sims]
    inter = BenchSpec(base_url=gw.url, workload="code-chat", model=MODEL, rate=args.rates[0] * ts,
                      duration_s=args.warm_s, seed=args.seed, mixed_ratio=args.code_ratio, time_scale=ts,
                      timeout_s=600)
    arm_s = args.warm_s + len(args.rates) * args.step_s
    bulk_spec = BenchSpec(base_url=gw.url, workload="bulk", model=MODEL, rate=args.bulk_rate * ts, duration_s=arm_s * 4,
                          seed=args.seed + 7, max_tokens=256, time_scale=ts, timeout_s=600)
    steps: list[Step] = []
    try:
        await asyncio.sleep(2 * args.probe_s / ts)
        background = asyncio.create_task(run_bench(bulk_spec))
        await run_bench(inter)  # warm-up: the TPOT model's first scrapes (every arm gets the same)
        for i, rate in enumerate(args.rates):
            spec = replace(inter, rate=rate * ts, duration_s=args.step_s, seed=args.seed + 100 * (i + 1))
            cpu0, gen0, req0, late0 = cpu_seconds(gw.pid), _generated(urls), _gateway_requests(gw), _lateness(urls)
            t0 = time.perf_counter()
            result = await run_bench(spec)
            wall = time.perf_counter() - t0
            cpu, gen, req = cpu_seconds(gw.pid) - cpu0, _generated(urls) - gen0, _gateway_requests(gw) - req0
            late = 100 * (_lateness(urls) - late0) / (wall * len(urls))
            steps.append(Step(rate, result.records, gen / (wall * ts), 1000 * cpu / max(req, 1), req, spec.seed,
                              late, _errors(result.records, ts)))
            print(
                f"[{time.strftime('%H:%M:%S')}] {arm} step {rate:g} req/s: {len(result.records)} requests, "
                f"{wall:.0f} s",
                flush=True,
            )
        background.cancel()  # the bulk background ends with the ramp
        await asyncio.gather(background, return_exceptions=True)
    finally:
        gw.stop()
    return steps


def _errors(records: list[RequestRecord], ts: float) -> list[float]:
    out = []
    for r in records:
        m = _TPOT.search(r.route or "")
        if m and r.ok and r.tpot_s:
            predicted_ms = float(m.group(1)) * ts  # the gateway predicts in wall time; the record is modeled
            out.append(abs(predicted_ms - r.tpot_s * 1000) / (r.tpot_s * 1000))
    return out


def _tpot_ms(
    records: list[RequestRecord], p: float, kind: str | None = None, kinds: Workload | None = None
) -> float | None:
    vals = [r.tpot_s * 1000 for r in records if r.ok and r.tpot_s is not None and not r.warmup
            and (kind is None or kinds is None or _kind(kinds, r) == kind)]
    return percentile(vals, p)


def _kind(kinds: Workload, r: RequestRecord) -> str:
    return "code" if "```" in kinds.session(r.session).user_turns[0] else "chat"


def _by_kind(st: Step, p: float, kind: str, ratio: float) -> float | None:
    return _tpot_ms(st.records, p, kind, _kinds(st.seed, ratio))


def _ms(vals: list[float | None], p: float) -> float | None:
    return percentile([v * 1000 for v in vals if v is not None], p)


def _lateness(urls: list[str]) -> float:
    return sum(metric_sum(scrape(u), "kvgate_sim_step_lateness_seconds") for u in urls)


def _median(vals: list[float]) -> float | None:
    return percentile(vals, 50) if vals else None


def _f(v: float | None, d: int = 2) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def report(args: argparse.Namespace, results: dict[str, list[Step]]) -> None:
    """The side-by-side tables."""
    print()
    print(
        f"sims h100-8b --time-scale {args.time_scale:g}; spec pool ngram K={args.k}, accept {args.code_accept} "
        f"(code) / {args.chat_accept} (chat) per draft token; interactive code share {args.code_ratio}; bulk "
        f"background {args.bulk_rate:g} req/s x 256 tokens; steps of {args.step_s:g} s real; seed {args.seed}"
    )
    print()
    hdr = f"{'step req/s':>10s} {'metric':18s}" + "".join(f"{a:>9s}" for a in ARMS) + "  tpot <= min(spec,bulk)"
    print(hdr)
    print("-" * len(hdr))
    ratio = args.code_ratio
    n = len(args.rates)
    for i, rate in enumerate(args.rates):
        for label, fn in (("TPOT p50 ms", lambda st: _tpot_ms(st.records, 50)),
                          ("TPOT p99 ms", lambda st: _tpot_ms(st.records, 99)),
                          ("code TPOT p50 ms", lambda st: _by_kind(st, 50, "code", ratio)),
                          ("chat TPOT p50 ms", lambda st: _by_kind(st, 50, "chat", ratio)),
                          ("chat TPOT p99 ms", lambda st: _by_kind(st, 99, "chat", ratio)),
                          ("TTFT p50 ms", lambda st: _ms([r.ttft_s for r in st.records if r.ok], 50)),
                          ("e2e p50 ms", lambda st: _ms([r.e2e_s for r in st.records if r.ok], 50)),
                          ("out tok/s", lambda st: st.out_tokens_per_s),
                          ("sim lateness %", lambda st: st.lateness_pct),
                          ("gw CPU ms/req", lambda st: st.cpu_ms_per_request)):
            vals = {a: fn(results[a][i]) for a in ARMS if a in results}
            verdict = ""
            if label.startswith("TPOT") and all(vals.get(a) is not None for a in ("spec", "bulk", "tpot")):
                best = min(vals["spec"], vals["bulk"])  # type: ignore[type-var]
                verdict = f"{'yes' if vals['tpot'] <= best else 'NO'} ({vals['tpot'] / best:.2f}x)"  # type: ignore[operator]
            print(f"{rate:>10g} {label:18s}" + "".join(f"{_f(vals.get(a)):>9s}" for a in ARMS) + f"  {verdict}")
        if "tpot" in results:
            st = results["tpot"][i]
            pools: dict[str, int] = {}
            for r in st.records:
                m = _POOL.search(r.route or "")
                pools[m.group(1) if m else "?"] = pools.get(m.group(1) if m else "?", 0) + 1
            sample = next((r.route for r in st.records if r.route and "tpot=" in r.route), None)
            print(f"{'':>10s} e.g. x-kvgate-route: {sample}")
            print(
                f"{'':>10s} tpot arm: pools {pools}; median |pred-obs|/obs TPOT {_f(_median(st.errors), 3)} "
                f"over {len(st.errors)} requests"
            )
        print()
    every = {a: [r for st in results[a] for r in st.records] for a in results}
    print("whole ramp:")
    for label, p in (("TPOT p50 ms", 50.0), ("TPOT p99 ms", 99.0)):
        vals = {a: _tpot_ms(every[a], p) for a in every}
        print(f"  {label:14s} " + "  ".join(f"{a} {_f(v)}" for a, v in vals.items()))
    if "tpot" in results:
        errs = [e for st in results["tpot"] for e in st.errors]
        print(
            f"  tpot arm median |pred-obs|/obs TPOT: {_f(_median(errs), 3)} over {len(errs)} requests (target <= 0.15)"
        )
    for a in results:
        tok = sum(st.out_tokens_per_s for st in results[a]) / n
        print(
            f"  {a}: mean output tok/s over the steps {tok:.0f}; failed requests "
            f"{sum(1 for st in results[a] for r in st.records if not r.ok)}"
        )
    if "class" in results and "tpot" in results:
        below = [i for i, _ in enumerate(args.rates[:-1])]
        for i in below:
            c, t = results["class"][i].cpu_ms_per_request, results["tpot"][i].cpu_ms_per_request
            print(f"  step {args.rates[i]:g}: gateway CPU per request tpot/class {t / c:.3f} (target within 3%)")


def dump(args: argparse.Namespace, results: dict[str, list[Step]]) -> None:
    """Every request's record as JSON lines (for a closer look at one run)."""
    with open(args.dump, "w") as f:
        for arm, steps in results.items():
            for st in steps:
                kinds = _kinds(st.seed, args.code_ratio)
                for r in st.records:
                    f.write(json.dumps({"arm": arm, "rate": st.rate, "kind": _kind(kinds, r), "route": r.route,
                                        "tpot_s": r.tpot_s, "ttft_s": r.ttft_s, "ok": r.ok,
                                        "out": r.output_tokens, "start_s": r.start_s}) + "\n")


def micro(args: argparse.Namespace) -> None:
    """pick() of an interactive chat request with and without the TPOT router, on a warmed two-pool cluster."""
    from app.config import parse_config
    from app.context import ClassDecision
    from app.routing.pick import pick
    from app.routing.state import ClusterState
    from app.routing.tpot.router import TpotRouter

    pools = {"spec": {"role": "interactive", "served_model": MODEL, "replicas": ["http://127.0.0.1:9101"],
                      "speculative": True},
             "bulk": {"role": "bulk", "served_model": MODEL, "replicas": ["http://127.0.0.1:9201"]}}
    for pool in pools.values():
        pool["price"] = {"gpu_hour_usd": 2.5, "capacity_tokens_per_s": 5000}
    cfg = parse_config({"models": [{"name": MODEL, "pools": ["spec", "bulk"]}], "pools": pools})
    cluster = ClusterState.from_config(cfg)
    router = TpotRouter.for_config(cfg)
    assert router is not None
    for name, pool in cluster.pools.items():
        c = {"vllm:inter_token_latency_seconds_sum": 0.0, "vllm:inter_token_latency_seconds_count": 0.0,
             "vllm:spec_decode_num_accepted_tokens": 0.0, "vllm:spec_decode_num_draft_tokens": 0.0,
             "vllm:time_to_first_token_seconds_count": 0.0}
        for t in range(1, 40):
            b = 4 + t * 3
            c["vllm:inter_token_latency_seconds_sum"] += b * 0.01
            c["vllm:inter_token_latency_seconds_count"] += b
            c["vllm:time_to_first_token_seconds_count"] += b / 2  # sequences live 2 s: the batch reverts
            c["vllm:spec_decode_num_accepted_tokens"] += b * 0.5
            c["vllm:spec_decode_num_draft_tokens"] += b * 4
            pool.replicas[0].apply_metrics({"vllm:num_requests_running": b, **c}, now=float(t))
            router.pools[name].refresh(pool.replicas)
    body = {"messages": [{"role": "system", "content": "You are a concise, helpful assistant."},
                         {"role": "user", "content": "In two or three sentences, explain what a B-tree is."}],
            "max_tokens": 128, "stream": True}
    decision = ClassDecision("interactive", "stream")
    model = cfg.models[0]
    out = {}
    for label, chooser in (("class only", None), ("tpot", router)):
        cluster.tpot = chooser
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for i in range(args.micro_calls):
                pick(model=model, decision=decision, key=i, cluster=cluster, cfg=cfg.routing, body=body,
                     tenant="t", prompt_tokens=60)
            best = min(best, (time.perf_counter() - t0) / args.micro_calls)
        out[label] = best * 1e6
        print(f"pick() {label:10s}: {out[label]:.2f} µs per call (best of 5 x {args.micro_calls})")
    from app.context import RequestContext, Tenant
    from app.surfaces import CHAT

    route = pick(model=model, decision=decision, key=1, cluster=cluster, cfg=cfg.routing, body=body, tenant="t",
                 prompt_tokens=60)
    ctx = RequestContext(request_id="r", surface=CHAT, path="/v1/chat/completions", body=body, model=MODEL,
                         stream=True, client_wants_usage=True, headers={})
    ctx.tenant, ctx.route_class, ctx.route, ctx.status = Tenant("t"), decision, route, 200
    ctx.usage.completion_tokens, ctx.stream_events = 101, 51
    ctx.timing.first_token, ctx.timing.end = 1.0, 1.5
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(args.micro_calls):
            router.observe(ctx)  # settle's hook: what each finished request teaches the router
        best = min(best, (time.perf_counter() - t0) / args.micro_calls)
    print(f"observe() at settle: {best * 1e6:.2f} µs per call (best of 5 x {args.micro_calls})")
    print(f"added by the TPOT router: {out['tpot'] - out['class only'] + best * 1e6:.2f} µs per interactive request "
          f"(pick + observe)")


async def cpu_arm(arm: str, args: argparse.Namespace, sims: tuple[Proc, Proc], log_dir: Path, rnd: int
                  ) -> tuple[float, float, int]:
    """One gateway of `arm` under the --cpu load: (CPU ms per request, requests, interactive requests that went
    to the bulk pool)."""
    ts = args.time_scale
    gw = gateway_proc(f"cpu-{arm}-{rnd}", _config(arm, *sims, ts, args.probe_s), log_dir=log_dir)
    gw.start(ready_path="/ready")
    inter = BenchSpec(base_url=gw.url, workload="code-chat", model=MODEL, rate=args.cpu_rate * ts,
                      duration_s=args.warm_s, seed=args.seed + rnd, mixed_ratio=args.code_ratio, time_scale=ts,
                      timeout_s=600)
    bulk_spec = BenchSpec(base_url=gw.url, workload="bulk", model=MODEL, rate=args.bulk_rate * ts,
                          duration_s=(args.warm_s + args.step_s) * 4, seed=args.seed + 7 + rnd, max_tokens=256,
                          time_scale=ts, timeout_s=600)
    try:
        await asyncio.sleep(2 * args.probe_s / ts)
        background = asyncio.create_task(run_bench(bulk_spec))
        await run_bench(inter)
        cpu0, req0 = cpu_seconds(gw.pid), _gateway_requests(gw)
        result = await run_bench(replace(inter, duration_s=args.step_s, seed=args.seed + 1000 + rnd))
        cpu, req = cpu_seconds(gw.pid) - cpu0, _gateway_requests(gw) - req0
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
    finally:
        gw.stop()
    to_bulk = sum(1 for r in result.records if (r.route or "").startswith("pool=bulk"))
    return 1000 * cpu / max(req, 1), req, to_bulk


async def cpu_ab(args: argparse.Namespace) -> None:
    """--cpu: class vs tpot gateway CPU per request, alternating rounds (module docstring)."""
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-tpot-cpu-"))
    sims = _sims(args, log_dir)
    rows: list[tuple[int, dict[str, tuple[float, float, int]]]] = []
    try:
        for s in sims:
            s.start()
        for rnd in range(args.cpu_rounds):
            order = ("class", "tpot") if rnd % 2 == 0 else ("tpot", "class")
            got = {arm: await cpu_arm(arm, args, sims, log_dir, rnd) for arm in order}
            rows.append((rnd, got))
            print(f"[{time.strftime('%H:%M:%S')}] round {rnd + 1} ({'-'.join(order)}): "
                  + "; ".join(f"{a} {v[0]:.3f} ms/req over {v[1]:.0f}" for a, v in got.items()), flush=True)
    finally:
        for s in sims:
            s.stop()
    print()
    print(f"sims h100-8b --time-scale {args.time_scale:g}; interactive {args.cpu_rate:g} req/s (code share "
          f"{args.code_ratio}) + bulk {args.bulk_rate:g} req/s, modeled; {args.step_s:g} s measured per gateway "
          f"after {args.warm_s:g} s warm-up; gateway CPU = user+sys of the kvgate serve process")
    print(f"{'round':>5s} {'order':>11s} {'class ms/req':>13s} {'tpot ms/req':>12s} {'requests':>9s} "
          f"{'to bulk':>12s} {'tpot/class':>11s}")
    ratios = []
    for rnd, got in rows:
        c, t = got["class"], got["tpot"]
        ratios.append(t[0] / c[0])
        order = "class-tpot" if rnd % 2 == 0 else "tpot-class"
        print(f"{rnd + 1:>5d} {order:>11s} {c[0]:13.3f} {t[0]:12.3f} {c[1]:4.0f}/{t[1]:<4.0f} {c[2]:>6d}/{t[2]:<5d} "
              f"{ratios[-1]:11.3f}")
    s = sorted(ratios)
    print(f"tpot/class CPU per request: median {_median(ratios):.3f}, min {s[0]:.3f}, max {s[-1]:.3f} over "
          f"{len(s)} rounds (target <= 1.03); logs {log_dir}")


async def main_async(args: argparse.Namespace) -> dict[str, list[Step]]:
    """Run every arm on the same two sims, one after another, and print the tables."""
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-tpot-eval-"))
    sims = _sims(args, log_dir)
    results: dict[str, list[Step]] = {}
    try:
        for s in sims:
            s.start()
        for arm in args.arms:
            results[arm] = await run_arm(arm, args, sims, log_dir)
    finally:
        for s in sims:
            s.stop()
    print(f"logs: {log_dir}")
    return results


def main() -> None:
    """Parse arguments and run."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=[15.0, 40.0, 65.0, 90.0],
                   help="interactive req/s per ramp step (modeled time)")
    p.add_argument("--bulk-rate", type=float, default=25.0, help="bulk req/s (modeled time)")
    p.add_argument("--code-ratio", type=float, default=0.5, help="share of interactive requests that are code edits")
    p.add_argument("--k", type=int, default=4, help="draft tokens per step on the spec pool")
    p.add_argument("--code-accept", type=float, default=0.85)
    p.add_argument("--chat-accept", type=float, default=0.3)
    p.add_argument("--time-scale", type=float, default=0.2)
    p.add_argument("--probe-s", type=float, default=0.15, help="the gateway's probe interval (modeled seconds)")
    p.add_argument("--warm-s", type=float, default=6.0, help="real seconds of first-step traffic before measuring")
    p.add_argument("--step-s", type=float, default=12.0, help="real seconds of arrivals per ramp step")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dump", default=None, help="write every request's record (JSON lines) here")
    p.add_argument("--micro", action="store_true", help="only time pick() with and without the router")
    p.add_argument("--micro-calls", type=int, default=20000)
    p.add_argument("--cpu", action="store_true", help="only gateway CPU per request, class vs tpot, in rounds")
    p.add_argument("--cpu-rounds", type=int, default=6)
    p.add_argument("--cpu-rate", type=float, default=40.0, help="interactive req/s (modeled) for --cpu")
    args = p.parse_args()
    if args.micro:
        micro(args)
        return
    if args.cpu:
        asyncio.run(cpu_ab(args))
        return
    results = asyncio.run(main_async(args))
    report(args, results)
    if args.dump:
        dump(args, results)


if __name__ == "__main__":
    main()
