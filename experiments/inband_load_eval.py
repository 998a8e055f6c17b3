"""Issue 12, in-band load: how vLLM's endpoint-load-metrics reply header changes the gateways' load view and spills.

Setup: 4 `kvgate sim --profile h100-8b` replicas, pool `fast` (interactive, 2 sims, --max-num-seqs 8) and pool
`bulk` (bulk, 2 sims, --max-num-seqs 32), both declared with their max_num_seqs; GATEWAYS `kvgate serve` replicas
in front of the same sims (a gateway deployment of several replicas: each sees only its own in-flight requests,
the others' only through a scrape), /metrics scraped every --probe-s seconds. Load: waves of non-streaming
interactive chat requests (vLLM 0.32 reports load on whole replies only), one wave every --every-s of --wave-on
requests per gateway in the first half of each --period-s and --wave-off in the second (load that turns on and
off faster than the scrapes), for --duration-s, `max_tokens` --max-tokens with ignore_eos, distinct prompts.
Two arms on the same sims and trace: `pools.<p>.load_report.enabled` false (scrapes only) and true (every reply
refreshes its replica's load). Times are the sims' modeled time (real time x --time-scale).

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/inband_load_eval.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import (
    MODEL,
    Counters,
    Proc,
    ascrape,
    gateway_config,
    gateway_proc,
    metric_sum,
    reset_prefix_cache,
    scrape,
    sim_proc,
)

from app.bench.report import percentile

RESULTS = Path(__file__).resolve().parent / "results" / "inband_load_eval.jsonl"


@dataclass
class Arm:
    """One arm's outcome: per-request (modeled e2e ms, pool), sampled engine queues, counters."""

    name: str
    latencies_ms: list[float] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)
    failed: int = 0
    peak_waiting: dict[str, int] = field(default_factory=dict)
    waiting_samples: dict[str, list[int]] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    reports: float = 0.0
    wall_s: float = 0.0


async def _one(client: httpx.AsyncClient, gw: str, i: int, max_tokens: int, scale: float, arm: Arm) -> None:
    body = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"request {i}: count slowly from one to a hundred."}]}
    t0 = time.perf_counter()
    try:
        r = await client.post(gw + "/v1/chat/completions", json=body, headers={"x-kvgate-class": "interactive"})
    except httpx.HTTPError:
        arm.failed += 1
        return
    if r.status_code != 200:
        arm.failed += 1
        return
    arm.latencies_ms.append((time.perf_counter() - t0) * 1000 * scale)
    route = dict(kv.split("=", 1) for kv in r.headers.get("x-kvgate-route", "").split(";") if "=" in kv)
    arm.pools.append(route.get("pool", "?"))


async def _sample(urls: dict[str, str], every_s: float, stop: asyncio.Event, arm: Arm) -> None:
    async with httpx.AsyncClient(timeout=2.0) as client:
        while not stop.is_set():
            for name, url in urls.items():
                waiting = int(metric_sum(await ascrape(client, url), "vllm:num_requests_waiting"))
                arm.waiting_samples.setdefault(name, []).append(waiting)
                arm.peak_waiting[name] = max(arm.peak_waiting.get(name, 0), waiting)
            await asyncio.sleep(every_s)


async def run_arm(name: str, gateways: list[Proc], sims: dict[str, Proc], args: argparse.Namespace) -> Arm:
    """Send the waves through the gateways, round robin per wave; sample the sims' queues meanwhile."""
    arm = Arm(name)
    scale = args.time_scale
    urls = {n: p.url for n, p in sims.items()}
    arm.counters.before = {u: scrape(u) for u in urls.values()}
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(urls, 0.1 / scale, stop, arm))
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        tasks = []
        n = 0
        waves = round(args.duration_s / args.every_s)
        for w in range(waves):
            due = t0 + w * args.every_s / scale
            await asyncio.sleep(max(due - time.perf_counter(), 0.0))
            on = (w * args.every_s) % args.period_s < args.period_s / 2
            for gw in gateways:
                for _ in range(args.wave_on if on else args.wave_off):
                    tasks.append(asyncio.create_task(_one(client, gw.url, n, args.max_tokens, scale, arm)))
                    n += 1
        await asyncio.gather(*tasks)
    arm.wall_s = time.perf_counter() - t0
    stop.set()
    await sampler
    arm.counters.after = {u: scrape(u) for u in urls.values()}
    arm.reports = sum(metric_sum(scrape(g.url), "gateway_replica_load_reports_total", outcome="applied")
                      for g in gateways)  # fmt: skip
    return arm


def _queue_ms(arm: Arm, url: str, scale: float) -> float:
    d_sum = arm.counters.delta(url, "vllm:request_queue_time_seconds_sum")
    d_n = arm.counters.delta(url, "vllm:request_queue_time_seconds_count")
    return d_sum / d_n * 1000 if d_n else 0.0


def table(arms: list[Arm], sims: dict[str, Proc], scale: float) -> str:
    """The arms side by side, ratios against the scrape-only arm."""
    fast = [n for n in sims if n.startswith("fast")]
    bulk = [n for n in sims if n.startswith("bulk")]

    def row(label: str, values: list[str]) -> str:
        return f"{label:<34}" + "".join(f"{v:>22}" for v in values)

    def served(a: Arm, pool: str) -> int:
        return sum(1 for p in a.pools if p == pool)

    def mean_wait(a: Arm, names: list[str]) -> float:
        samples = [w for n in names for w in a.waiting_samples.get(n, [])]
        return sum(samples) / len(samples) if samples else 0.0

    lines = [row("metric", [a.name for a in arms]), "-" * (34 + 22 * len(arms))]
    lines.append(row("requests ok / failed", [f"{len(a.latencies_ms)} / {a.failed}" for a in arms]))
    lines.append(row("served by fast / bulk", [f"{served(a, 'fast')} / {served(a, 'bulk')}" for a in arms]))
    lines.append(row("in-band reports applied", [f"{a.reports:.0f}" for a in arms]))
    lines.append(row("fast: mean queue ms per replica", [
        "/".join(f"{_queue_ms(a, sims[n].url, scale):.0f}" for n in fast) for a in arms]))  # fmt: skip
    lines.append(row("bulk: mean queue ms per replica", [
        "/".join(f"{_queue_ms(a, sims[n].url, scale):.0f}" for n in bulk) for a in arms]))  # fmt: skip
    lines.append(row("fast: peak waiting per replica", [
        "/".join(str(a.peak_waiting.get(n, 0)) for n in fast) for a in arms]))  # fmt: skip
    lines.append(row("fast: mean waiting (sampled)", [f"{mean_wait(a, fast):.2f}" for a in arms]))
    for p in (50, 99):
        vals = [percentile(a.latencies_ms, p) for a in arms]
        lines.append(row(f"e2e p{p} ms", [f"{v:.0f}" if v is not None else "-" for v in vals]))
        b = vals[0]
        lines.append(row("  / scrape only", [f"{v / b:.2f}x" if v and b else "-" for v in vals]))
    late = [sum(a.counters.delta(s.url, "kvgate_sim_step_lateness_seconds") for s in sims.values())
            / max(a.wall_s * scale * len(sims), 1e-9) for a in arms]  # fmt: skip
    lines.append(row("sim lateness", [f"{v:.1%}" for v in late]))
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> str:
    """Start the sims once; per arm, fresh gateways; append the arms to RESULTS and return the table."""
    scale = args.time_scale
    log_dir = Path(tempfile.mkdtemp(prefix="kvgate-inband-"))
    common = ["--profile", "h100-8b", "--seed", "1"]
    sims = {f"fast{i}": sim_proc(f"fast{i}", [*common, "--max-num-seqs", "8"], time_scale=scale, log_dir=log_dir)
            for i in range(2)}  # fmt: skip
    sims |= {f"bulk{i}": sim_proc(f"bulk{i}", [*common, "--max-num-seqs", "32"], time_scale=scale, log_dir=log_dir)
             for i in range(2)}  # fmt: skip
    arms: list[Arm] = []
    try:
        for s in sims.values():
            s.start()
        order = [("scrape only", False), ("scrape + in-band", True)]
        for name, enabled in reversed(order) if args.reverse else order:
            report = {"enabled": enabled}
            pools: dict[str, dict[str, object]] = {
                "fast": {"role": "interactive", "replicas": [sims["fast0"].url, sims["fast1"].url],
                         "max_num_seqs": 8, "load_report": report},
                "bulk": {"role": "bulk", "replicas": [sims["bulk0"].url, sims["bulk1"].url],
                         "max_num_seqs": 32, "load_report": report},
            }  # fmt: skip
            if args.no_capacity:  # the gateway then knows a replica's slots only from what it sees queue
                for p in pools.values():
                    del p["max_num_seqs"]
            cfg = gateway_config(pools, routing={"probe_interval_s": args.probe_s / scale},
                                 upstream={"read_timeout_s": 600})  # fmt: skip
            gws = [gateway_proc(f"gw{i}-{enabled}", cfg, log_dir=log_dir) for i in range(args.gateways)]
            try:
                for g in gws:
                    g.start(ready_path="/ready")
                reset_prefix_cache(s.url for s in sims.values())
                await asyncio.sleep(2 * args.probe_s / scale)  # every replica scraped at least once
                arms.append(await run_arm(name, gws, sims, args))
            finally:
                for g in gws:
                    g.stop()
            await asyncio.sleep(1.0)
    finally:
        for s in sims.values():
            s.stop()
    arms.sort(key=lambda a: a.name != "scrape only")  # the baseline column first, whichever ran first
    out = table(arms, sims, scale)
    head = (f"{args.gateways} gateways, a wave every {args.every_s}s of {args.wave_on} (first half of each "
            f"{args.period_s}s) or {args.wave_off} requests per gateway, for {args.duration_s}s, "
            f"max_tokens {args.max_tokens}, scrape every {args.probe_s}s, time scale {scale}"
            f"{', pools without max_num_seqs' if args.no_capacity else ''}")  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as f:
        for a in arms:
            f.write(json.dumps({"arm": a.name, "args": vars(args), "ok": len(a.latencies_ms), "failed": a.failed,
                                "pools": a.pools, "latencies_ms": a.latencies_ms, "peak_waiting": a.peak_waiting,
                                "reports": a.reports, "when": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")  # fmt: skip
    return head + "\n" + out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: the run in docs/measurements/routing.md)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateways", type=int, default=2)
    p.add_argument("--wave-on", type=int, default=6, help="requests per gateway per wave, first half of a period")
    p.add_argument("--wave-off", type=int, default=1, help="requests per gateway per wave, second half")
    p.add_argument("--period-s", type=float, default=6.0, help="modeled seconds of one on/off period")
    p.add_argument("--every-s", type=float, default=0.25, help="modeled seconds between waves")
    p.add_argument("--duration-s", type=float, default=24.0, help="modeled seconds of waves")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--probe-s", type=float, default=3.0, help="modeled seconds between the gateways' scrapes")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--no-capacity", action="store_true", help="pools without max_num_seqs")
    p.add_argument("--reverse", action="store_true", help="run the in-band arm first")
    return p.parse_args(argv)


if __name__ == "__main__":
    text = asyncio.run(main(parse_args()))
    print(text)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
