"""What fair admission on by default costs below saturation: gateway CPU per request, admission off vs default.

Two tenants share one pool in front of the instant upstream (it never saturates, so the queue's fast path is
all that runs: the multi-tenant check, a ticket, its release at settle). Variants, each its own `kvgate serve`
pinned to core 0 (the upstream and this load generator share core 1), measured in alternating rounds so a
busy neighbour hits all alike:

  off       pools.main.admission: {enabled: false} (no queue: the pipeline skips the step)
  default   no admission key: with two tenants the queue is on (enabled unset)
  on        admission: {enabled: true}

The order of the variants rotates from round to round. CPU per request is the gateway's own utime+stime over a
round divided by the requests it served; the table gives the median over rounds and the ratio to `off`.

    .venv/bin/python experiments/admission_overhead.py [--rounds 5] [--seconds 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import overhead
import yaml
from overhead import PY, ROOT, cpu_seconds, start
from procs import Proc, free_port

KEYS = ("sk-light", "sk-heavy")
VARIANTS = {"off": {"enabled": False}, "default": None, "on": {"enabled": True}}


def gateway_config(upstream: str, admission: dict[str, object] | None) -> dict[str, object]:
    """One pool, two tenants (one key each), admission as the variant says."""
    pool: dict[str, object] = {"role": "interactive", "served_model": "m", "replicas": [upstream],
                               "price": {"input_per_m": 1, "cached_input_per_m": 0.1, "output_per_m": 2}}
    if admission is not None:
        pool["admission"] = admission
    return {
        "models": [{"name": "m", "pools": ["main"]}],
        "pools": {"main": pool},
        "auth": {"required": True},
        "tenants": [{"id": "light", "api_keys": [KEYS[0]]}, {"id": "heavy", "api_keys": [KEYS[1]]}],
    }


async def load(url: str, concurrency: int, seconds: float) -> tuple[int, int]:
    """Closed loop, half the workers each tenant's (overhead.py's loop, one per key); (ok, errors)."""
    runs = await asyncio.gather(*(overhead.load(url, False, 16, concurrency // 2, seconds, k) for k in KEYS))
    return sum(n for n, _, _ in runs), sum(e for _, _, e in runs)


def main() -> int:
    """Alternate rounds over the variants; print CPU ms/request (median) and the ratio to `off`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    up_port = free_port()
    upstream = start([PY, str(ROOT / "experiments/instant_upstream.py"), str(up_port)], up_port, "1")
    procs: dict[str, Proc] = {}
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-admission-overhead-"))
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    rps: dict[str, list[float]] = {v: [] for v in VARIANTS}
    errors: dict[str, int] = dict.fromkeys(VARIANTS, 0)
    try:
        for name, admission in VARIANTS.items():
            port = free_port()
            path = tmp / f"{name}.yaml"
            path.write_text(yaml.safe_dump(gateway_config(upstream.url, admission)))
            procs[name] = start([PY, "-m", "app.cli", "serve", "--config", str(path), "--port", str(port)], port, "0")
            asyncio.run(load(procs[name].url, 4, 1.0))  # warm-up
        names = list(procs)
        for r in range(args.rounds):
            # Each round starts with the next variant: a neighbour or a clock that favours the first (or last)
            # slot of a round would otherwise favour one variant in every round.
            for name in names[r % len(names):] + names[: r % len(names)]:
                proc = procs[name]
                before, t0 = cpu_seconds(proc.pid), time.perf_counter()
                n, bad = asyncio.run(load(proc.url, args.concurrency, args.seconds))
                cpu[name].append(1000 * (cpu_seconds(proc.pid) - before) / max(n, 1))
                rps[name].append(n / (time.perf_counter() - t0))
                errors[name] += bad
    finally:
        for proc in procs.values():
            proc.stop()
        upstream.stop()
    base = statistics.median(cpu["off"])
    print(f"{args.rounds} rounds x {args.seconds:.0f} s per variant, concurrency {args.concurrency}, two tenants")
    print(f"{'admission':<10} {'CPU ms/req':>11} {'x off':>7} {'req/s':>8} {'errors':>7}  per-round CPU ms/req"
          "  (x off, same round)")
    for name in VARIANTS:
        med = statistics.median(cpu[name])
        rounds = " ".join(f"{c:.3f}" for c in cpu[name])
        ratios = [c / o for c, o in zip(cpu[name], cpu["off"], strict=True)]
        print(f"{name:<10} {med:>11.3f} {med / base:>7.3f} {statistics.median(rps[name]):>8.0f} {errors[name]:>7}  "
              f"{rounds}  (median {statistics.median(ratios):.3f}, {min(ratios):.3f}..{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
