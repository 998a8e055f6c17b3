"""The real admission queue (app.admission.AdmissionQueue, the defaults) in front of the sim's engine, on a fake clock.

fair_queue_eval.py measures the gateway for real (processes, HTTP, a loaded host) and takes minutes per arm;
this runs the same scenario — a light tenant beside a heavy one on one saturated replica — in virtual time in
a second, so a change to app/admission can be tried on many seeds before the real run confirms it:

- the engine is the sim's own scheduler (app.sim.scheduler) and step-time model (h100-8b), steps back to back;
- the gateway is AdmissionQueue with the config's defaults (enabled unset, so fair with two tenants), its clock
  and timers on the virtual loop; a request reaches the engine `--rtt` after its ticket and the gateway sees
  its first token and its end `--rtt` after the step that made them (the relay tells the ticket of the first
  token, as app/admission/hook.py's stream does), and a scrape every `--probe-interval` feeds on_state_change
  with the engine's running/waiting and the gateway's in-flight count (ReplicaState.queued()'s arithmetic);
- TTFT = queue wait + engine + the profile's API overhead + 2 x rtt (modeled seconds throughout).

    .venv/bin/python experiments/admission_model.py [--seeds 0-9] [--max-num-seqs 4] [--light-rate 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import selectors
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.admission import AdmissionQueue, AdmissionRejected
from app.bench.report import percentile
from app.config.admission import AdmissionConfig
from app.sim.kv_cache import BlockPool
from app.sim.profiles import H100_8B
from app.sim.request import SimRequest, Status
from app.sim.scheduler import Scheduler, SchedulerConfig

LIGHT, HEAVY = "light", "heavy"


# ------------------------------------------------------------------------------------------------ virtual time


class _Selector(selectors.DefaultSelector):
    """Never sleeps: when nothing is ready, the loop's clock jumps to its next timer."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if not ready and timeout:
            self.now += timeout
        return ready


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose time() is virtual (advanced by _Selector); asyncio.sleep and call_later follow it."""

    def __init__(self) -> None:
        self._vsel = _Selector()
        super().__init__(self._vsel)

    def time(self) -> float:
        return self._vsel.now


# ------------------------------------------------------------------------------------------------ the model


@dataclass
class Rec:
    tenant: str
    arrival: float
    ttft: float | None = None
    waited: float = 0.0
    queued: bool = False
    rejected: bool = False
    tokens: int = 0


@dataclass
class Engine:
    """One sim replica stepping on the virtual clock; requests' first-token and done events as futures."""

    args: argparse.Namespace
    sched: Scheduler = field(init=False)
    first: dict[int, asyncio.Future[float]] = field(default_factory=dict)
    done: dict[int, asyncio.Future[float]] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: int = 0  # prompt + generated tokens computed (the sims' counters)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        cfg = SchedulerConfig(max_num_seqs=self.args.max_num_seqs,
                              max_num_batched_tokens=H100_8B.default_max_num_batched_tokens, max_model_len=8192)
        self.sched = Scheduler(cfg, BlockPool(25_000, block_size=16, enable_caching=False))

    def submit(self, now: float) -> int:
        n = next(self.ids)
        req = SimRequest(str(n), [n] + [7] * (self.args.prompt_tokens - 1), max_tokens=self.args.output_tokens,
                         arrival=now, seq=n)
        loop = asyncio.get_running_loop()
        self.first[n], self.done[n] = loop.create_future(), loop.create_future()
        req.status = Status.WAITING
        self.sched.add(req)
        self.wake.set()
        return n

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.sched.has_work():
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = self.sched.schedule(loop.time())
            await asyncio.sleep(H100_8B.step_time(self.sched.step_cost(batch)))
            now = loop.time()
            produced, finished = self.sched.finish_step(batch, lambda r, k: 11, now)
            for s in batch:
                self.tokens += s.num_new
            for req, count in produced:
                if req.num_output == count:
                    self.first.pop(req.seq).set_result(now)
            for req in finished:
                self.done.pop(req.seq).set_result(now)


@dataclass
class Replica:
    """What the queue's saturation check reads (app.admission.saturation.ReplicaLoad)."""

    engine: Engine
    capacity: int
    in_flight: int = 0
    in_flight_at_scrape: int = 0
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    external: int = 0

    def queued(self) -> int:
        q = self.waiting + self.in_flight - self.in_flight_at_scrape if self.waiting > 0 else 0
        over = self.in_flight + self.external - self.capacity
        return max(q, over, 0)


async def client(rec: Rec, queue: AdmissionQueue, replica: Replica, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    predicted = args.prompt_tokens + args.output_tokens
    try:
        ticket = await queue.acquire(rec.tenant, "bulk", predicted, watch_first_token=True)
    except AdmissionRejected:
        rec.rejected = True
        return
    rec.waited, rec.queued = ticket.waited_s, ticket.queued
    replica.in_flight += 1
    try:
        await asyncio.sleep(args.rtt)
        n = replica.engine.submit(loop.time())
        first_at = await replica.engine.first[n]
        await asyncio.sleep(max(first_at + args.rtt - loop.time(), 0))
        rec.ttft = loop.time() - rec.arrival + H100_8B.request_overhead_s
        ticket.first_token()
        done_at = await replica.engine.done[n]
        await asyncio.sleep(max(done_at + args.rtt - loop.time(), 0))
        rec.tokens = predicted
        ticket.settle(predicted)
    finally:
        replica.in_flight -= 1
        ticket.release()


async def scraper(queue: AdmissionQueue, replica: Replica, every: float) -> None:
    # The first probe comes before the load (fair_queue_eval waits two intervals): the declared slots are known.
    while True:
        s = replica.engine.sched
        replica.running, replica.waiting = len(s.running), len(s.waiting)
        replica.in_flight_at_scrape = replica.in_flight
        queue.on_state_change([replica])
        await asyncio.sleep(every)


def arrivals(rate: float, until: float, rng: random.Random) -> list[float]:
    out, t = [], 0.0
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= until:
            return out
        out.append(t)
    return out


async def one_run(args: argparse.Namespace, seed: int, heavy: bool, cfg: AdmissionConfig) -> tuple[list[Rec], float]:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    plan = [(t, LIGHT) for t in arrivals(args.light_rate, args.duration, rng)]
    if heavy:
        plan += [(t, HEAVY) for t in arrivals(args.light_rate * args.heavy_factor, args.duration, rng)]
    plan.sort()
    engine = Engine(args)
    replica = Replica(engine, capacity=args.max_num_seqs)
    queue = AdmissionQueue(cfg, pool="bulk", clock=loop.time)
    tasks = [asyncio.create_task(engine.run()), asyncio.create_task(scraper(queue, replica, args.probe_interval))]
    recs: list[Rec] = []
    reqs: list[asyncio.Task[None]] = []
    t0 = loop.time()
    before = None
    for at, tenant in plan:
        if before is None and at >= args.warmup:
            await asyncio.sleep(max(t0 + args.warmup - loop.time(), 0))
            before = engine.tokens
        await asyncio.sleep(max(t0 + at - loop.time(), 0))
        rec = Rec(tenant, loop.time())
        recs.append(rec)
        reqs.append(asyncio.create_task(client(rec, queue, replica, args)))
    await asyncio.sleep(max(t0 + args.duration - loop.time(), 0))
    tps = (engine.tokens - (before or 0)) / (args.duration - args.warmup)
    await asyncio.wait(reqs, timeout=args.drain)
    for t in (*tasks, *reqs):
        t.cancel()
    await asyncio.gather(*tasks, *reqs, return_exceptions=True)
    return [r for r in recs if r.arrival - t0 >= args.warmup], tps


def run(args: argparse.Namespace, seed: int, heavy: bool, cfg: AdmissionConfig) -> tuple[list[Rec], float]:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(one_run(args, seed, heavy, cfg))
    finally:
        loop.close()


def seeds(spec: str) -> list[int]:
    if "-" in spec:
        a, b = spec.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in spec.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--light-rate", type=float, default=2.0)
    ap.add_argument("--heavy-factor", type=float, default=12.0)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--drain", type=float, default=10.0)
    ap.add_argument("--probe-interval", type=float, default=1.5)
    ap.add_argument("--rtt", type=float, default=0.002)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an AdmissionConfig field for the fair arm (JSON value), e.g. reserve_max_fraction=0.5")
    args = ap.parse_args()
    import orjson

    fair_cfg = AdmissionConfig(**{k: orjson.loads(v) for k, v in (s.split("=", 1) for s in args.set)})
    off = AdmissionConfig(enabled=False)
    print(f"h100-8b step model, --max-num-seqs {args.max_num_seqs}; light {args.light_rate:g} req/s, heavy "
          f"x{args.heavy_factor:g}; {args.duration:g} s, measured after {args.warmup:g} s; fair arm: "
          f"{args.set or 'defaults'}; modeled ms")
    print(f"{'seed':>4} {'alone p99':>9} {'noq tok/s':>9} | {'fair p50':>8} {'p99':>7} {'max':>7} {'+solo ms':>8} "
          f"{'tok/s':>6} {'x noq':>6} {'light q':>7} {'light 429':>9} {'heavy done':>10}")
    worst_gap, worst_ratio = -1e9, 9.0
    for seed in seeds(args.seeds):
        alone, _ = run(args, seed, False, off)
        _, noq_tps = run(args, seed, True, off)
        fair, tps = run(args, seed, True, fair_cfg)

        def ttfts(recs: list[Rec]) -> list[float]:
            return [r.ttft * 1000 for r in recs if r.tenant == LIGHT and r.ttft is not None]

        a99 = percentile(ttfts(alone), 99) or 0.0
        lt = ttfts(fair)
        f50, f99 = percentile(lt, 50) or 0.0, percentile(lt, 99) or 0.0
        light = [r for r in fair if r.tenant == LIGHT]
        heavy_done = sum(1 for r in fair if r.tenant == HEAVY and r.tokens)
        worst_gap, worst_ratio = max(worst_gap, f99 - a99), min(worst_ratio, tps / noq_tps)
        print(f"{seed:>4} {a99:>9.1f} {noq_tps:>9.0f} | {f50:>8.1f} {f99:>7.1f} {max(lt, default=0):>7.1f} "
              f"{f99 - a99:>8.1f} {tps:>6.0f} {tps / noq_tps:>6.3f} "
              f"{sum(r.waited > 0.001 for r in light):>3}/{len(light):<3} "
              f"{sum(r.rejected for r in light):>9} {heavy_done:>10}")
    print(f"worst: light p99 - alone p99 {worst_gap:.1f} ms (target <= 500), tokens/s {worst_ratio:.3f}x of no queue "
          f"(target >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
