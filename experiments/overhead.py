"""Gateway overhead, side by side in one run: CPU per request of kvgate vs a bare Starlette+aiohttp pass-through.

Each proxy runs alone on core 0 (taskset); the instant upstream and this load generator share core 1. CPU per
request is the proxy process's own utime+stime over the run divided by requests served, so a busy neighbour does
not skew it. Prints a table of ratios against the pass-through baseline.

    .venv/bin/python experiments/overhead.py [--seconds 8] [--concurrency 32] [--variants kvgate,kvgate-full]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import yaml
from procs import Proc, free_port

from kvlab.configs import gateway_config as lab_config

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TICKS = os.sysconf("SC_CLK_TCK")
MODES = {"non-stream": (False, 16), "stream-16": (True, 16), "stream-128": (True, 128)}


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    """Resident set size of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def gateway_config(upstream: str, variant: str) -> dict[str, object]:
    """kvgate config for a variant: `kvgate` (anonymous, in-memory) or `kvgate-full` (auth, limits, Redis)."""
    cfg = lab_config({"main": {"role": "interactive", "replicas": [upstream]}})
    # The load sends a key; with optional auth only an anonymous key is billed to `anonymous`.
    cfg["auth"] = {"required": False, "anonymous_keys": ["sk-bench"]}
    if variant == "kvgate-full":
        cfg["auth"] = {"required": True}
        cfg["store"] = {"url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), "key_prefix": "kvbench:"}
        cfg["tenants"] = [{"id": "bench", "api_keys": ["sk-bench"], "normalize": "on",
                           "limits": {"rpm": 10_000_000, "tpm": 1_000_000_000}}]
    return cfg


def start(cmd: list[str], port: int, core: str) -> Proc:
    """Start a server pinned to `core` and wait until it answers at all (the pass-through has no /health)."""
    return Proc(cmd[0], f"http://127.0.0.1:{port}", ["taskset", "-c", core, *cmd]).start(any_status=True)


async def load(url: str, stream: bool, tokens: int, concurrency: int, seconds: float,
               key: str) -> tuple[int, list[float], int]:
    """Closed loop: `concurrency` workers for `seconds`; returns (ok count, latencies, errors)."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}],
                         "max_tokens": tokens, "stream": stream})
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    lat: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                try:
                    async with s.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - t)
                else:
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(lat), lat, errors


def p50(xs: list[float]) -> float:
    """Median."""
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


def measure(proc: Proc | None, target: str, mode: str, args: argparse.Namespace, key: str) -> dict[str, float]:
    """CPU-ms/request and req/s at concurrency N, and p50 latency at concurrency 1."""
    stream, tokens = MODES[mode]
    asyncio.run(load(target, stream, tokens, 4, 1.0, key))  # warm-up
    before = cpu_seconds(proc.pid) if proc else 0.0
    t0 = time.perf_counter()
    n, _, errors = asyncio.run(load(target, stream, tokens, args.concurrency, args.seconds, key))
    elapsed = time.perf_counter() - t0
    cpu = (cpu_seconds(proc.pid) - before) if proc else 0.0
    _, lat1, _ = asyncio.run(load(target, stream, tokens, 1, args.seconds / 2, key))
    return {"cpu_ms": 1000 * cpu / max(n, 1), "rps": n / elapsed, "p50_ms": 1000 * p50(lat1), "errors": errors}


def main() -> int:
    """Run every proxy variant against the same upstream and print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--variants", default="kvgate,kvgate-full")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rss-requests", type=int, default=10_000, help="requests for the RSS growth check (0 = skip)")
    args = ap.parse_args()

    up_port = free_port()
    upstream = start([PY, str(ROOT / "experiments/instant_upstream.py"), str(up_port)], up_port, "1")
    procs: dict[str, Proc] = {}
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-bench-"))
    try:
        port = free_port()
        procs["passthrough"] = start([PY, str(ROOT / "experiments/passthrough.py"), str(port), upstream.url], port, "0")
        for variant in args.variants.split(","):
            port = free_port()
            cfg_path = tmp / f"{variant}.yaml"
            cfg_path.write_text(yaml.safe_dump(gateway_config(upstream.url, variant)))
            procs[variant] = start([PY, "-m", "app.cli", "serve", "--config", str(cfg_path), "--port", str(port)],
                                   port, "0")
        rows: list[tuple[str, str, dict[str, float]]] = []
        for mode in args.modes.split(","):
            direct = measure(None, upstream.url, mode, args, "x")
            rows.append(("upstream (direct)", mode, direct))
            for name, proc in procs.items():
                rows.append((name, mode, measure(proc, proc.url, mode, args, "sk-bench")))
        print_table(rows)
        if args.rss_requests:
            for name, proc in procs.items():
                if name == "passthrough":
                    continue
                idle = rss_mb(proc.pid)
                done = 0
                while done < args.rss_requests:
                    n, _, _ = asyncio.run(load(proc.url, False, 16, 32, 2.0, "sk-bench"))
                    done += n
                print(f"RSS {name}: idle-after-bench {idle:.1f} MiB -> {rss_mb(proc.pid):.1f} MiB "
                      f"after {done} more requests")
    finally:
        for proc in procs.values():
            proc.stop()
        upstream.stop()
    return 0


def print_table(rows: list[tuple[str, str, dict[str, float]]]) -> None:
    """Markdown table with ratios against the pass-through of the same mode."""
    base = {mode: r for name, mode, r in rows if name == "passthrough"}
    direct = {mode: r for name, mode, r in rows if name == "upstream (direct)"}
    print("| proxy | mode | CPU ms/req | x pass-through CPU | req/s (c=N) | p50 ms (c=1) | added p50 ms | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, mode, r in rows:
        if name == "upstream (direct)":
            continue
        ratio = r["cpu_ms"] / base[mode]["cpu_ms"] if base[mode]["cpu_ms"] else float("nan")
        added = r["p50_ms"] - direct[mode]["p50_ms"]
        print(f"| {name} | {mode} | {r['cpu_ms']:.3f} | {ratio:.2f} | {r['rps']:.0f} | {r['p50_ms']:.2f} | "
              f"{added:.2f} | {r['errors']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
