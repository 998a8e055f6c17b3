"""Cost of auth + limits + spend per request, side by side with a bare Redis round trip.

Runs sequential requests (no concurrency, so wall time = latency added to one request) through
TenantRegistry.resolve (cached) + Limiter.admit + Limiter.settle with every limit set, against:
  ping      one redis-py PING round trip: the floor for "one round trip"
  redis     RedisStore (two round trips per request: admit script, settle script)
  memory    MemoryStore (no network)
Prints µs per request (wall and process CPU), ratio to PING, and Redis commands per request
(from INFO total_commands_processed, so the "one round trip each" claim is measured, not assumed).

    .venv/bin/python bench/store_overhead.py [--redis-url redis://127.0.0.1:6379/0] [--n 3000]
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


async def measure(fn: Callable[[], Awaitable[None]], n: int) -> tuple[float, float]:
    for _ in range(200):
        await fn()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


class Counter:
    """Counts commands a redis client sends (each is one round trip; scripts count once)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.n = 0
        inner = client.execute_command

        async def counted(*args: object, **kw: object) -> object:
            self.n += 1
            return await inner(*args, **kw)

        client.execute_command = counted  # type: ignore[method-assign]


async def main(url: str, n: int) -> None:
    prefix = f"kvgate-bench:{uuid.uuid4().hex[:8]}:"
    ping_client = aioredis.from_url(url)

    async def ping() -> None:
        await ping_client.ping()

    rows = []
    for name in ("ping", "redis", "memory"):
        store: Store | None = None
        counter = None
        if name == "ping":
            fn = ping
            counter = Counter(ping_client)
        elif name == "redis":
            redis_store = RedisStore(url, prefix, socket_timeout_s=2)
            store = redis_store
            fn = await per_request(store)
            counter = Counter(redis_store._r)
        else:
            store = MemoryStore()
            fn = await per_request(store)
        wall, cpu = await measure(fn, n)
        rows.append((name, wall, cpu, counter.n / (n + 200) if counter else 0.0))
        if store is not None:
            await store.aclose()
    await ping_client.aclose()
    base = rows[0][1]
    print(f"{'variant':<8} {'wall µs/req':>12} {'cpu µs/req':>11} {'vs ping':>7} {'round trips/req':>15}")
    for name, wall, cpu, cmds in rows:
        print(f"{name:<8} {wall:>12.1f} {cpu:>11.1f} {wall / base:>7.2f} {cmds:>15.2f}")
    cleanup = aioredis.from_url(url)
    async for key in cleanup.scan_iter(match=f"{prefix}*", count=1000):
        await cleanup.delete(key)
    await cleanup.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    ap.add_argument("--n", type=int, default=3000)
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
        asyncio.run(main(url, args.n))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
