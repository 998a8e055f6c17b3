"""Cost of auth + limits + spend per request: redis-py path vs pipelined RESP path vs in-memory.

Runs requests through TenantRegistry.resolve (cached) + Limiter.admit + Limiter.settle with every
limit set, against:
  ping      one redis-py PING round trip: the floor for "one round trip" through redis-py
  redis-py  RedisStore(fast_path=False): both scripts through redis-py's pool
  resp      RedisStore (default): both scripts over the pipelined RespClient connection
  memory    MemoryStore (no network)
First sequentially (wall time = latency added to one request), then `--concurrency` requests at a
time (pipelining shares one connection). Prints µs per request (wall and this process's CPU), CPU
ratios against the redis-py path and against memory, and the script calls Redis ran per request
(from INFO commandstats, so "one round trip each" is measured on the server, not assumed).

    .venv/bin/python bench/store_overhead.py [--redis-url redis://127.0.0.1:6379/0] [--n 3000]
        [--concurrency 32] [--loop uvloop|asyncio]
Without --redis-url (or REDIS_URL) a throwaway redis-server is started on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from app.config import parse_config
from app.context import RequestContext, RouteDecision, Usage
from app.limits import Limiter
from app.store.base import Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from app.tenancy import TenantRegistry

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
    env={},
)
BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "system", "content": "s" * 800},
                                                     {"role": "user", "content": "q" * 200}]}


def ctx() -> RequestContext:
    c = RequestContext(uuid.uuid4().hex, "chat", "/v1/chat/completions", dict(BODY), "m", False, False, {})
    c.route = RouteDecision("fast", "http://127.0.0.1:9", "round_robin", "bench")
    c.usage = Usage(250, 64, 200, True)
    c.cost_usd = 0.000123
    return c


async def per_request(store: Store) -> Callable[[], Awaitable[None]]:
    reg = TenantRegistry(CFG, store)
    await reg.load()
    lim = Limiter(store, reg, "open")

    async def one() -> None:
        c = ctx()
        c.tenant = await reg.resolve(f"Bearer {KEY}")
        admission = await lim.admit(c)
        await lim.settle(c, admission)

    return one


async def measure(fn: Callable[[], Awaitable[None]], n: int, concurrency: int) -> tuple[float, float]:
    """(wall µs, CPU µs) per request over n requests, `concurrency` in flight at a time (after a warm-up)."""

    async def batch(count: int) -> None:
        if concurrency == 1:
            for _ in range(count):
                await fn()
            return
        for _ in range(count // concurrency):
            await asyncio.gather(*(fn() for _ in range(concurrency)))

    await batch(200)
    n -= n % concurrency
    wall, cpu = time.perf_counter(), time.process_time()
    await batch(n)
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


async def script_calls(client: aioredis.Redis) -> int:
    """Scripts run and PINGs answered by the server so far (the bench's round trips)."""
    stats = await client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval", "ping"))


async def main(url: str, n: int, concurrency: int) -> None:
    prefix = f"kvgate-bench:{uuid.uuid4().hex[:8]}:"
    ping_client = aioredis.from_url(url)
    stats_client = aioredis.from_url(url)

    async def ping() -> None:
        await ping_client.ping()

    rows = []
    for conc in sorted({1, concurrency}):
        for name in ("ping", "redis-py", "resp", "memory"):
            store: Store | None = None
            if name == "ping":
                fn = ping
            elif name == "memory":
                store = MemoryStore()
                fn = await per_request(store)
            else:
                redis_store = RedisStore(url, prefix, socket_timeout_s=2, fast_path=name == "resp")
                assert redis_store.fast_path == (name == "resp")
                store = redis_store
                fn = await per_request(store)
            before = await script_calls(stats_client)
            wall, cpu = await measure(fn, n, conc)
            # The INFO call itself counts once (as a non-script) so no correction is needed.
            trips = (await script_calls(stats_client) - before) / (n - n % conc + 200)
            rows.append((name, conc, wall, cpu, trips if name != "memory" else 0.0))
            if store is not None:
                await store.aclose()
    await ping_client.aclose()
    print(f"{'variant':<9} {'conc':>4} {'wall µs/req':>12} {'cpu µs/req':>11} {'cpu/redis-py':>12} "
          f"{'cpu/memory':>10} {'round trips/req':>15}")
    for name, conc, wall, cpu, trips in rows:
        base = next(r[3] for r in rows if r[0] == "redis-py" and r[1] == conc)
        mem = next(r[3] for r in rows if r[0] == "memory" and r[1] == conc)
        print(f"{name:<9} {conc:>4} {wall:>12.1f} {cpu:>11.1f} {cpu / base:>12.2f} {cpu / mem:>10.2f} "
              f"{trips:>15.2f}")
    for conc in sorted({1, concurrency}):
        cpu = {r[0]: r[3] for r in rows if r[1] == conc}
        print(f"concurrency {conc}: limits+spend CPU over memory: redis-py +{cpu['redis-py'] - cpu['memory']:.1f} µs, "
              f"resp +{cpu['resp'] - cpu['memory']:.1f} µs")
    async for key in stats_client.scan_iter(match=f"{prefix}*", count=1000):
        await stats_client.delete(key)
    await stats_client.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                    help="event loop (kvgate serve runs uvloop)")
    args = ap.parse_args()
    proc = None
    url = args.redis_url
    if url is None:
        if shutil.which("redis-server") is None:
            raise SystemExit("no --redis-url and no redis-server on PATH")
        port = free_port()
        tmp = tempfile.mkdtemp()
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        url = f"redis://127.0.0.1:{port}/0"
    try:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(main(url, args.n, args.concurrency))
        else:
            asyncio.run(main(url, args.n, args.concurrency))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
