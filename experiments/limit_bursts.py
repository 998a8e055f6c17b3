"""Are rpm, tpm and concurrent exact under bursts? 100 concurrent requests of one tenant over 2 `kvgate serve`
processes on one (idle, real) Redis, against one `kvgate sim`.

Each burst uses a fresh tenant (an empty window) with one limit: `rpm: 50`, `tpm: 5000` (each request reserves
ceil(64 chars / 4) + 4 framing + 80 max_tokens = 100 tokens, so 50 fit) or `concurrent: 10`. Requests are
streamed and each admitted one is held open until all 100 have their status, so none settles while the burst
is being admitted: exact means passed == 50 / 50 / 10, no request served unenforced (`x-kvgate-limit:
unenforced:...`), no 5xx; "refused by the limit" counts the 429s whose x-kvgate-limit names the burst's limit
(the pool's admission queue is off unless `--admission`: its "rejected:queue" is not the limit). rpm and tpm are
rates (GCRA: 50/min refills one request every 1.2 s), so a burst whose admissions span longer than 1.2 s (a loaded
machine) may rightly pass one more per 1.2 s: the table counts both `passed == fit` and
`fit <= passed <= fit + refill(span)`. `--runs` runs of `--bursts` bursts per limit
(default 5 of 5).

`--sender raw` (the default) opens the burst's 100 connections first and then writes the 100 requests in one pass
of the loop, so the burst arrives at once and only the gateways' own work spreads its admissions; `--sender
httpx` is session 8's sender (httpx opened a connection per request inside the burst and spent this process's
CPU on each: on a loaded machine one burst's admissions spanned 1.6 s, longer than rpm 50's 1.2 s refill).

`--code DIR` runs the gateways from another checkout (e.g. `git archive <commit> | tar -x -C DIR`), for the
before/after table:

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/limit_bursts.py [--redis-url redis://127.0.0.1:6379/0]
        [--code /tmp/kvgate-before --label before] [--runs 5 --bursts 5] [--fail-mode open|closed]

Keys go under a fresh prefix on the given Redis and are deleted afterwards (nothing else is touched).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.procs import MODEL, Proc, free_port, from_checkout, gateway_config, gateway_proc, sim_proc  # noqa: E402

BURST = 100
LIMITS: dict[str, tuple[dict[str, int], int]] = {  # limit kind -> (tenant limits, requests that fit)
    "rpm": ({"rpm": 50}, 50),
    "tpm": ({"tpm": 5000}, 50),
    "concurrent": ({"concurrent": 10}, 10),
}
CONTENT = "x" * 64  # 16 estimated tokens + 4 framing
MAX_TOKENS = 80  # -> 100 tokens reserved per request


def tenants(runs: int, bursts: int) -> list[dict[str, Any]]:
    return [
        {"id": f"{kind}-{r}-{b}", "api_keys": [f"sk-burst-{kind}-{r}-{b}"], "limits": limits}
        for kind, (limits, _) in LIMITS.items()
        for r in range(runs)
        for b in range(bursts)
    ]


async def burst(clients: list[httpx.AsyncClient], key: str) -> tuple[collections.Counter[str], float]:
    """100 streamed requests at once through httpx (session 8's sender); each admitted one holds its slot (its
    stream open) until every one of the 100 has its status, so none settles while the burst is admitted, however
    slowly the machine sends it. httpx opens a connection per request (the last burst's were closed unread) and
    spends ~1-2 ms of this process's CPU on each, so on a loaded machine the burst itself is spread over a second."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": CONTENT}], "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": True}
    answered = 0
    everyone = asyncio.Event()
    admitted_at: list[float] = []

    async def one(i: int) -> str:
        nonlocal answered
        outcome = ""
        try:
            async with clients[i % len(clients)].stream(
                "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
            ) as r:
                if r.status_code == 200:
                    outcome = "unenforced" if "unenforced" in r.headers.get("x-kvgate-limit", "") else "passed"
                    admitted_at.append(time.monotonic())
                else:
                    outcome = str(r.status_code)
                answered += 1
                if answered == BURST:
                    everyone.set()
                await asyncio.wait_for(everyone.wait(), 60)
        except (httpx.HTTPError, TimeoutError) as err:
            if not outcome:
                answered += 1
                if answered == BURST:
                    everyone.set()
            return outcome or f"error:{type(err).__name__}"
        return outcome

    counts = collections.Counter(await asyncio.gather(*(one(i) for i in range(BURST))))
    return counts, (max(admitted_at) - min(admitted_at)) if admitted_at else 0.0


def request_bytes(key: str) -> bytes:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": CONTENT}], "max_tokens": MAX_TOKENS,
                         "ignore_eos": True, "stream": True})
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n" % (key.encode(), len(body)) + body)


async def raw_burst(urls: list[str], key: str) -> tuple[collections.Counter[str], float]:
    """The same 100 requests, sent as one burst: every connection is opened first, then all 100 requests are
    written in one pass of the loop (one write each, no await between them), so the burst reaches the gateways
    within a few ms and what spreads it is the gateways' own work. Each answer's head is read; admitted ones are
    held open until every one of the 100 has its status, then all are closed."""
    conns = await asyncio.gather(*(asyncio.open_connection(*hostport(urls[i % len(urls)])) for i in range(BURST)))
    payload = request_bytes(key)
    for _, writer in conns:
        writer.write(payload)
    admitted_at: list[float] = []

    async def status(reader: asyncio.StreamReader) -> str:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as err:
            return f"error:{type(err).__name__}"
        code = head.split(b" ", 2)[1].decode()
        if code != "200":
            # Which limit refused it (x-kvgate-limit: rejected:rpm, rejected:queue, ...): a 429 of anything but
            # the burst's own limit is not that limit being exact.
            why = next((line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                        if line.lower().startswith(b"x-kvgate-limit:")), "")
            return f"{code} {why}".strip()
        admitted_at.append(time.monotonic())
        return "unenforced" if b"unenforced" in head.lower() else "passed"

    try:
        outcomes = await asyncio.gather(*(status(reader) for reader, _ in conns))
    finally:
        for _, writer in conns:
            writer.close()
    return collections.Counter(outcomes), (max(admitted_at) - min(admitted_at)) if admitted_at else 0.0


def hostport(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


Result = tuple[collections.Counter[str], float]


def refill(kind: str, span_s: float) -> int:
    """Requests a GCRA window lets through on top of its limit while a burst's admissions span `span_s`: an rpm
    or tpm limit is a rate (50/min refills one request every 1.2 s), a concurrency limit is not."""
    limits, _ = LIMITS[kind]
    if kind == "rpm":
        return int(span_s * limits["rpm"] / 60)
    if kind == "tpm":
        return int(span_s * limits["tpm"] / 60 / 100)
    return 0


async def run_all(urls: list[str], args: argparse.Namespace) -> dict[str, list[Result]]:
    # Keep-alive shorter than the gateway's (listen.keepalive_timeout_s 5): no request on a socket it just closed.
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST, keepalive_expiry=2)
    clients = [httpx.AsyncClient(base_url=u, timeout=120, limits=limits) for u in urls]
    out: dict[str, list[Result]] = {kind: [] for kind in LIMITS}
    try:
        for r in range(args.runs):
            for b in range(args.bursts):
                for kind in LIMITS:
                    key = f"sk-burst-{kind}-{r}-{b}"
                    if args.sender == "raw":
                        counts, span = await raw_burst(urls, key)
                    else:
                        counts, span = await burst(clients, key)
                    out[kind].append((counts, span))
                    print(f"run {r} burst {b} {kind}: {dict(counts)}, admitted over {span:.2f} s", flush=True)
                await asyncio.sleep(args.pause_s)  # the long requests finish; the next burst starts idle
    finally:
        for c in clients:
            await c.aclose()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--store-timeout", type=float, default=0.25, help="store.socket_timeout_s (default: the default)")
    p.add_argument("--fail-mode", choices=["open", "closed"], default="open")
    p.add_argument("--time-scale", type=float, default=0.1, help="the sim's clock (<1: slower, requests live longer)")
    p.add_argument("--pause-s", type=float, default=1.0, help="between bursts")
    p.add_argument("--code", type=Path, default=None, help="run the gateways from this checkout's app/")
    p.add_argument("--label", default="this change")
    p.add_argument("--admission", action=argparse.BooleanOptionalAction, default=False,
                   help="the pool's admission queue (off by default here: the limits alone decide)")
    p.add_argument("--sender", choices=["raw", "httpx"], default="raw",
                   help="raw: connections opened first, the 100 requests written at once; httpx: session 8's sender")
    args = p.parse_args()

    prefix = f"kvgate-bursts:{uuid.uuid4().hex[:8]}:"
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-bursts-"))
    sim = sim_proc("sim", ["--max-num-seqs", "256"], time_scale=args.time_scale, log_dir=log_dir)
    # The fair admission queue (on by default while a pool serves several tenants: each burst's tenant is new)
    # refuses requests the limiter admitted when the sim saturates ("429 rejected:queue"): not the limit's doing.
    pool: dict[str, Any] = {"role": "interactive", "replicas": [sim.url], "admission": {"enabled": args.admission}}
    cfg = gateway_config({"main": pool}, tenants=tenants(args.runs, args.bursts))
    cfg["store"] = {"url": args.redis_url, "key_prefix": prefix, "socket_timeout_s": args.store_timeout,
                    "fail_mode": args.fail_mode}
    cfg["listen"] = {"host": "127.0.0.1"}
    cfg["routing"] = {"probe_interval_s": 0.5}
    gateways: list[Proc] = [gateway_proc(f"gw{i}", cfg, port=free_port(), log_dir=log_dir) for i in range(2)]
    if args.code is not None:
        for g in gateways:
            from_checkout(g, args.code)
    t0 = time.monotonic()
    try:
        sim.start(timeout_s=120)
        for g in gateways:
            g.start("/ready", 120)
        results = asyncio.run(run_all([g.url for g in gateways], args))
    finally:
        for g in gateways:
            g.stop()
        sim.stop()
        client = redis.Redis.from_url(args.redis_url)
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            client.delete(key)
        client.close()

    print(f"\n## {args.label}: {BURST} concurrent requests per burst over 2 gateway processes, "
          f"store.socket_timeout_s {args.store_timeout:g}, fail_mode {args.fail_mode}, sender {args.sender}, "
          f"admission queue {'on' if args.admission else 'off'}\n")
    print("| limit | fit | bursts | passed = fit | fit <= passed <= fit + refill | passed (min-max) | refused by the "
          "limit (min-max) | admitted over (max) | unenforced | other statuses |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind, (_, fit) in LIMITS.items():
        bursts = results[kind]
        passed = [c["passed"] for c, _ in bursts]
        strict = sum(1 for c, _ in bursts if c["passed"] == fit and not c["unenforced"])
        gcra = sum(1 for c, span in bursts if fit <= c["passed"] <= fit + refill(kind, span) and not c["unenforced"])
        unenforced = sum(c["unenforced"] for c, _ in bursts)
        refused = [c[f"429 rejected:{kind}"] for c, _ in bursts]
        other: collections.Counter[str] = collections.Counter()
        for c, _ in bursts:
            other.update({k: v for k, v in c.items() if k not in ("passed", "unenforced")})
        print(f"| {kind} {LIMITS[kind][0][kind]} | {fit} | {len(bursts)} | {strict}/{len(bursts)} | "
              f"{gcra}/{len(bursts)} | {min(passed)}-{max(passed)} | {min(refused)}-{max(refused)} | "
              f"{max(s for _, s in bursts):.2f} s | "
              f"{unenforced} | {dict(other)} |")
    print(f"\ntotal {time.monotonic() - t0:.0f} s; logs in {log_dir}")


if __name__ == "__main__":
    main()
