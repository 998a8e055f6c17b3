"""CPU of single request-path functions inside a running gateway, this checkout against another, side by side.

cProfile charges every Python call its own overhead, so code made of many small calls looks dearer than it is
(house-cpu page: a frozen-dataclass build of 0.6 µs showed as 21.7 profiled µs). Here each named function is
wrapped once, in the gateway process, by a timer that adds the process CPU clock around the call: ~0.2 µs per
call, the same in both arms, and nothing else is traced. Only synchronous functions are timed (an awaited one
would be charged other tasks' time). The gateways run pinned to core 0 in front of experiments/instant_upstream.py
on core 1, with experiments/overhead.py's configs; this process sends drained batches at concurrency 8 to each
arm in turn, `--rounds` times, and prints µs per call (median over rounds) per function and arm.

    .venv/bin/python experiments/stage_cpu.py --compare-checkout /tmp/kv-before [--variant kvgate-full]
        [--mode non-stream] [--rounds 10] [--requests 400]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from hot_path_profile import drained
from overhead import gateway_config
from procs import Proc, instant_upstream, program_gateway, wait_written

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# module attribute -> label: the sync functions the path calls by module-level name (either arm may lack some).
TARGETS = [
    ("app.api.proxy", "headers_of"), ("app.api.proxy", "parse_request"), ("app.api.proxy", "single_credentials"),
    ("app.pipeline", "normalize"), ("app.pipeline", "classify"), ("app.pipeline", "routing_key"),
    ("app.pipeline", "gateway_headers"), ("app.pipeline", "request_salt"), ("app.pipeline", "salt_for_tenant"),
    ("app.dispatch", "pick"), ("app.dispatch", "session_key"), ("app.dispatch", "forward_headers"),
    ("app.settle", "spend_record"), ("app.pipeline", "response_headers"),
]
BOOT = """
import json, os, signal, sys, time, importlib
{path}
import app
{check}
from app.cli import main
TOTALS = {{}}
def wrap(mod, name):
    try:
        m = importlib.import_module(mod)
    except ImportError:
        return
    f = getattr(m, name, None)
    if f is None or not callable(f):
        return
    cell = TOTALS.setdefault(name, [0, 0.0])
    clock = time.process_time
    def timed(*a, **k):
        t = clock()
        try:
            return f(*a, **k)
        finally:
            cell[0] += 1
            cell[1] += clock() - t
    setattr(m, name, timed)
for mod, name in {targets!r}:
    wrap(mod, name)
def dump(*_):
    with open(os.environ["STAGE_OUT"], "w") as fh:
        json.dump(TOTALS, fh)
    for cell in TOTALS.values():
        cell[0], cell[1] = 0, 0.0
signal.signal(signal.SIGUSR2, dump)
sys.exit(main())
"""


def boot(checkout: Path | None) -> str:
    """The gateway's `python -c` program with the timers, importing `app` from `checkout` (or the working dir)."""
    if checkout is None:
        return BOOT.format(path="", check="", targets=TARGETS)
    other = str(checkout.resolve())
    return BOOT.format(path=f"sys.path[:0] = [{other!r}]", check=f"assert app.__file__.startswith({other!r})",
                       targets=TARGETS)


def sample(proc: Proc, out: Path, mode: str, requests: int) -> dict[str, float]:
    """µs per call of each timed function over one drained batch."""
    os.kill(proc.pid, signal.SIGUSR2)  # reset
    time.sleep(0.1)
    drained(proc.url, mode, requests)
    out.unlink(missing_ok=True)
    os.kill(proc.pid, signal.SIGUSR2)
    wait_written(out, settle_s=0.05)
    totals = json.loads(out.read_text())
    return {name: 1e6 * t / n for name, (n, t) in totals.items() if n}


def main() -> int:
    """Start both arms, sample them in turn, print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare-checkout", type=Path, required=True)
    ap.add_argument("--variant", default="kvgate-full")
    ap.add_argument("--mode", default="non-stream")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args()
    os.sched_setaffinity(0, {1})
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-stage-"))
    upstream = instant_upstream("1")
    arms: dict[str, tuple[Proc, Path]] = {}
    try:
        for label, checkout in (("new", None), ("old", args.compare_checkout)):
            cfg = tmp / f"{label}.yaml"
            cfg.write_text(yaml.safe_dump(gateway_config(upstream.url, args.variant)))
            out = tmp / f"{label}.json"
            os.environ["STAGE_OUT"] = str(out)
            arms[label] = (program_gateway(label, boot(checkout), cfg, "0", tmp / f"{label}.log"), out)
        for proc, _ in arms.values():
            drained(proc.url, args.mode, 300)
        got: dict[str, dict[str, list[float]]] = {label: {} for label in arms}
        for _ in range(args.rounds):
            for label, (proc, out) in arms.items():
                for name, us in sample(proc, out, args.mode, args.requests).items():
                    got[label].setdefault(name, []).append(us)
        print(f"{args.variant}, {args.mode}: µs per call, median of {args.rounds} rounds x {args.requests} requests"
              f" (load average {os.getloadavg()[0]:.2f})\n")
        print("| function | new | old | new - old |")
        print("|---|---:|---:|---:|")
        for name in dict.fromkeys([*got["new"], *got["old"]]):
            new = statistics.median(got["new"][name]) if name in got["new"] else None
            old = statistics.median(got["old"][name]) if name in got["old"] else None
            diff = f"{new - old:+.2f}" if new is not None and old is not None else ""
            cells = ["" if v is None else f"{v:.2f}" for v in (new, old)]
            print(f"| {name} | {cells[0]} | {cells[1]} | {diff} |")
    finally:
        for proc, _ in arms.values():
            proc.stop()
        upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
