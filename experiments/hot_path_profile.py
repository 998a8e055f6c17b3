"""Where a request's gateway CPU goes, this checkout against another, side by side: CPU per request and a cProfile.

For each arm (this checkout, and `--compare-checkout DIR` if given) a `kvgate serve` process runs pinned to core 0
in front of experiments/instant_upstream.py, with experiments/overhead.py's config for the variant. This process
(core 1) sends the load over aiohttp. Per arm and mode, interleaved over `--repeats`:

- CPU ms per request without the profiler: the gateway's utime+stime over `--requests` drained requests at
  concurrency 8 (the figure of experiments/peers.py, here on fewer requests, to iterate quickly).
- Then SIGUSR1 starts `cProfile.Profile(time.process_time)` in the gateway, `--profiled` requests follow, SIGUSR2
  dumps it: Python calls per request, of them in `app/`, and the `app/` functions whose calls per request differ
  between the arms (or the top ones, with one arm). Call counts are exact; profiled times are inflated ~3x.

    .venv/bin/python experiments/hot_path_profile.py [--compare-checkout /tmp/kv-before] [--variants kvgate]
        [--modes non-stream,stream-16] [--requests 4000] [--profiled 1000] [--repeats 3] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from overhead import MODES, cpu_seconds, gateway_config, load
from procs import Proc, instant_upstream, program_gateway, wait_written

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# Installed in the gateway before `app.cli.main`: SIGUSR1 starts a CPU-time profile, SIGUSR2 dumps it to $PROF_OUT.
BOOT = """
import cProfile, os, signal, sys, time
{path}
prof = [None]
def _on(*_):
    prof[0] = cProfile.Profile(time.process_time); prof[0].enable()
def _off(*_):
    prof[0].disable(); prof[0].dump_stats(os.environ["PROF_OUT"]); prof[0] = None
signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
import app
{check}
from app.cli import main
sys.exit(main())
"""


def boot(checkout: Path | None) -> str:
    """The gateway's `python -c` program, importing `app` from `checkout` (or the working directory)."""
    if checkout is None:
        return BOOT.format(path="", check="")
    other = str(checkout.resolve())
    return BOOT.format(path=f"sys.path[:0] = [{other!r}]", check=f"assert app.__file__.startswith({other!r})")


def drained(url: str, mode: str, requests: int) -> int:
    """About `requests` requests at concurrency 8, all finished; returns how many were answered."""
    stream, tokens = MODES[mode]
    done = 0
    while done < requests:
        n, _, errors = asyncio.run(load(url, stream, tokens, 8, 1.0, "sk-bench"))
        if errors:
            raise SystemExit(f"{errors} errors from {url}")
        done += n
    return done


def app_rows(stats_path: Path, requests: int) -> tuple[float, float, float, dict[str, tuple[float, float]]]:
    """(calls/req, app calls/req, profiled ms/req, {function: (calls/req, self profiled ms/req)}); an app
    function is keyed by its name alone (`app <name>`), others by file and name."""
    st = pstats.Stats(str(stats_path))
    total_calls = 0
    total_time = 0.0
    app_calls = 0
    funcs: dict[str, tuple[float, float]] = {}
    for (file, _line, name), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total_calls += nc
        total_time += tt
        marker = file.find("/app/")
        if marker >= 0:
            app_calls += nc
            key = f"app {name}"  # by name: modules moved between the arms
        elif file == "~":
            key = name  # a builtin
        else:
            key = f"{Path(file).name} {name}"
        calls, self_ms = funcs.get(key, (0.0, 0.0))
        funcs[key] = (calls + nc / requests, self_ms + 1000 * tt / requests)
    return total_calls / requests, app_calls / requests, 1000 * total_time / requests, funcs


def main() -> int:
    """Start the arms, measure and profile each mode, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare-checkout", type=Path)
    ap.add_argument("--variants", default="kvgate,kvgate-full")
    ap.add_argument("--modes", default="non-stream,stream-16")
    ap.add_argument("--requests", type=int, default=4000, help="drained requests per CPU sample")
    ap.add_argument("--profiled", type=int, default=1000, help="requests under the profiler (0: no profile)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", action="store_true", help="keep each profile (pstats) and print its path")
    args = ap.parse_args()
    os.sched_setaffinity(0, {1})

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-prof-"))
    upstream = instant_upstream("1")
    arms: dict[str, tuple[Proc, Path]] = {}
    try:
        for variant in args.variants.split(","):
            checkouts: list[tuple[str, Path | None]] = [("new", None)]
            if args.compare_checkout:
                checkouts.append(("old", args.compare_checkout))
            for label, checkout in checkouts:
                name = f"{variant}@{label}"
                cfg = tmp / f"{name}.yaml"
                cfg.write_text(yaml.safe_dump(gateway_config(upstream.url, variant)))
                out = tmp / f"{name}.pstats"
                os.environ["PROF_OUT"] = str(out)
                arms[name] = (program_gateway(name, boot(checkout), cfg, "0", tmp / f"{name}.log"), out)
        cpu: dict[tuple[str, str], list[float]] = {}
        for mode in args.modes.split(","):
            for proc, _ in arms.values():
                drained(proc.url, mode, 300)  # warm-up
            for _ in range(args.repeats):
                for name, (proc, _) in arms.items():
                    before = cpu_seconds(proc.pid)
                    n = drained(proc.url, mode, args.requests)
                    cpu.setdefault((name, mode), []).append(1000 * (cpu_seconds(proc.pid) - before) / n)
        print(f"load average {os.getloadavg()[0]:.2f}\n")
        if not cpu:
            print("(no CPU samples: --repeats 0)")
        print("| arm | mode | CPU ms/req, median (samples) | new / old |")
        print("|---|---|---:|---:|")
        for (name, mode), samples in cpu.items():
            med = statistics.median(samples)
            ratio = ""
            if name.endswith("@new") and args.compare_checkout:
                old = statistics.median(cpu[(name.replace("@new", "@old"), mode)])
                ratio = f"{med / old:.2f}"
            print(f"| {name} | {mode} | {med:.3f} ({' '.join(f'{s:.3f}' for s in samples)}) | {ratio} |")
        if args.profiled:
            for mode in args.modes.split(","):
                profile(arms, mode, args)
    finally:
        for proc, _ in arms.values():
            proc.stop()
        upstream.stop()
    return 0


def profile(arms: dict[str, tuple[Proc, Path]], mode: str, args: argparse.Namespace) -> None:
    """Profile each arm for `args.profiled` requests of `mode` and print calls per request (and the differences)."""
    rows: dict[str, tuple[float, float, float, dict[str, tuple[float, float]]]] = {}
    for name, (proc, out) in arms.items():
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.2)
        n = drained(proc.url, mode, args.profiled)
        os.kill(proc.pid, signal.SIGUSR2)
        wait_written(out)
        rows[name] = app_rows(out, n)
        if args.keep:
            out.rename(out.with_name(f"{name}-{mode}.pstats"))
            print(f"kept {out.with_name(f'{name}-{mode}.pstats')}")
        else:
            out.unlink()
    print(f"\n### {mode}\n")
    print("| arm | calls/req | app calls/req | profiled ms/req |")
    print("|---|---:|---:|---:|")
    for name, (calls, app_calls, ms, _) in rows.items():
        print(f"| {name} | {calls:.0f} | {app_calls:.0f} | {ms:.2f} |")
    for variant in args.variants.split(","):
        new = rows[f"{variant}@new"][3]
        old = rows.get(f"{variant}@old", (0, 0, 0, {}))[3]
        keys = sorted(set(new) | set(old),
                      key=lambda k: -abs(new.get(k, (0, 0))[0] - old.get(k, (0, 0))[0]))[: args.top]
        print(f"\n{variant}, {mode}: functions by |calls/req new - old| "
              "(calls/req new, old; self profiled ms new, old)\n")
        for k in keys:
            (nc, nt), (oc, ot) = new.get(k, (0, 0)), old.get(k, (0, 0))
            print(f"  {k:<70} {nc:6.2f} {oc:6.2f}   {nt:.4f} {ot:.4f}")


if __name__ == "__main__":
    sys.exit(main())
