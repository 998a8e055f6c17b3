"""Gateway processes whose host clocks are skewed: do they still switch peer-load snapshots at one instant?

N PeerLoad instances in one asyncio process against a real Redis, instance i reading time.time() + skew_i (the
skews spread evenly over [-S, +S]), each with its own cluster state whose in-flight counts change at random
(starts and finishes every few ms), exchanging through `run()` as a gateway does. At random instants (0-10 ms
apart) the sampler reads every instance's `in_force()` and shared loads in one go (no await in between): the
instant counts as agreeing when all are on the same snapshot with the same per-replica loads. Each skew runs
twice, rounds on each host's own clock (`on_store_clock=False`, the behaviour before) and on the store's clock
(the offset estimated from the exchanges); every 50 ms the estimate is compared with the injected skew (Redis
runs on this host, so its clock is time.time's and the true offset of instance i is -skew_i).

    .venv/bin/python experiments/peer_load_skew.py [--redis-url redis://127.0.0.1:6379/0] [--processes 4]
        [--skews-ms 0,1,5,20,45] [--seconds 15] [--interval 0.1]

Keys live under a fresh prefix per run and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import parse_config  # noqa: E402
from app.config.peer_load import PeerLoadSettings  # noqa: E402
from app.routing.peer_load import PeerLoad  # noqa: E402
from app.routing.state import ClusterState, ReplicaState  # noqa: E402
from app.store.redis_store import RedisStore  # noqa: E402

REPLICAS = [f"http://127.0.0.1:{9300 + i}" for i in range(4)]
WARMUP_S = 1.0  # the first exchanges: nothing shared is in force yet
MODES = ("local clock", "store clock")


def cluster() -> ClusterState:
    """One pool of four replicas, as every gateway process of one config has it."""
    raw = {"models": [{"name": "m", "pools": ["p"]}],
           "pools": {"p": {"role": "interactive", "served_model": "m", "replicas": REPLICAS,
                           "price": {"gpu_hour_usd": 1, "capacity_tokens_per_s": 10}}}}  # fmt: skip
    return ClusterState.from_config(parse_config(raw))


def spread(s: float, n: int) -> list[float]:
    """n skews evenly over [-s, +s] (one process at 0 skew when n == 1)."""
    return [0.0] if n == 1 else [-s + 2 * s * i / (n - 1) for i in range(n)]


@dataclass
class Cell:
    samples: int = 0
    agree: int = 0
    shared: int = 0  # samples with a shared snapshot in force everywhere
    offset_err_us: list[float] = field(default_factory=list)
    exchanges: dict[str, int] = field(default_factory=dict)


async def churn(states: list[ClusterState], rng: random.Random, stop: asyncio.Event) -> None:
    """Requests starting and finishing at random in every process: the counts differ from round to round."""
    replicas: list[list[ReplicaState]] = [s.pools["p"].replicas for s in states]
    while not stop.is_set():
        r = rng.choice(rng.choice(replicas))
        if r.in_flight and rng.random() < 0.5:
            r.on_success()
        elif r.in_flight < 6:
            r.on_start()
        await asyncio.sleep(rng.uniform(0, 0.004))


async def cell(args: argparse.Namespace, s_ms: float, on_store_clock: bool, rng: random.Random) -> Cell:
    """One skew and one mode: N processes exchanging for args.seconds while the sampler watches."""
    prefix = f"kvgate-skew-{uuid.uuid4().hex[:8]}:"
    settings = PeerLoadSettings(interval_s=args.interval, ttl_s=max(1.0, 3 * args.interval))
    skews = spread(s_ms / 1000, args.processes)
    stores = [RedisStore(args.redis_url, prefix, socket_timeout_s=0.25) for _ in skews]
    states = [cluster() for _ in skews]
    shares = []
    for i, (store, state, skew) in enumerate(zip(stores, states, skews, strict=True)):
        clock: Callable[[], float] = lambda skew=skew: time.time() + skew  # noqa: E731
        shares.append(PeerLoad(store, lambda state=state: state, settings, f"p{i}", clock, on_store_clock))
    stop = asyncio.Event()
    tasks = [asyncio.create_task(s.run()) for s in shares] + [asyncio.create_task(churn(states, rng, stop))]
    out = Cell()
    try:
        await asyncio.sleep(WARMUP_S)
        end = time.monotonic() + args.seconds
        next_offset_check = 0.0
        while time.monotonic() < end:
            await asyncio.sleep(rng.uniform(0, 0.01))
            seen = [(s.in_force(), tuple(r.shared_load for r in st.pools["p"].replicas))
                    for s, st in zip(shares, states, strict=True)]  # fmt: skip
            out.samples += 1
            out.agree += len(set(seen)) == 1
            out.shared += all(f >= 0 for f, _ in seen)
            if on_store_clock and time.monotonic() >= next_offset_check:
                next_offset_check = time.monotonic() + 0.05
                out.offset_err_us += [abs(s.offset + skew) * 1e6 for s, skew in zip(shares, skews, strict=True)]
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in shares:
            for k, n in s.exchanges.items():
                out.exchanges[k] = out.exchanges.get(k, 0) + n
        cleanup = aioredis.from_url(args.redis_url)
        await cleanup.delete(f"{prefix}in_flight")  # the one key share_load writes
        await cleanup.aclose()
        for store in stores:
            await store.aclose()
    return out


def pct(n: int, d: int) -> str:
    return f"{100 * n / max(d, 1):.2f} %"


async def run(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    skews_ms = [float(x) for x in args.skews_ms.split(",")]
    results: dict[tuple[float, str], Cell] = {}
    t0 = time.monotonic()
    for s in skews_ms:
        for mode in MODES:
            results[(s, mode)] = c = await cell(args, s, mode == "store clock", rng)
            print(f"S {s:g} ms, {mode}: {pct(c.agree, c.samples)} of {c.samples} instants, exchanges {c.exchanges}",
                  flush=True)  # fmt: skip
    print(f"\n{args.processes} processes, skews evenly over ±S, rounds of {args.interval * 1000:g} ms, "
          f"{args.seconds:g} s per cell, {time.monotonic() - t0:.0f} s in all; `uptime`: "
          f"{os.getloadavg()[0]:.2f} load avg\n")  # fmt: skip
    print("| skew S | spread 2S / round | **same snapshot everywhere, local clock** | **same snapshot everywhere, "
          "store clock** | offset estimate vs injected skew: median / p99 / max | late exchanges local / store "
          "| instants on a shared snapshot (store clock) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for s in skews_ms:
        loc, sto = results[(s, "local clock")], results[(s, "store clock")]
        errs = sorted(sto.offset_err_us) or [0.0]
        p99 = errs[min(len(errs) - 1, int(0.99 * len(errs)))]
        lates = "/".join(str(c.exchanges.get("late", 0)) for c in (loc, sto))
        print(f"| ±{s:g} ms | {200 * s / 1000 / args.interval:.0f} % | {pct(loc.agree, loc.samples)} "
              f"| {pct(sto.agree, sto.samples)} | {statistics.median(errs):.0f} / {p99:.0f} / {errs[-1]:.0f} µs "
              f"| {lates} | {pct(sto.shared, sto.samples)} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--skews-ms", default="0,1,5,20,45", help="S values: skews spread over ±S (ms)")
    p.add_argument("--seconds", type=float, default=15.0, help="sampled per skew and mode, after a 1 s warm-up")
    p.add_argument("--interval", type=float, default=0.1, help="routing.peer_load.interval_s")
    p.add_argument("--seed", type=int, default=7)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
