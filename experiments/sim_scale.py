"""How many concurrent streams one `kvgate sim` process sustains on one core at time-scale 1.

Starts a sim pinned to one core (taskset), then a load client pinned to another core in a separate process,
which opens N concurrent streaming chat requests (ignore_eos, long max_tokens) and, once all N stream,
measures over a fixed window from the sim's own /metrics:
  ideal    generated tokens / modeled step time (what the profile says the engine does)
  achieved generated tokens / wall time
  ratio    achieved / ideal (1.00 = the host CPU keeps up with the modeled engine)
  late     share of wall time the engine loop ran past its modeled step ends
and client-side the median gap between chunks against the modeled step time.

    .venv/bin/python experiments/sim_scale.py --streams 500,1000,2000 --profile h100-8b

Bounded: each level runs --window-s seconds of measurement after a ramp of at most --ramp-s seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]


def scrape(text: str) -> dict[str, float]:
    """Unlabelled-ish samples of interest from a /metrics body."""
    want = (
        "vllm:generation_tokens_total", "vllm:num_requests_running", "kvgate_sim_steps",
        "kvgate_sim_step_lateness_seconds", "kvgate_sim_modeled_step_seconds", "process_cpu_seconds_total",
    )
    out: dict[str, float] = {}
    for line in text.splitlines():
        for w in want:
            if line.startswith((w + "{", w + " ")):
                out[w] = float(line.rsplit(" ", 1)[1])
    return out


async def client(url: str, n: int, ramp_s: float, window_s: float, max_tokens: int) -> dict[str, float]:
    """Open n streams, wait until all run, measure a window, then disconnect everyone."""
    conn = aiohttp.TCPConnector(limit=n + 8)
    gaps: list[float] = []
    measuring = False
    errors = 0
    started = 0

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal errors, started
        body = {"model": "sim", "messages": [{"role": "user", "content": f"stream {i}: tell me a long story"}],
                "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        try:
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                last = 0.0
                first = True
                # Raw reads, not line parsing: the client must stay cheaper than the server it measures.
                async for data in r.content.iter_any():
                    if b"data: {" not in data:
                        continue
                    now = time.perf_counter()
                    if first:
                        started += 1
                        first = False
                    if measuring and last:
                        gaps.append(now - last)
                    last = now
        except (TimeoutError, aiohttp.ClientError):
            errors += 1

    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(one(session, i)) for i in range(n)]
        t0 = time.perf_counter()
        while started < n and time.perf_counter() - t0 < ramp_s:  # noqa: ASYNC110 - a bounded poll
            await asyncio.sleep(0.2)
        ramp = time.perf_counter() - t0
        async with session.get(url + "/metrics") as r:
            m0 = scrape(await r.text())
        w0, c0 = time.perf_counter(), time.process_time()
        measuring = True
        await asyncio.sleep(window_s)
        async with session.get(url + "/metrics") as r:
            m1 = scrape(await r.text())
        w1, c1 = time.perf_counter(), time.process_time()
        measuring = False
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wall = w1 - w0
    gen = m1["vllm:generation_tokens_total"] - m0["vllm:generation_tokens_total"]
    steps = m1["kvgate_sim_steps"] - m0["kvgate_sim_steps"]
    modeled = m1["kvgate_sim_modeled_step_seconds"] - m0["kvgate_sim_modeled_step_seconds"]
    late = m1["kvgate_sim_step_lateness_seconds"] - m0["kvgate_sim_step_lateness_seconds"]
    cpu = m1["process_cpu_seconds_total"] - m0["process_cpu_seconds_total"]
    return {
        "streams": n, "started": started, "ramp_s": ramp, "running": m1.get("vllm:num_requests_running", 0),
        "errors": errors, "ideal_tok_s": gen / modeled if modeled else 0.0, "achieved_tok_s": gen / wall,
        "ratio": (gen / wall) / (gen / modeled) if gen and modeled else 0.0, "late_share": late / wall,
        "sim_cpu_share": cpu / wall, "client_cpu_share": (c1 - c0) / wall,
        "cpu_us_per_token": 1e6 * cpu / gen if gen else 0.0,
        # What one full core could push at this per-token CPU cost (robust when the core is shared).
        "core_capacity_tok_s": gen / cpu if cpu else 0.0,
        "modeled_step_ms": 1e3 * modeled / steps if steps else 0.0,
        "wall_step_ms": 1e3 * wall / steps if steps else 0.0,
        "client_gap_p50_ms": 1e3 * statistics.median(gaps) if gaps else 0.0,
        "client_gap_p99_ms": 1e3 * statistics.quantiles(gaps, n=100)[98] if len(gaps) > 100 else 0.0,
    }


def run_level(args: argparse.Namespace, n: int) -> dict[str, float]:
    """One sim process + one client process for n streams."""
    port = 9300 + n % 500
    sim_cmd = ["taskset", "-c", str(args.sim_core), sys.executable, "-m", "app.sim", "--port", str(port),
               "--model", "sim", "--profile", args.profile, "--max-num-seqs", str(max(n, 256)),
               "--kv-blocks", str(args.kv_blocks), "--max-model-len", "8192"]
    sim = subprocess.Popen(sim_cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                import urllib.request

                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        cli = subprocess.run(
            ["taskset", "-c", str(args.client_core), sys.executable, __file__, "--client", url, "--streams", str(n),
             "--ramp-s", str(args.ramp_s), "--window-s", str(args.window_s), "--max-tokens", str(args.max_tokens)],
            cwd=ROOT, capture_output=True, timeout=args.ramp_s + args.window_s + 60, check=True,
        )
        return dict(orjson.loads(cli.stdout.splitlines()[-1]))
    finally:
        sim.terminate()
        try:
            sim.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sim.kill()


def main() -> None:
    """Parse flags; run each level; print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="500,1000")
    p.add_argument("--profile", default="h100-8b")
    p.add_argument("--kv-blocks", type=int, default=200_000, help="enough that the KV cache never preempts")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--ramp-s", type=float, default=20.0)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--sim-core", type=int, default=1)
    p.add_argument("--client-core", type=int, default=0)
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        res = asyncio.run(client(args.client, int(args.streams), args.ramp_s, args.window_s, args.max_tokens))
        print(orjson.dumps(res).decode())
        return
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cols = ("streams", "started", "running", "errors", "ideal_tok_s", "achieved_tok_s", "ratio", "sim_cpu_share",
            "client_cpu_share",
            "cpu_us_per_token", "core_capacity_tok_s", "modeled_step_ms", "wall_step_ms", "client_gap_p50_ms",
            "client_gap_p99_ms")
    print(f"profile {args.profile}, sim on core {args.sim_core}, client on core {args.client_core}, "
          f"window {args.window_s}s")
    print(" | ".join(cols))
    for n in (int(x) for x in args.streams.split(",")):
        r = run_level(args, n)
        print(" | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols), flush=True)


if __name__ == "__main__":
    main()
