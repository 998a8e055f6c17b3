"""FLUSHALL under load: do configured keys keep working when their Redis is emptied (FLUSHALL, a restart without
persistence, eviction)? Two `kvgate serve` processes on a throwaway `redis-server` (never the shared one: FLUSHALL
empties every key), one `kvgate sim`; 16 clients send requests of two configured tenants for `--seconds`, and
Redis is FLUSHALLed every `--every` seconds. Counted: statuses per tenant (a 401 is a configured key refused).

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/flushall_load.py [--code DIR --label before]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.procs import MODEL, free_port, from_checkout, gateway_config, gateway_proc, sim_proc  # noqa: E402

KEYS = {"acme": "sk-flush-acme", "beta": "sk-flush-beta"}
CLIENTS = 16


async def load(urls: list[str], seconds: float, every: float, redis_url: str) -> dict[str, collections.Counter[str]]:
    out: dict[str, collections.Counter[str]] = {t: collections.Counter() for t in KEYS}
    flushes = 0
    stop = time.monotonic() + seconds
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    limits = httpx.Limits(keepalive_expiry=2)

    async def client(i: int) -> None:
        tenant = list(KEYS)[i % len(KEYS)]
        async with httpx.AsyncClient(base_url=urls[i % len(urls)], timeout=30, limits=limits) as c:
            while time.monotonic() < stop:
                try:
                    r = await c.post("/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {KEYS[tenant]}"})
                    out[tenant][str(r.status_code)] += 1
                except httpx.HTTPError as err:
                    out[tenant][type(err).__name__] += 1

    async def flusher() -> None:
        nonlocal flushes
        r = redis.asyncio.from_url(redis_url)
        try:
            while time.monotonic() + every < stop:
                await asyncio.sleep(every)
                await r.flushall()
                flushes += 1
        finally:
            await r.aclose()

    await asyncio.gather(flusher(), *(client(i) for i in range(CLIENTS)))
    print(f"{flushes} FLUSHALLs", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--every", type=float, default=6.0, help="seconds between FLUSHALLs (the key cache lives 5 s)")
    p.add_argument("--code", type=Path, default=None, help="run the gateways from this checkout's app/")
    p.add_argument("--label", default="this change")
    args = p.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("needs redis-server")
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-flushall-"))
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(log_dir)], stdout=subprocess.DEVNULL)
    redis_url = f"redis://127.0.0.1:{port}/0"
    sim = sim_proc("sim", [], time_scale=50, log_dir=log_dir)
    tenants = [{"id": t, "api_keys": [k]} for t, k in KEYS.items()]
    cfg = gateway_config({"main": {"role": "interactive", "replicas": [sim.url]}}, tenants=tenants)
    cfg["store"] = {"url": redis_url}
    cfg["listen"] = {"host": "127.0.0.1"}
    gateways = [gateway_proc(f"gw{i}", cfg, log_dir=log_dir) for i in range(2)]
    if args.code is not None:
        for g in gateways:
            from_checkout(g, args.code)
    try:
        deadline = time.monotonic() + 10
        while redis.Redis(port=port).ping() is not True:
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        sim.start(timeout_s=120)
        for g in gateways:
            g.start("/ready", 120)
        results = asyncio.run(load([g.url for g in gateways], args.seconds, args.every, redis_url))
    finally:
        for g in gateways:
            g.stop()
        sim.stop()
        server.terminate()
        server.wait(10)
    print(f"\n## {args.label}: {CLIENTS} clients over 2 gateways for {args.seconds:g} s, FLUSHALL every "
          f"{args.every:g} s\n")
    print("| tenant | requests | 200 | 401 | other |\n|---|---|---|---|---|")
    for tenant, counts in results.items():
        other = {k: v for k, v in counts.items() if k not in ("200", "401")}
        print(f"| {tenant} | {sum(counts.values())} | {counts['200']} | {counts['401']} | {other} |")
    print(f"\nlogs in {log_dir}")


if __name__ == "__main__":
    main()
