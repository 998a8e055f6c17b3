"""Requests/s of one `kvgate serve --workers 2` against one worker, on this machine, peers.py's method.

The same instant upstream (experiments/instant_upstream.py), the same `kvgate-full` config as peers.py (auth,
limits and spend on Redis, normalize on: what a shared-store deployment runs), the same wrk closed loop. Two
gateways run side by side, one process and `--workers 2`, and their runs alternate inside every repeat, so a
neighbour's load hits both alike. Nothing is pinned: two workers need both cores, and the upstream, Redis and
wrk share them with the gateway in both arms (on a 2-core box that is the deployment's real situation, and it
caps what a second worker can add). Per run: req/s, the gateway's CPU per request (the process tree's
utime+stime, all workers), and how many of the machine's 2 cores everything used.

    .venv/bin/python experiments/workers_rps.py [--seconds 5] [--repeats 5] [--concurrency 64]
        [--modes non-stream,stream-16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import PY, ROOT, gateway_config
from peers import Run, run_wrk, start_server, tree_cpu_seconds
from procs import Proc, free_port

from kvlab.redis_server import RedisServer

ALL_CORES = "0,1"
ARMS = (("1 worker", 1), ("--workers 2", 2))


def start_gateway(upstream: str, redis_url: str, workers: int, tmp: Path) -> Proc:
    """`kvgate serve` with peers.py's kvgate-full config on our Redis, with `workers` processes."""
    cfg = gateway_config(upstream, "kvgate-full")
    cfg["store"] = {"url": redis_url, "key_prefix": f"kvbench-w{workers}:"}
    path = tmp / f"w{workers}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    argv = [PY, "-m", "app.cli", "serve", "--config", str(path), "--port", str(port), "--workers", str(workers)]
    return start_server(argv, port, ALL_CORES, tmp / f"w{workers}.log")


def machine_cpu_s() -> float:
    """CPU seconds every process on the machine used so far (/proc/stat, all cores, idle and iowait excluded)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def one(gw: Proc, mode: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """A loaded run: req/s, gateway CPU ms per request, cores busy (gateway tree; whole machine)."""
    g0, m0 = tree_cpu_seconds(gw.pid), machine_cpu_s()
    run: Run = run_wrk(gw.url, mode, args.concurrency, args.seconds, tmp, core=ALL_CORES)
    g1, m1 = tree_cpu_seconds(gw.pid), machine_cpu_s()
    return {"rps": run.ok / run.seconds, "cpu_ms": 1000 * (g1 - g0) / max(run.ok, 1),
            "gw_cores": (g1 - g0) / run.seconds, "all_cores": (m1 - m0) / run.seconds,
            "errors": float(run.errors)}  # fmt: skip


def main() -> int:
    """Start the upstream, Redis and both gateways; alternate their runs per mode and repeat; print tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="wrk run length")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--modes", default="non-stream,stream-16")
    args = ap.parse_args()
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"needs {tool}")
    modes = args.modes.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-workers-"))
    procs: list[Proc] = []
    redis_server = RedisServer(tmp)  # no persistence
    redis_server.start()
    redis_url = redis_server.url
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    try:
        up_port = free_port()
        upstream = start_server([PY, str(ROOT / "experiments/instant_upstream.py"), str(up_port)], up_port,
                                ALL_CORES, tmp / "upstream.log")  # fmt: skip
        procs.append(upstream)
        gateways = {}
        for name, workers in ARMS:
            gateways[name] = start_gateway(upstream.url, redis_url, workers, tmp)
            procs.append(gateways[name])
        print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
        for mode in modes:
            for gw in gateways.values():
                run_wrk(gw.url, mode, 8, 1, tmp, core=ALL_CORES)  # warm-up: connections, caches, workers
        for r in range(args.repeats):
            for mode in modes:
                # Alternate which arm goes first, so a drift in the neighbours' load favours neither.
                order = list(gateways.items()) if r % 2 == 0 else list(reversed(gateways.items()))
                for name, gw in order:
                    s = one(gw, mode, args, tmp)
                    samples.setdefault((name, mode), []).append(s)
                    print(f"  repeat {r} {mode:<10} {name:<12} {s['rps']:7.0f} req/s  {s['cpu_ms']:.3f} CPU ms/req  "
                          f"gateway {s['gw_cores']:.2f} cores, machine {s['all_cores']:.2f}  errors {s['errors']:.0f}",
                          flush=True)  # fmt: skip
        print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    finally:
        for p in reversed(procs):
            p.stop()
        redis_server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    one_w, two_w = ARMS[0][0], ARMS[1][0]
    print(f"\n## kvgate serve --workers 2 against one worker (wrk c={args.concurrency}, {args.seconds:.0f} s runs, "
          f"{args.repeats} repeats, nothing pinned, {os.cpu_count()} CPUs)\n")  # fmt: skip
    print(
        "| mode | req/s 1 worker | req/s --workers 2 | ratio (median of per-repeat ratios) | ratio range "
        "| CPU ms/req 1 / 2 | gateway cores 1 / 2 | machine cores 1 / 2 | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        a, b = samples[(one_w, mode)], samples[(two_w, mode)]
        ratios = [y["rps"] / x["rps"] for x, y in zip(a, b, strict=True)]

        def med(rows: list[dict[str, float]], k: str) -> float:
            return statistics.median(s[k] for s in rows)

        print(f"| {mode} | {med(a, 'rps'):.0f} | {med(b, 'rps'):.0f} | **{statistics.median(ratios):.2f}x** "
              f"| {min(ratios):.2f}-{max(ratios):.2f} | {med(a, 'cpu_ms'):.3f} / {med(b, 'cpu_ms'):.3f} "
              f"| {med(a, 'gw_cores'):.2f} / {med(b, 'gw_cores'):.2f} "
              f"| {med(a, 'all_cores'):.2f} / {med(b, 'all_cores'):.2f} "
              f"| {sum(s['errors'] for s in a + b):.0f} |")  # fmt: skip
    print("\nper-repeat ratios: " + "; ".join(
        f"{mode}: " + ", ".join(f"{y['rps'] / x['rps']:.2f}" for x, y in
                                zip(samples[(one_w, mode)], samples[(two_w, mode)], strict=True))
        for mode in modes))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
