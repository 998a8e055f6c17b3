"""A soak of mixed hostile bursts: does anything leak (slots, replica requests, memory) or spill onto others?

Two `kvgate sim` processes (`--fail-marker`) behind one `kvgate serve` with listen.write_timeout_s 2 s,
upstream.idle_timeout_s 5 s (and a per-address connection cap above the load generator's). Every `--every`
seconds (or as soon as the last one ended), `--bursts` times, one burst of 100 requests at once:
50 small chat requests of the victim tenant (limits.concurrent 40: a 429 is the limit, not a failure), 20
poisoned requests of the attacker tenant (count_tokens asking for a stream, bodies every sim fails), and of a
third tenant 15 streams dropped after 10 lines, 10 Messages streams read whole, 5 streams whose client never
reads (raw sockets with a 4 KiB receive buffer, held until the soak ends). Afterwards: every replica runs 0 requests,
`concurrent` victim requests at once are all admitted (no leaked lease), /ready is 200, and the gateway's RSS.

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/burst_soak.py [--bursts 20] [--every 2]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from poisoned_pool import ATTACKER, MARKER, VICTIM, poisoned
from procs import MODEL, gateway_config, gateway_proc, metric_sum, scrape, sim_proc

from kvlab.net import never_reader

CONCURRENT = 40
STREAMER = "sk-streamer"
AUTH = {"authorization": f"Bearer {STREAMER}"}  # the stream clients' own tenant (no limits)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


async def dropped_stream(http: httpx.AsyncClient, gw: str, i: int) -> int:
    body = chat(f"drop {i}", max_tokens=400, stream=True, ignore_eos=True)
    async with http.stream("POST", gw + "/v1/chat/completions", json=body, headers=AUTH) as r:
        n = 0
        async for _ in r.aiter_lines():
            n += 1
            if n >= 10:
                break
        return r.status_code


async def whole_messages(http: httpx.AsyncClient, gw: str, i: int) -> int:
    body = {"model": MODEL, "max_tokens": 32, "stream": True, "messages": [{"role": "user", "content": f"m {i}"}]}
    async with http.stream("POST", gw + "/v1/messages", json=body, headers=AUTH) as r:
        lines = [line async for line in r.aiter_lines()]
    return r.status_code if r.status_code != 200 or "event: message_stop" in lines else -1


def held_stream(port: int, i: int) -> socket.socket:
    """The third tenant's stream whose client never reads."""
    body = orjson.dumps(chat(f"hold {i}", max_tokens=100_000, stream=True, ignore_eos=True))
    return never_reader(port, STREAMER, body)


async def burst(http: httpx.AsyncClient, gw: str, port: int, b: int, out: dict[str, Counter[int]],
                held: list[socket.socket]) -> None:
    async def status(kind: str, aw: Any) -> None:
        try:
            out[kind][await aw] += 1
        except httpx.HTTPError:
            out[kind][0] += 1

    async def post(path: str, body: dict[str, Any], key: str) -> int:
        return (await http.post(gw + path, json=body, headers={"authorization": f"Bearer {key}"})).status_code

    work = [status("victim", post("/v1/chat/completions", chat(f"b{b} r{i}"), VICTIM)) for i in range(50)]
    work += [status("attacker", post(*poisoned(b * 20 + i, "all"), ATTACKER)) for i in range(20)]
    work += [status("dropped", dropped_stream(http, gw, b * 15 + i)) for i in range(15)]
    work += [status("messages", whole_messages(http, gw, b * 10 + i)) for i in range(10)]
    held.extend(held_stream(port, b * 5 + i) for i in range(5))
    await asyncio.gather(*work)


async def run(gw: str, port: int, args: argparse.Namespace) -> tuple[dict[str, Counter[int]], int, int]:
    out: dict[str, Counter[int]] = {k: Counter() for k in ("victim", "attacker", "dropped", "messages")}
    held: list[socket.socket] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=400)) as http:
        try:
            for b in range(args.bursts):
                t0 = time.monotonic()
                await burst(http, gw, port, b, out, held)
                took = time.monotonic() - t0
                print(f"burst {b}: {took:.1f} s", flush=True)
                await asyncio.sleep(max(0.0, args.every - took))
        finally:
            for s in held:
                s.close()
        await asyncio.sleep(3)  # the last never-readers' write deadline (2 s) and settles
        victim = {"authorization": f"Bearer {VICTIM}"}
        final = await asyncio.gather(*(http.post(gw + "/v1/chat/completions", json=chat(f"after {i}"),
                                                 headers=victim) for i in range(CONCURRENT)))
        ready = (await http.get(gw + "/ready")).status_code
    return out, sum(r.status_code == 200 for r in final), ready


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bursts", type=int, default=20)
    p.add_argument("--every", type=float, default=2.0)
    args = p.parse_args()
    if not 0 < args.bursts <= 200:
        p.error("--bursts in 1..200")
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-soak-"))
    sims = [sim_proc(f"sim{i}", ["--profile", "h100-8b", "--fail-marker", MARKER, "--max-model-len", "200000"],
                     time_scale=1.0, log_dir=log_dir) for i in range(2)]
    tenants = [{"id": "attacker", "api_keys": [ATTACKER]},
               {"id": "victim", "api_keys": [VICTIM], "limits": {"concurrent": CONCURRENT}},
               {"id": "streamer", "api_keys": [STREAMER]}]
    cfg = gateway_config({"main": {"role": "interactive", "replicas": [s.url for s in sims],
                                   "policy": "round_robin"}}, tenants=tenants,
                         upstream={"idle_timeout_s": 5})
    # One load generator on one address: the per-address connection cap (256) is not what this soak is about.
    cfg["listen"] = {"write_timeout_s": 2, "max_connections_per_client": 1024}
    gw = gateway_proc("gateway", cfg, log_dir=log_dir)
    port = int(gw.url.rsplit(":", 1)[1])
    try:
        for s in sims:
            s.start()
        gw.start(ready_path="/ready")
        rss_before = rss_mib(gw.pid)
        t0 = time.monotonic()
        out, admitted, ready = asyncio.run(run(gw.url, port, args))
        took = time.monotonic() - t0
        rss_after = rss_mib(gw.pid)
        running = [metric_sum(scrape(s.url), "vllm:num_requests_running") for s in sims]
        timeouts = metric_sum(scrape(gw.url), "gateway_connections_timed_out_total", phase="write")
    finally:
        gw.stop()
        for s in sims:
            s.stop()
    v = out["victim"]
    served = v[200] / max(1, v[200] + sum(n for s, n in v.items() if s not in (200, 429)))
    print(f"{args.bursts} bursts of 100 every {args.every:g} s in {took:.0f} s; logs {log_dir}")
    print("| kind | answers by status |")
    print("|---|---|")
    for kind, seen in out.items():
        print(f"| {kind} | {', '.join(f'{k}: {n}' for k, n in sorted(seen.items()))} |")
    print(f"victim requests served (429 = its own concurrency limit, not counted): {served:.2%}")
    print(f"never-reading streams cut (write timeouts): {timeouts:.0f} of {5 * args.bursts}")
    print(f"after the soak: replicas running {running}, {admitted}/{CONCURRENT} concurrent victim requests "
          f"admitted, /ready {ready}, gateway RSS {rss_before:.0f} -> {rss_after:.0f} MiB")
    ok = served >= 0.99 and admitted == CONCURRENT and ready == 200 and not any(running)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
