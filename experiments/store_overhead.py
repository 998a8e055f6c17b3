"""Cost of auth + limits + spend per request: redis-py path vs pipelined RESP path vs in-memory.

Runs requests through TenantRegistry.resolve (cached) + Limiter.admit + Limiter.settle with every
limit set, against:
  ping      one redis-py PING round trip: the floor for "one round trip" through redis-py
  redis-py  RedisStore(fast_path=False): both scripts through redis-py's pool
  resp      RedisStore (default): both scripts over the pipelined RespClient connection
  memory    MemoryStore (no network)
First sequentially (wall time = latency added to one request), then `--concurrency` requests at a
time (pipelining shares one connection). Variants run interleaved for --rounds rounds (a noisy
neighbour then disturbs all alike); prints medians of µs per request (wall and this process's CPU,
which includes the kernel's share of loopback TCP), the lowest CPU seen, CPU ratios against the
redis-py path and against memory, and the script calls Redis ran per request (from INFO
commandstats, so "one round trip each" is measured on the server, not assumed).

    .venv/bin/python experiments/store_overhead.py [--redis-url redis://127.0.0.1:6379/0] [--n 3000]
        [--concurrency 32] [--rounds 3] [--loop uvloop|asyncio]
Without --redis-url (or REDIS_URL) a throwaway redis-server is started on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

from app.config import parse_config
from app.context import RequestContext, RouteDecision, Usage
from app.limits import Limiter
from app.store.base import Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from app.surfaces import CHAT
from app.tenancy import TenantRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kvlab, when run as a script

from kvlab.redis_server import RedisServer

KEY = "sk-bench"
CFG = parse_config(
    {
        "models": [{"name": "m", "pools": ["fast"]}],
        "pools": {
            "fast": {
                "role": "interactive",
                "served_model": "m",
                "replicas": ["http://127.0.0.1:9"],
                "price": {"input_per_m": 1, "output_per_m": 2},
            }
        },
        "tenants": [
            {
                "id": "bench",
                "api_keys": [KEY],
                "limits": {"rpm": 10**7, "tpm": 10**9, "concurrent": 10**4, "monthly_budget_usd": 10**6},
            }
        ],
    },
)
BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "system", "content": "s" * 800},
                                                     {"role": "user", "content": "q" * 200}]}


def ctx() -> RequestContext:
    c = RequestContext(uuid.uuid4().hex, CHAT, "/v1/chat/completions", dict(BODY), "m", False, False, {})
    c.prompt = CHAT.view(c.body)  # the parse stage's prompt view: what limits' token estimate reads
    c.route = RouteDecision("fast", "http://127.0.0.1:9", "round_robin", "bench")
    c.usage = Usage(250, 64, 200, True)
    c.cost_usd = 0.000123
    return c


async def per_request(store: Store) -> Callable[[], Awaitable[None]]:
    reg = TenantRegistry(CFG, store)
    await reg.load()
    lim = Limiter(store, "open")

    async def one() -> None:
        c = ctx()
        c.tenant = await reg.resolve(f"Bearer {KEY}")
        admission = await lim.admit(c)
        await lim.settle(c, admission)

    return one


async def measure(fn: Callable[[], Awaitable[None]], n: int, concurrency: int) -> tuple[float, float, int]:
    """(wall µs, CPU µs) per request over n requests, `concurrency` in flight at a time, after a warm-up;
    and how many requests ran in all (warm-up included)."""

    async def batch(count: int) -> int:
        for _ in range(count // concurrency):
            if concurrency == 1:
                await fn()
            else:
                await asyncio.gather(*(fn() for _ in range(concurrency)))
        return count - count % concurrency

    warm = await batch(200)
    wall, cpu = time.perf_counter(), time.process_time()
    done = await batch(n)
    return (time.perf_counter() - wall) / done * 1e6, (time.process_time() - cpu) / done * 1e6, warm + done


async def script_calls(client: aioredis.Redis) -> int:
    """Scripts run and PINGs answered by the server so far (the bench's round trips)."""
    stats = await client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval", "ping"))


VARIANTS = ("ping", "redis-py", "resp", "memory")
Row = tuple[float, float, float]


async def run_variant(url: str, prefix: str, name: str, n: int, conc: int, stats: aioredis.Redis) -> Row:
    """Measure one variant once: (wall µs, CPU µs, server round trips) per request."""
    store: Store | None = None
    ping_client = None
    fn: Callable[[], Awaitable[None]]
    if name == "ping":
        ping_client = aioredis.from_url(url)
        client = ping_client

        async def ping() -> None:
            await client.ping()

        fn = ping

    elif name == "memory":
        store = MemoryStore()
        fn = await per_request(store)
    else:
        redis_store = RedisStore(url, prefix, socket_timeout_s=2, fast_path=name == "resp")
        assert redis_store.fast_path == (name == "resp")
        store = redis_store
        fn = await per_request(store)
    before = await script_calls(stats)
    wall, cpu, ran = await measure(fn, n, conc)
    # The INFO call itself is not a script or PING, so no correction is needed.
    trips = (await script_calls(stats) - before) / ran
    if store is not None:
        await store.aclose()
    if ping_client is not None:
        await ping_client.aclose()
    return wall, cpu, trips if name != "memory" else 0.0


async def main(url: str, n: int, concurrency: int, rounds: int) -> None:
    prefix = f"kvgate-bench:{uuid.uuid4().hex[:8]}:"
    stats = aioredis.from_url(url)
    levels = sorted({1, concurrency})
    runs: dict[tuple[str, int], list[Row]] = {(v, c): [] for v in VARIANTS for c in levels}
    # Rounds interleave the variants so a noisy neighbour disturbs all of them alike; medians reported.
    for _ in range(rounds):
        for conc in levels:
            for name in VARIANTS:
                runs[(name, conc)].append(await run_variant(url, prefix, name, n, conc, stats))
    med = {k: tuple(statistics.median(r[i] for r in v) for i in range(3)) for k, v in runs.items()}
    print(f"median of {rounds} interleaved rounds, {n} requests each")
    print(f"{'variant':<9} {'conc':>4} {'wall µs/req':>12} {'cpu µs/req':>11} {'cpu min':>8} {'cpu/redis-py':>12} "
          f"{'cpu/memory':>10} {'round trips/req':>15}")
    for name, conc in sorted(med, key=lambda k: (k[1], VARIANTS.index(k[0]))):
        wall, cpu, trips = med[(name, conc)]
        base, mem = med[("redis-py", conc)][1], med[("memory", conc)][1]
        low = min(r[1] for r in runs[(name, conc)])
        print(f"{name:<9} {conc:>4} {wall:>12.1f} {cpu:>11.1f} {low:>8.1f} {cpu / base:>12.2f} {cpu / mem:>10.2f} "
              f"{trips:>15.2f}")
    for conc in levels:
        mem = med[("memory", conc)][1]
        print(f"concurrency {conc}: CPU added over memory per request: "
              f"redis-py +{med[('redis-py', conc)][1] - mem:.1f} µs, resp +{med[('resp', conc)][1] - mem:.1f} µs")
    async for key in stats.scan_iter(match=f"{prefix}*", count=1000):
        await stats.delete(key)
    await stats.aclose()



if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                    help="event loop (kvgate serve runs uvloop)")
    args = ap.parse_args()
    server = None
    url = args.redis_url
    if url is None:
        if shutil.which("redis-server") is None:
            raise SystemExit("no --redis-url and no redis-server on PATH")
        server = RedisServer(Path(tempfile.mkdtemp()))
        server.start()
        url = server.url
    try:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(main(url, args.n, args.concurrency, args.rounds))
        else:
            asyncio.run(main(url, args.n, args.concurrency, args.rounds))
    finally:
        if server is not None:
            server.stop()
