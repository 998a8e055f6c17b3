"""Where the light tenant's TTFT tail goes, from a real run's step trace (fair_queue_eval.py --step-trace DIR).

Per request (joined on x-request-id: client record + the sim's step trace), modeled ms:
  before   client send -> the sim's API server has it (gateway queue, gateway work, HTTP to the sim)
  api      the sim's modeled API-server overhead (2 ms on h100-8b)
  queue    in the engine's queue: the rest of the step in flight when it arrived, plus whole steps it waited
  prefill  its prefill step, start to end (and how many other prefills / prompt tokens shared it)
  after    the sim emitted the first token -> the client read it (sim HTTP, gateway relay)
Then the replay: the very times at which requests reached the real engine's queue fed to the sim's own scheduler
and step model (app.sim.scheduler, app.sim.profiles) on a fake clock, as experiments/fair_queue_bound.py does.
Same arrivals, model engine: if its light TTFTs match the measured engine part, the sim behaves like its model and
the tail is the arrival pattern the gateway produced; if not, the sim (or the host under it) deviates.

    .venv/bin/python experiments/fair_queue_replay.py /tmp/trace/fair_queue.json [more.json ...]
"""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from app.bench.report import percentile
from app.sim.kv_cache import BlockPool
from app.sim.profiles import H100_8B
from app.sim.request import SimRequest, Status
from app.sim.scheduler import Scheduler, SchedulerConfig

SEGMENTS = ("before", "api", "queue", "prefill", "after")


def load(path: Path) -> dict[str, Any]:
    """One arm's dump."""
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def joined(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per request that got a first token: client and sim timestamps side by side, modeled ms segments."""
    ts = data["time_scale"]
    sims = data["sims"]
    by_rid: dict[str, tuple[dict[str, Any], dict[int, tuple[Any, ...]]]] = {}
    for sim in sims:
        steps = {s[0]: tuple(s) for s in sim["steps"]}
        for r in sim["requests"]:
            by_rid[r["rid"]] = (r, steps)
    out = []
    for c in data["clients"]:
        hit = by_rid.get(c["rid"])
        if hit is None or c["ttft"] is None or c["cut_off"] or c["error"] is not None:
            continue
        r, steps = hit
        if r["first_token"] is None or r["step"] is None:
            continue
        step = steps.get(r["step"])
        if step is None:
            continue
        # (index, scheduled_at, start, modeled_s, ended_at, prefills, prefill_tokens, decodes, waiting)
        _, sched_at, _start, modeled_s, ended_at, prefills, ptoks, decodes, _waiting = step
        client_first = c["sent_at"] + c["ttft"]
        ms = 1000.0 * ts
        seg = {
            "before": (r["arrival"] - c["sent_at"]) * ms,
            "api": (r["enqueued"] - r["arrival"]) * ms,
            "queue": (sched_at - r["enqueued"]) * ms,
            "prefill": (r["first_token"] - sched_at) * ms,
            "after": (client_first - r["first_token"]) * ms,
        }
        out.append({
            "rid": c["rid"], "tenant": c["tenant"], "arrival": c["arrival"], "ttft": c["ttft"] * ms,
            "gateway_wait": (c["gateway_wait"] or 0.0) * ms, "seg": seg, "step": r["step"],
            "steps_waited": _steps_between(steps, r["enqueued"], r["step"]),
            "prefills": prefills, "prefill_tokens": ptoks, "decodes": decodes, "step_modeled": modeled_s * 1000,
            "step_wall": (ended_at - sched_at) * ms,
            "enqueued": r["enqueued"], "prompt": r["prompt"],
        })
    return out


def _steps_between(steps: dict[int, tuple[Any, ...]], at: float, sched_step: int) -> int:
    """Whole steps the request waited after the one in flight when it reached the queue."""
    n = 0
    i = sched_step - 1
    while i in steps and steps[i][1] > at:  # scheduled after it arrived: a step it could have joined
        n += 1
        i -= 1
    return n


def replay(data: dict[str, Any], max_num_seqs: int, budget: int) -> dict[str, float]:
    """The measured engine-queue arrival times through the sim's scheduler + step model: rid -> modeled
    ms from reaching the queue to the first token."""
    ts = data["time_scale"]
    reqs = [r for sim in data["sims"] for r in sim["requests"]]
    t0 = min(r["enqueued"] for r in reqs)
    # Prefix caching is on in the sim (the chat template's first block hits): the replay computes what it did.
    events = sorted(((r["enqueued"] - t0) * ts, r["rid"], r["prompt"] - (r.get("cached") or 0)) for r in reqs)
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=8192)
    sched = Scheduler(cfg, BlockPool(25_000, block_size=16, enable_caching=False))
    ids = itertools.count(1)
    arrived: dict[int, tuple[str, float]] = {}
    out: dict[str, float] = {}
    now, i = 0.0, 0
    while i < len(events) or sched.has_work():
        while i < len(events) and events[i][0] <= now:
            at, rid, n_prompt = events[i]
            i += 1
            n = next(ids)
            req = SimRequest(rid, [n] + [7] * (n_prompt - 1), max_tokens=128, arrival=at, seq=n)
            req.status = Status.WAITING
            sched.add(req)
            arrived[n] = (rid, at)
        if not sched.has_work():
            now = events[i][0]
            continue
        batch = sched.schedule(now)
        now += H100_8B.step_time(sched.step_cost(batch))
        produced, _ = sched.finish_step(batch, lambda r, k: 11, now)
        for req, count in produced:
            if req.num_output == count:
                rid, at = arrived[req.seq]
                out[rid] = (now - at) * 1000
    return out


def _pct(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{sum(xs) / len(xs):6.1f}/{percentile(xs, 50):6.1f}/{percentile(xs, 99):6.1f}"


def report(path: Path, max_num_seqs: int, budget: int) -> None:
    """Print one arm's breakdown and replay."""
    data = load(path)
    rows = [r for r in joined(data) if r["arrival"] >= data["warmup"]]
    ts = data["time_scale"]
    print(f"== {data['arm']} ({path}); modeled ms, mean/p50/p99")
    for tenant in ("light", "heavy"):
        rs = [r for r in rows if r["tenant"] == tenant]
        if not rs:
            continue
        print(f"  {tenant}: n={len(rs)} ttft {_pct([r['ttft'] for r in rs])}")
        for k in SEGMENTS:
            print(f"    {k:8s} {_pct([r['seg'][k] for r in rs])}")
        print(f"    gateway queue wait {_pct([r['gateway_wait'] for r in rs])}")
        sharing = Counter(r["prefills"] for r in rs)
        print(f"    prefills in its prefill step: {dict(sorted(sharing.items()))}; whole steps waited in the engine: "
              f"{dict(sorted(Counter(r['steps_waited'] for r in rs).items()))}")
    steps = [s for sim in data["sims"] for s in sim["steps"]]
    late = [(s[4] - s[1]) - s[3] / ts for s in steps]  # scheduled -> ended (monotonic) vs the model
    print(f"  steps: {len(steps)}; wall - modeled per step (modeled ms) mean {1000 * ts * sum(late) / len(late):.2f}, "
          f"p99 {1000 * ts * percentile(late, 99):.2f}, max {1000 * ts * max(late):.2f} "
          f"(negative: a step scheduled after its nominal start, the previous step's end, still ends on time)")
    model = replay(data, max_num_seqs, budget)
    light = [r for r in rows if r["tenant"] == "light" and r["rid"] in model]
    measured = [r["seg"]["queue"] + r["seg"]["prefill"] for r in light]
    modeled = [model[r["rid"]] for r in light]
    print(f"  light, engine queue + prefill (queue arrival -> first token): measured {_pct(measured)}; "
          f"the step model on the same arrivals {_pct(modeled)}")
    worst = sorted(light, key=lambda r: -r["ttft"])[:6]
    print("  slowest light: ttft = before+api+queue+prefill+after | prefills/tokens in its step, steps waited, "
          "replayed engine ms")
    for r in worst:
        s = r["seg"]
        print(f"    {r['arrival']:6.2f}s {r['ttft']:6.1f} = {s['before']:5.1f}+{s['api']:4.1f}+{s['queue']:5.1f}+"
              f"{s['prefill']:5.1f}+{s['after']:5.1f} | {r['prefills']}/{r['prefill_tokens']}, {r['steps_waited']}, "
              f"{model[r['rid']]:.1f}")


def main() -> None:
    """Every dump given."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dumps", nargs="+", type=Path)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=H100_8B.default_max_num_batched_tokens)
    args = p.parse_args()
    for path in args.dumps:
        report(path, args.max_num_seqs, args.max_num_batched_tokens)


if __name__ == "__main__":
    main()
