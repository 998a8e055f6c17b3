"""One client sending poisoned requests at a fixed rate while another tenant works: does the pool hold for it?

Two `kvgate sim` processes behind one `kvgate serve` (real processes, loopback). The attacker (its own tenant)
sends `--rate` requests a second for `--seconds`, in turn: count_tokens asking for a stream, and (with
`--poison all`) a chat body, a Messages body and a streamed Messages body that every sim answers 500
(`kvgate sim --fail-marker`). The victim tenant runs `--workers` closed loops of small chat requests meanwhile.
/ready is polled twice a second. Printed: the victim's success rate, the attacker's answers by status, how
often /ready said 503, and how many attacker requests reached a replica.

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/poisoned_pool.py [--poison all|count_tokens]
    # the same load against another checkout (its own code; count_tokens only where its sim has no marker):
    flock /tmp/kvgate-bench.lock /work/main/.venv/bin/python experiments/poisoned_pool.py --root /work/main \
        --poison count_tokens
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import procs
from procs import MODEL, gateway_config, gateway_proc, metric_sum, scrape, sim_proc

MARKER = "POISON-7d1f"
ATTACKER, VICTIM = "sk-attacker", "sk-victim"


def poisoned(i: int, poison: str) -> tuple[str, dict[str, Any]]:
    """The i-th attacker request."""
    kind = i % 4 if poison == "all" else 0
    msgs = [{"role": "user", "content": f"{MARKER} {i}" if kind else f"count {i}"}]
    if kind == 0:
        return "/v1/messages/count_tokens", {"model": MODEL, "messages": msgs, "stream": True}
    if kind == 1:
        return "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4}
    return "/v1/messages", {"model": MODEL, "messages": msgs, "max_tokens": 4, "stream": kind == 3}


async def attacker(http: httpx.AsyncClient, gw: str, args: argparse.Namespace, until: float,
                   seen: Counter[int]) -> None:  # fmt: skip
    async def one(i: int) -> None:
        path, body = poisoned(i, args.poison)
        try:
            r = await http.post(gw + path, json=body, headers={"authorization": f"Bearer {ATTACKER}"})
            seen[r.status_code] += 1
        except httpx.HTTPError:
            seen[0] += 1

    tasks: list[asyncio.Task[None]] = []
    i, start = 0, time.monotonic()
    while time.monotonic() < until:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(max(0.0, start + i / args.rate - time.monotonic()))
    await asyncio.gather(*tasks)


async def victim(http: httpx.AsyncClient, gw: str, until: float, seen: Counter[int]) -> None:
    n = 0
    while time.monotonic() < until:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {n}"}], "max_tokens": 8}
        n += 1
        try:
            r = await http.post(gw + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {VICTIM}"})
            seen[r.status_code] += 1
        except httpx.HTTPError:
            seen[0] += 1


async def ready_poll(http: httpx.AsyncClient, gw: str, until: float, seen: Counter[int]) -> None:
    while time.monotonic() < until:
        try:
            seen[(await http.get(gw + "/ready")).status_code] += 1
        except httpx.HTTPError:
            seen[0] += 1
        await asyncio.sleep(0.5)


async def run(gw: str, args: argparse.Namespace) -> tuple[Counter[int], Counter[int], Counter[int]]:
    bad, good, ready = Counter[int](), Counter[int](), Counter[int]()
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        until = time.monotonic() + args.seconds
        await asyncio.gather(attacker(http, gw, args, until, bad), ready_poll(http, gw, until, ready),
                             *(victim(http, gw, until, good) for _ in range(args.workers)))  # fmt: skip
    return bad, good, ready


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=10.0, help="attacker requests per second")
    p.add_argument("--workers", type=int, default=4, help="the victim's closed loops")
    p.add_argument("--poison", choices=["all", "count_tokens"], default="all")
    p.add_argument("--root", default=None, help="the checkout whose kvgate runs (default: this one)")
    args = p.parse_args()
    if args.root:
        procs.ROOT = Path(args.root).resolve()
    if not 0 < args.seconds <= 600 or not 0 < args.rate <= 100:
        p.error("--seconds in (0, 600], --rate in (0, 100]")
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-poisoned-"))
    marker = ["--fail-marker", MARKER] if args.poison == "all" else []
    sims = [sim_proc(f"sim{i}", ["--profile", "h100-8b", *marker], time_scale=1.0, log_dir=log_dir)
            for i in range(2)]  # fmt: skip
    tenants = [{"id": "attacker", "api_keys": [ATTACKER]}, {"id": "victim", "api_keys": [VICTIM]}]
    cfg = gateway_config({"main": {"role": "interactive", "replicas": [s.url for s in sims],
                                   "policy": "round_robin"}}, tenants=tenants)  # fmt: skip
    gw = gateway_proc("gateway", cfg, log_dir=log_dir)
    try:
        for s in sims:
            s.start()
        gw.start(ready_path="/ready")
        before = [metric_sum(scrape(s.url), "vllm:request_success_total") for s in sims]
        bad, good, ready = asyncio.run(run(gw.url, args))
        after = [metric_sum(scrape(s.url), "vllm:request_success_total") for s in sims]
    finally:
        gw.stop()
        for s in sims:
            s.stop()
    victim_total = sum(good.values())
    rate = good[200] / victim_total if victim_total else 0.0
    print(f"checkout {procs.ROOT}; poison {args.poison}; attacker {args.rate:g}/s for {args.seconds:g} s; "
          f"victim {args.workers} closed loops; logs {log_dir}")
    print("| victim requests | victim 200 | victim success | attacker answers by status | /ready 503 "
          "| replica successes |")
    print("|---:|---:|---:|---|---:|---:|")
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(bad.items()))
    print(f"| {victim_total} | {good[200]} | {rate:.2%} | {statuses} | {ready[503]}/{sum(ready.values())} "
          f"| {sum(after) - sum(before):.0f} |")
    return 0 if rate >= 0.99 else 1


if __name__ == "__main__":
    raise SystemExit(main())
