"""How close to "alone" any admission queue can bring a light tenant on a full engine: the sim's step model.

The sim's own scheduler (app.sim.scheduler) and step-time model (app.sim.profiles, h100-8b) run here on a fake
clock, no processes, no HTTP: steps back to back, each lasting what the profile says. Arms:
  alone         the light tenant only (Poisson, its rate)
  no_queue      both tenants straight to the engine (its FCFS queue)
  cap           a gateway that sees every engine step exactly (a bound on what a real one, which sees scrapes and
                its own sends, can do): light requests start at once up to `max_num_seqs` in flight (they are
                under their share), heavy ones up to `--headroom` fewer (the reserve)
  + 1 heavy start/step   and at most one heavy request starts per engine step (no prefill bursts)
  + quiet light prefill  and no heavy request starts while a light one waits for its first token
  below         both tenants Poisson at `--below-load` of their rates, no queue (the below-saturation arms)
The light tenant's TTFT = the API server's overhead + engine queue + its prefill step (modeled ms).

    .venv/bin/python experiments/fair_queue_bound.py
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from app.bench.report import percentile
from app.sim.kv_cache import BlockPool
from app.sim.profiles import H100_8B, Profile
from app.sim.request import SimRequest, Status
from app.sim.scheduler import Scheduler, SchedulerConfig

LIGHT, HEAVY = "light", "heavy"
UNBOUNDED = 1 << 30


@dataclass(frozen=True, slots=True)
class Policy:
    """How the modeled gateway starts requests: light ones up to `cap` in flight; heavy ones up to `cap -
    headroom`, at most `per_step` per engine step, none while a light request waits for its first token (`quiet`)."""

    cap: int = UNBOUNDED
    headroom: int = 0
    per_step: int = UNBOUNDED
    quiet: bool = False
    pace: float = 0.0  # heavy starts at most `pace` x the recent completion rate (the gateway's pacing), 0: off
    # The gateway's own clock (app.admission): starts land anywhere inside a step, not only at step ends; each
    # request reaches the engine `rtt` after its start and the gateway sees a first token `rtt` after its step.
    clock: bool = False
    gate: int = 0  # (clock) heavy starts only while fewer than this have no first token seen yet; 0: off


def poisson(rate: float, until: float, rng: random.Random) -> Iterator[float]:
    """Arrival times in [0, until)."""
    t = 0.0
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= until:
            return
        yield t


class Model:
    """One engine on a fake clock; `run` returns the light tenant's TTFTs (seconds) after the warm-up."""

    def __init__(self, args: argparse.Namespace, profile: Profile) -> None:
        self.args = args
        self.profile = profile
        cfg = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                              max_model_len=8192)
        self.sched = Scheduler(cfg, BlockPool(25_000, block_size=16, enable_caching=False))
        self._ids = itertools.count(1)
        self.tenant: dict[int, str] = {}
        self.generated = 0

    def request(self, now: float) -> SimRequest:
        """A request with a unique 512-token prompt (no cache hits), arriving at the engine at `now`."""
        n = next(self._ids)
        prompt = [n] + [7] * (self.args.prompt_tokens - 1)
        return SimRequest(str(n), prompt, max_tokens=self.args.output_tokens, arrival=now, seq=n)

    def run(self, light: list[float], heavy: list[float], policy: Policy) -> list[float]:
        """Step the engine with a gateway in front that starts requests as `policy` says; light TTFTs (s)."""
        if policy.clock:
            return self.run_clocked(light, heavy, policy)
        overhead = self.profile.request_overhead_s
        events = sorted([(t, LIGHT) for t in light] + [(t, HEAVY) for t in heavy])
        sched, now, i = self.sched, 0.0, 0
        waiting: dict[str, deque[float]] = {LIGHT: deque(), HEAVY: deque()}
        done: deque[float] = deque(maxlen=64)  # completion times, for the pacing rate
        paced_until = 0.0
        ttft: list[float] = []
        end = self.args.duration
        while now < end:
            while i < len(events) and events[i][0] <= now:
                at, who = events[i]
                i += 1
                waiting[who].append(at)
            # The light tenant is under its share: it goes first, up to the cap.
            while waiting[LIGHT] and len(self.tenant) < policy.cap:
                self._add(self.request(waiting[LIGHT].popleft()), LIGHT)
            started = 0
            light_prefilling = policy.quiet and any(
                self.tenant[r.seq] == LIGHT and r.num_output == 0 for r in (*sched.waiting, *sched.running)
            )
            while (waiting[HEAVY] and len(self.tenant) < policy.cap - policy.headroom and started < policy.per_step
                   and not light_prefilling and now >= paced_until):
                self._add(self.request(waiting[HEAVY].popleft()), HEAVY)
                started += 1
                if policy.pace and len(done) >= 8 and done[-1] > done[0]:
                    paced_until = now + (done[-1] - done[0]) / (len(done) - 1) / policy.pace
            if not sched.has_work():
                now = events[i][0] if i < len(events) else end
                continue
            batch = sched.schedule(now)
            now += self.profile.step_time(sched.step_cost(batch))
            produced, finished = sched.finish_step(batch, lambda r, k: 11, now)
            for req, count in produced:
                self.generated += count
                if req.num_output == count and self.tenant[req.seq] == LIGHT and req.arrival >= self.args.warmup:
                    ttft.append(now - req.arrival + overhead)
            for req in finished:
                del self.tenant[req.seq]
                done.append(now)
        return ttft

    def run_clocked(self, light: list[float], heavy: list[float], policy: Policy) -> list[float]:
        """As `run`, with starts timed on the gateway's clock (between steps too) and a round trip each way."""
        overhead, rtt = self.profile.request_overhead_s, self.args.rtt
        events = sorted([(t, LIGHT) for t in light] + [(t, HEAVY) for t in heavy])
        sched, now, prev, i = self.sched, 0.0, 0.0, 0
        heavy_waiting: deque[float] = deque()
        sent: list[tuple[float, int, SimRequest, str]] = []  # (reaches the engine at, seq, request, tenant)
        done: deque[float] = deque(maxlen=64)
        paced_until = gate_open_at = 0.0
        unprefilled = 0  # heavy starts whose first token the gateway has not seen
        ttft: list[float] = []
        while now < self.args.duration:
            while i < len(events) and events[i][0] <= now:
                at, who = events[i]
                i += 1
                if who == LIGHT and len(self.tenant) < policy.cap:
                    self._send(sent, self.request(at), LIGHT, at + rtt)  # under its share: sent on arrival
                else:
                    heavy_waiting.append(at)  # (a light request over the cap would wait: not at these rates)
            t = max(paced_until, gate_open_at, prev)  # the earliest a heavy start could have happened since
            while (heavy_waiting and len(self.tenant) < policy.cap - policy.headroom and t <= now
                   and (not policy.gate or unprefilled < policy.gate)):
                self._send(sent, self.request(max(heavy_waiting.popleft(), t)), HEAVY, t + rtt)
                unprefilled += 1
                if policy.pace and len(done) >= 8 and done[-1] > done[0]:
                    paced_until = t + (done[-1] - done[0]) / (len(done) - 1) / policy.pace
                t = max(paced_until, gate_open_at, t)
            sent.sort()
            while sent and sent[0][0] <= now:
                _, _, req, who = sent.pop(0)
                req.status = Status.WAITING
                sched.add(req)
            if not sched.has_work():
                nxt = min([e[0] for e in events[i : i + 1]] + [x[0] for x in sent[:1]] + [self.args.duration])
                prev, now = now, max(nxt, now)
                continue
            batch = sched.schedule(now)
            prev, now = now, now + self.profile.step_time(sched.step_cost(batch))
            produced, finished = sched.finish_step(batch, lambda r, k: 11, now)
            for req, count in produced:
                self.generated += count
                if req.num_output != count:
                    continue
                if self.tenant[req.seq] == LIGHT:
                    if req.arrival >= self.args.warmup:
                        ttft.append(now - req.arrival + overhead)
                else:
                    unprefilled -= 1
                    gate_open_at = now + rtt
            for req in finished:
                del self.tenant[req.seq]
                done.append(now)
        return ttft

    def _send(self, sent: list[tuple[float, int, SimRequest, str]], req: SimRequest, who: str, at: float) -> None:
        self.tenant[req.seq] = who
        sent.append((at, req.seq, req, who))

    def _add(self, req: SimRequest, who: str) -> None:
        self.tenant[req.seq] = who
        req.status = Status.WAITING
        self.sched.add(req)


def main() -> None:
    """Every arm on the same seeded arrivals; a table of light TTFT vs alone."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=H100_8B.default_max_num_batched_tokens)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--light-rate", type=float, default=4.0)
    p.add_argument("--heavy-factor", type=float, default=10.0)
    p.add_argument("--below-load", type=float, default=0.5)
    p.add_argument("--headroom", type=int, default=2, help="slots kept free of heavy requests (reserve)")
    p.add_argument("--pace", type=float, nargs="*", default=[1.5, 2.0, 3.0],
                   help="heavy starts at most this many times the completion rate (the gateway's pacing)")
    p.add_argument("--rtt", type=float, default=0.004,
                   help="modeled s from a start to the engine queue, and from a first token to the gateway (the "
                        "gateway's clock arms)")
    p.add_argument("--duration", type=float, default=600.0, help="modeled seconds (long: a p99 of many samples)")
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    light = list(poisson(args.light_rate, args.duration, rng))
    heavy = list(poisson(args.light_rate * args.heavy_factor, args.duration, rng))
    half_light = [t for t in light if rng.random() < args.below_load]
    half_heavy = [t for t in heavy if rng.random() < args.below_load]
    cap, h = args.max_num_seqs, args.headroom
    arms = {
        "alone": (light, [], Policy()),
        "no_queue": (light, heavy, Policy()),
        f"cap {cap}, headroom {h}": (light, heavy, Policy(cap, h)),
        "  + 1 heavy start/step": (light, heavy, Policy(cap, h, 1)),
        "  + quiet light prefill": (light, heavy, Policy(cap, h, 1, quiet=True)),
        **{f"cap {cap}, headroom {h}, paced {k:g}x": (light, heavy, Policy(cap, h, pace=k)) for k in args.pace},
        **{f"  on the gateway's clock, {k:g}x": (light, heavy, Policy(cap, h, pace=k, clock=True))
           for k in args.pace},
        "  + prefill gate 1": (light, heavy, Policy(cap, h, pace=max(args.pace or [0]), clock=True, gate=1)),
        "  prefill gate 1, unpaced": (light, heavy, Policy(cap, h, clock=True, gate=1)),
        "below (no queue)": (half_light, half_heavy, Policy()),
    }
    print(f"h100-8b step model, --max-num-seqs {args.max_num_seqs}, --max-num-batched-tokens "
          f"{args.max_num_batched_tokens}; prompts {args.prompt_tokens} uncached, {args.output_tokens} output; light "
          f"{args.light_rate:g} req/s Poisson; {args.duration:g} s modeled per arm, seed {args.seed}")
    print(f"{'arm':30s} {'light n':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99/alone':>9s} {'tokens/s':>9s} "
          f"{'vs no_queue':>11s}")
    base = base_tps = None
    for name, (lt, hv, policy) in arms.items():
        m = Model(args, H100_8B)
        ttft = [t * 1000 for t in m.run(lt, hv, policy)]
        p50, p99 = percentile(ttft, 50), percentile(ttft, 99)
        base = base if base is not None else p99
        tps = m.generated / args.duration * (1 + args.prompt_tokens / args.output_tokens)
        base_tps = tps if name == "no_queue" else base_tps
        vs = f"{tps / base_tps:.2f}x" if base_tps else "-"
        print(f"{name:30s} {len(ttft):7d} {p50:8.1f} {p99:8.1f} {p99 / base:8.2f}x {tps:9.0f} {vs:>11s}")


if __name__ == "__main__":
    main()
