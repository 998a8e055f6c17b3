"""Issue 25, in virtual time: the same ramp as experiments/tpot_eval.py with the sim's engine model and the gateway's
real pick() (TPOT router included), but no processes, sockets or wall clock — a discrete-event run that takes
seconds and has no host-CPU noise.

  engines  two app.sim Schedulers priced by the h100-8b profile: `spec` (ngram K=4, drafts of a code request
           accepted at 0.85 each, of a chat request at 0.3; --max-num-seqs 256) and `bulk` (512), each a replica
           of its pool in a ClusterState built from a real gateway config.
  metrics  every `--probe-s` each replica's state is scraped as the scraper would (running, waiting, TTFT, ITL
           sum/count, spec-decode counters, prefill time, prompt tokens) into ReplicaState.apply_metrics;
           in-flight counts move with every request; a finished request goes to TpotRouter.observe as settle's
           hook does (its stream = one event per engine step).
  load     bulk background (Poisson, 256 tokens) beside interactive code/chat (half each) stepping up the ramp.
  arms     spec (class only, no spill), bulk (the bulk pool alone), class (as shipped without routing.tpot), tpot.

    .venv/bin/python experiments/tpot_model_eval.py        # ~1 min of CPU
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Any

from app.config import parse_config
from app.context import ClassDecision, RequestContext, Tenant
from app.routing import promtext as m
from app.routing.pick import pick
from app.routing.state import ClusterState, ReplicaState
from app.routing.tpot.router import TpotRouter
from app.sim.kv_cache import BlockPool
from app.sim.profiles import H100_8B
from app.sim.request import SimRequest
from app.sim.scheduler import Scheduler, SchedulerConfig
from app.surfaces import CHAT

INTERACTIVE, BULK = ClassDecision("interactive", "stream"), ClassDecision("bulk", "service_tier")
ARMS = ("spec", "bulk", "class", "tpot")
FENCE = "```python\ndef f(x):\n    return x\n```"


@dataclass
class Flight:
    """One request in an engine: what it measured and what decided it."""

    req: SimRequest
    kind: str
    interactive: bool
    arrival: float
    step: int
    replica: ReplicaState
    ctx: RequestContext | None = None
    first: float = 0.0
    last: float = 0.0
    events: int = 0
    batch_sum: float = 0.0  # decoding sequences of each of its decode steps, summed (--diagnose)
    decode_steps: int = 0
    predicted: tuple[float, float, float] | None = None  # (query batch, step s, tokens per step) it was priced at


@dataclass
class Engine:
    """A sim scheduler stepping in virtual time, with the counters its /metrics would show."""

    sched: Scheduler
    replica: ReplicaState
    busy_until: float = 0.0
    batch: list[Any] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(m.COUNTERS, 0.0))
    flights: dict[int, Flight] = field(default_factory=dict)

    def sample(self) -> dict[str, float]:
        c = self.sched.counters
        out = dict(self.counters)
        if self.sched.config.num_spec_tokens:
            out[m.SPEC_ACCEPTED], out[m.SPEC_DRAFT_TOKENS] = c.spec_accepted, c.spec_draft_tokens
            out[m.SPEC_DRAFTS] = c.spec_drafts
        else:
            for name in (m.SPEC_ACCEPTED, m.SPEC_DRAFT_TOKENS, m.SPEC_DRAFTS):
                out.pop(name, None)
        out[m.RUNNING], out[m.WAITING] = len(self.sched.running), len(self.sched.waiting)
        return out


def _config(arm: str) -> Any:
    price = {"gpu_hour_usd": 2.5, "capacity_tokens_per_s": 5000}
    pools = {"spec": {"role": "interactive", "served_model": "m", "replicas": ["http://spec"], "speculative": True,
                      "price": price, "max_num_seqs": 256},
             "bulk": {"role": "bulk", "served_model": "m", "replicas": ["http://bulk"], "price": price,
                      "max_num_seqs": 512}}
    if arm == "bulk":
        pools = {"bulk": pools["bulk"]}
    # Bulk never borrows the spec pool in any arm: the arms differ only in where interactive requests go.
    routing = {"tpot": {"enabled": arm == "tpot"}, "allow_spill": arm != "spec", "bulk_borrow_below_utilization": 0}
    return parse_config({"models": [{"name": "m", "pools": list(pools)}], "pools": pools, "routing": routing})


def run_arm(arm: str, args: argparse.Namespace) -> dict[int, list[Flight]]:
    """The whole ramp through one arm; finished interactive flights per step."""
    cfg = _config(arm)
    cluster = ClusterState.from_config(cfg)
    router = TpotRouter.for_config(cfg)
    cluster.tpot = router
    engines: dict[str, Engine] = {}
    for name, pool in cluster.pools.items():
        k = args.k if name == "spec" else 0
        sc = SchedulerConfig(max_num_seqs=256 if name == "spec" else 512, max_num_batched_tokens=8192,
                             max_model_len=8192, num_spec_tokens=k, spec_accept=args.chat_accept)
        engines[name] = Engine(Scheduler(sc, BlockPool(25_000, block_size=16), seed=args.seed), pool.replicas[0])
    rng = random.Random(args.seed)
    done: dict[int, list[Flight]] = {i: [] for i in range(len(args.rates))}
    done_tokens = [0.0, 0.0]  # output tokens of every finished request, and when the last one finished
    model = cfg.models[0]
    ids = itertools.count()
    # arrivals: (time, kind, step) for the interactive ramp and the bulk background
    events: list[tuple[float, int, str, int]] = []
    t = 0.0
    for i, rate in enumerate([args.rates[0], *args.rates]):  # step -1: warm-up at the first rate
        end = t + (args.warm_s if i == 0 else args.step_s)
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                t = end
                break
            heapq.heappush(events, (t, next(ids), "code" if rng.random() < 0.5 else "chat", i - 1))
    horizon = t
    tb = 0.0
    while True:
        tb += rng.expovariate(args.bulk_rate)
        if tb >= horizon:
            break
        heapq.heappush(events, (tb, next(ids), "bulk", -1))
    next_scrape = 0.0
    now = 0.0
    prompt_rng = random.Random(args.seed + 1)

    def submit(at: float, kind: str, step: int) -> None:
        interactive = kind != "bulk"
        n_prompt, max_tokens = {"code": (300, 256), "chat": (60, 128), "bulk": (80, 256)}[kind]
        body: dict[str, Any] = {"messages": [{"role": "user", "content": FENCE if kind == "code" else "hi"}],
                                "max_tokens": max_tokens}
        route = pick(model=model, decision=INTERACTIVE if interactive else BULK, key=next(ids), cluster=cluster,
                     cfg=cfg.routing, body=body, tenant="t", prompt_tokens=n_prompt)
        eng = engines[route.pool]
        prompt = [prompt_rng.randrange(50_000) for _ in range(n_prompt)]
        eos = 1 + int(prompt_rng.expovariate(1 / 512))
        req = SimRequest(f"r{next(ids)}", prompt, max_tokens=max_tokens, eos_at=eos, arrival=at,
                         accept=args.code_accept if kind == "code" else args.chat_accept)
        eng.replica.on_start()
        ctx = None
        if interactive:
            ctx = RequestContext(request_id=req.rid, surface=CHAT, path="/v1/chat/completions", body=body, model="m",
                                 stream=True, client_wants_usage=True, headers={})
            ctx.tenant, ctx.route_class, ctx.route, ctx.status = Tenant("t"), INTERACTIVE, route, 200
        eng.flights[id(req)] = Flight(req, kind, interactive, at, step, eng.replica, ctx,
                                      predicted=priced.get(route.pool))
        priced.clear()
        eng.sched.add(req)

    while events or any(e.sched.has_work() or e.batch for e in engines.values()):
        step_ends = [(e.busy_until, name) for name, e in engines.items() if e.batch]
        t_next = events[0][0] if events else float("inf")
        t_step = min(step_ends)[0] if step_ends else float("inf")
        now = min(t_next, t_step, next_scrape)
        if now == next_scrape:
            for e in engines.values():
                e.replica.apply_metrics(e.sample(), now)
            next_scrape += args.probe_s
        elif now == t_step:
            e = engines[min(step_ends)[1]]
            dt = e.busy_until - e.counters["_start"]
            produced, finished = e.sched.finish_step(e.batch, lambda r, k: 1000 + k % 997, now)
            decoding = sum(1 for r, c in produced if r.num_output > c)
            e.counters[m.ITL_SUM] += dt * decoding
            e.counters[m.ITL_COUNT] += decoding
            e.counters[m.GENERATION_TOKENS] += sum(c for _, c in produced)
            for r, c in produced:
                f = e.flights[id(r)]
                f.events += 1
                if r.num_output > c:
                    f.batch_sum += decoding
                    f.decode_steps += 1
                if r.num_output == c:
                    f.first = now
                    e.counters[m.TTFT_SUM] += now - f.arrival
                    e.counters[m.TTFT_COUNT] += 1
                    e.counters[m.PROMPT_TOKENS] += r.num_prompt
                    e.counters[m.PROMPT_TOKENS_CACHED] += max(r.cached_tokens, 0)
                    e.counters[m.PREFILL_TIME_SUM] += now - r.scheduled_ts
                f.last = now
            for r in finished:
                f = e.flights.pop(id(r))
                done_tokens[0] += r.num_output
                done_tokens[1] = now
                f.replica.on_success()
                if f.ctx is not None and r.num_output > 1:
                    f.ctx.usage.completion_tokens, f.ctx.stream_events = r.num_output, f.events
                    f.ctx.timing.first_token, f.ctx.timing.end = f.first, f.last
                    if router is not None:
                        router.observe(f.ctx)
                    if f.step >= 0:
                        done[f.step].append(f)
            e.batch = []
        else:
            at, _, kind, step = heapq.heappop(events)
            submit(at, kind, step)
        for e in engines.values():
            if not e.batch and e.sched.has_work():
                e.batch = e.sched.schedule(now)
                if e.batch:
                    e.counters["_start"] = now
                    e.busy_until = now + H100_8B.step_time(e.sched.step_cost(e.batch))
    throughput[arm] = done_tokens[0] / done_tokens[1]
    return done


throughput: dict[str, float] = {}
priced: dict[str, tuple[float, float, float]] = {}  # pool -> what the last pick priced it at (--diagnose)


def _record_pricing() -> None:
    """Wrap the router's best_total so each pick leaves (batch, step s, tokens per step) per pool in `priced`."""
    import app.routing.tpot.router as tr
    from app.routing.tpot.predict import expected_batch

    inner = tr.best_total

    def best_total(model: Any, candidates: Any, tokens_per_step: float, output_tokens: int) -> tuple[float, float]:
        total, tpot = inner(model, candidates, tokens_per_step, output_tokens)
        for r in candidates:  # best_total's own steps, to see which batch it priced
            others = r.in_flight + r.external
            batch = min(others + 1, r.capacity or 1 << 30)
            step = model.fit.predict(batch)
            level = model.levels.get(r.url)
            if step is not None and level is not None and level.lifetime_s > 0 and output_tokens > 1:
                life = (output_tokens - 1) * step / tokens_per_step
                batch = expected_batch(others, level.level, level.lifetime_s, life, r.capacity)
                step = model.fit.predict(batch) or step
            if step is not None and abs(step / tokens_per_step - tpot) < 1e-12:
                priced[model.name] = (batch, step, tokens_per_step)
        return total, tpot

    tr.best_total = best_total


def diagnose(results: dict[str, dict[int, list[Flight]]], rates: list[float]) -> None:
    """Where the tpot arm's prediction error comes from: per step, pool and kind, the signed error of the
    step time and of tokens per step, and the batch priced against the batch seen."""
    import statistics as st

    print("step  pool kind    n  med|err|  med(pred/obs)  step pred/obs  tok/step pred/obs  batch priced  seen")
    for i, rate in enumerate(rates):
        for pool in ("spec", "bulk"):
            for kind in ("code", "chat"):
                fl = [f for f in results["tpot"][i] if f.kind == kind and f.ctx and f.ctx.route
                      and f.ctx.route.pool == pool and f.ctx.route.prediction and f.predicted and f.decode_steps > 1]
                if not fl:
                    continue
                ratio = [f.ctx.route.prediction.tpot_s / _tpot(f) for f in fl]
                step_r = [f.predicted[1] / ((f.last - f.first) / (f.events - 1)) for f in fl]
                tok_r = [f.predicted[2] / ((f.req.num_output - 1) / (f.events - 1)) for f in fl]
                print(f"{rate:4g} {pool:>5s} {kind:4s} {len(fl):4d} {st.median(abs(r - 1) for r in ratio):9.3f}"
                      f" {st.median(ratio):14.3f} {st.median(step_r):14.3f} {st.median(tok_r):18.3f}"
                      f" {st.median(f.predicted[0] for f in fl):13.0f}"
                      f" {st.median(f.batch_sum / f.decode_steps for f in fl):5.0f}")


def _pct(vals: list[float], p: float) -> float | None:
    if not vals:
        return None
    s = sorted(vals)
    return s[min(int(p / 100 * len(s)), len(s) - 1)]


def _tpot(f: Flight) -> float:
    return (f.last - f.first) / (f.req.num_output - 1)


def report(args: argparse.Namespace, results: dict[str, dict[int, list[Flight]]]) -> None:
    """Per step: TPOT p50/p99 per arm, the verdicts, the tpot arm's shares and prediction error."""
    print(
        f"virtual time; h100-8b; spec K={args.k}, accept {args.code_accept} code / {args.chat_accept} chat; bulk "
        f"{args.bulk_rate:g} req/s; {args.step_s:g} s per step; probe {args.probe_s:g} s; seed {args.seed}"
    )
    hdr = f"{'req/s':>6s} {'metric':14s}" + "".join(f"{a:>9s}" for a in ARMS) + "  tpot <= min(spec, bulk)"
    print(hdr)
    print("-" * len(hdr))
    for i, rate in enumerate(args.rates):
        for label, p in (("TPOT p50 ms", 50.0), ("TPOT p99 ms", 99.0)):
            vals = {a: _pct([_tpot(f) * 1000 for f in results[a][i] if f.req.num_output > 1], p) for a in results}
            best = min(v for a, v in vals.items() if a in ("spec", "bulk") and v is not None)
            t = vals["tpot"]
            verdict = f"{'yes' if t is not None and t <= best else 'NO'} ({(t or 0) / best:.2f}x)"
            print(f"{rate:>6g} {label:14s}" + "".join(f"{(vals[a] or 0):9.2f}" for a in ARMS) + f"  {verdict}")
        fl = results["tpot"][i]
        to_bulk = {k: sum(1 for f in fl if f.kind == k and f.ctx and f.ctx.route and f.ctx.route.pool == "bulk")
                   for k in ("code", "chat")}
        errs = [abs(f.ctx.route.prediction.tpot_s - _tpot(f)) / _tpot(f) for f in fl
                if f.ctx and f.ctx.route and f.ctx.route.prediction and f.req.num_output > 1]
        n = {k: sum(1 for f in fl if f.kind == k) for k in ("code", "chat")}
        print(
            f"{'':>6s} tpot arm: to bulk code {to_bulk['code']}/{n['code']}, chat {to_bulk['chat']}/{n['chat']}; "
            f"median |pred-obs|/obs {(_pct(errs, 50) or 0):.3f} over {len(errs)}"
        )
    every = {a: [_tpot(f) * 1000 for fl in results[a].values() for f in fl if f.req.num_output > 1] for a in results}
    print("whole ramp: " + "; ".join(f"{a} p50 {_pct(v, 50):.2f} p99 {_pct(v, 99):.2f}" for a, v in every.items()))
    errs = [abs(f.ctx.route.prediction.tpot_s - _tpot(f)) / _tpot(f) for fl in results["tpot"].values() for f in fl
            if f.ctx and f.ctx.route and f.ctx.route.prediction and f.req.num_output > 1]
    print(f"tpot arm median |pred-obs|/obs TPOT over the ramp: {(_pct(errs, 50) or 0):.3f} ({len(errs)} requests)")
    print(
        "output tok/s (all requests, until the last one finished): "
        + "; ".join(f"{a} {v:.0f}" for a, v in throughput.items())
        + f"; tpot/class {throughput['tpot'] / throughput['class']:.3f}"
    )


def main() -> None:
    """Parse arguments, run the arms, print the tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=[15.0, 40.0, 65.0, 90.0])
    p.add_argument("--bulk-rate", type=float, default=25.0)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--code-accept", type=float, default=0.85)
    p.add_argument("--chat-accept", type=float, default=0.3)
    p.add_argument("--step-s", type=float, default=8.0, help="virtual seconds per step")
    p.add_argument("--warm-s", type=float, default=3.0)
    p.add_argument("--probe-s", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--diagnose", action="store_true", help="break the tpot arm's error down (step time, tokens/step)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = p.parse_args()
    t0 = time.process_time()
    if args.diagnose:
        _record_pricing()
    results = {arm: run_arm(arm, args) for arm in args.arms}
    if set(ARMS) <= set(results):
        report(args, results)
    if args.diagnose:
        diagnose(results, args.rates)
    print(f"CPU {time.process_time() - t0:.0f} s")


if __name__ == "__main__":
    main()
