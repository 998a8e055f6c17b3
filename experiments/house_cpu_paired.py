"""Gateway CPU per request, this checkout against an older one, paired round by round with an A/A control.

experiments/peers.py --compare-checkout runs each arm for seconds at a time, arm after arm, and takes medians of
3: on this shared 2-core machine one arm's samples spread by up to 1.5x, so its ratios flip around 1.00 from run
to run and cannot resolve the few per cent issue 20 asks about. Here, as experiments/admission_micro.py does for
admission, the arms run interleaved in many short rounds and the figure is the per-round ratio:

- Per variant (experiments/overhead.py's `kvgate` and `kvgate-full` configs, as peers.py uses them) three
  `kvgate serve` processes, all pinned to core 0: `new` (this checkout, or --checkout), `new-b` (the same
  checkout again: the A/A control, what the method resolves, position and port effects included) and `old`
  (--compare-checkout, its directory put first on sys.path and on PYTHONPATH, asserted via `app.__file__`).
  One instant upstream (experiments/instant_upstream.py) and this loader (aiohttp) share core 1.
- A round runs, per mode (non-stream, stream-16, stream-128), --requests drained requests at --concurrency
  through each arm, each arm on its own kept-alive client session (so connection setup is in no arm's figure).
  `--schedule together` (the default) loads a variant's three arms at the same time, so a neighbour that slows
  the core in that second slows all three; `alternate` runs them one after another in a fresh random order
  (measured on this machine: A/A intervals of ±2 % together, ±10 % alternating).
- An arm's CPU is the gateway process's scheduler run time (/proc/<pid>/task/*/schedstat, ns; the 10 ms ticks
  of utime+stime are too coarse for a 100 ms batch) from the batch's start to --settle-ms after its last
  answer (settle and telemetry run after the last byte), cross-checked against utime+stime over the run.
  kvgate-full's store is a redis-server of our own.
- The rounds run in --restarts blocks, each with freshly started gateways in a fresh order, so what one process
  draws (hash seed, memory layout, port) is averaged over blocks rather than fixed for the run (a single block
  showed an A/A ratio of 0.98 with an interval excluding 1.00).
- Per variant and mode: the median CPU µs per request over rounds, and the per-round ratios new/old and
  new-b/new (same round) as median [quartiles] with a bootstrap 95 % interval of the median.

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/house_cpu_paired.py --compare-checkout /tmp/kv-before \
        [--checkout DIR] [--rounds 30] [--restarts 3] [--requests 150] [--concurrency 8] [--variants kvgate,kvgate-full]
        [--modes non-stream,stream-16,stream-128] [--json samples.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import yaml
from overhead import MODES, PY, ROOT, TICKS, gateway_config
from procs import Proc, free_port

from kvlab.redis_server import RedisServer
from kvlab.stats import bootstrap_median, quartiles

KEY = "sk-bench"
GATEWAY_CORE, LOAD_CORE = "0", "1"
ARMS = ("new", "new-b", "old")
# (numerator, denominator) of the two ratios reported per row: the comparison and its A/A control.
RATIOS = (("new", "old"), ("new-b", "new"))


def run_ns(pid: int) -> int:
    """Scheduler run time of every live thread of `pid`, ns (first field of /proc/<pid>/task/<tid>/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between listing and reading
    return total


def tick_seconds(pid: int) -> float:
    """utime+stime of `pid` (all its threads, ended ones included), seconds; 1 / CLK_TCK resolution."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def boot(checkout: Path) -> str:
    """The `python -c` program that runs `kvgate` with `app` imported from `checkout` (asserted)."""
    where = str(checkout.resolve())
    return (f"import sys; sys.path[:0] = [{where!r}]; import app; assert app.__file__.startswith({where!r}), "
            f"app.__file__; from app.cli import main; sys.exit(main())")


def start_gateway(name: str, checkout: Path, variant: str, upstream: str, tmp: Path) -> Proc:
    """`kvgate serve` of `checkout` on the variant's config, pinned to GATEWAY_CORE, started."""
    port = free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(gateway_config(upstream, variant)))
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    proc = Proc(name, f"http://127.0.0.1:{port}",
                ["taskset", "-c", GATEWAY_CORE, PY, "-c", boot(checkout), "serve", "--config", str(cfg),
                 "--port", str(port), "--log-level", "warning"], log=tmp / f"{name}.log", env=env)
    try:
        return proc.start(any_status=True, timeout_s=60)
    except RuntimeError as err:
        proc.stop()
        raise SystemExit(f"{name} did not start: {(tmp / f'{name}.log').read_text()[-3000:]}") from err


def body(mode: str) -> bytes:
    """experiments/overhead.py's chat request for `mode`."""
    stream, tokens = MODES[mode]
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}],
                         "max_tokens": tokens, "stream": stream})


class Arm:
    """One gateway process and the kept-alive client session that loads it."""

    def __init__(self, name: str, proc: Proc) -> None:
        self.name = name
        self.proc = proc
        self.session: aiohttp.ClientSession | None = None
        self.ticks0 = 0.0
        self.resent = 0
        self.errors = 0

    async def batch(self, payload: bytes, n: int, concurrency: int, settle_s: float) -> tuple[int, int]:
        """n requests, `concurrency` at a time, all finished before it returns: (gateway run ns, non-200 answers)."""
        assert self.session is not None
        target = self.proc.url + "/v1/chat/completions"
        headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
        counter = iter(range(n))
        bad = 0

        async def worker() -> None:
            nonlocal bad
            for _ in counter:
                for attempt in range(2):
                    try:
                        async with self.session.post(  # type: ignore[union-attr]
                                target, data=payload, headers=headers) as r:
                            await r.read()
                            bad += r.status != 200
                        break
                    except aiohttp.ClientConnectionError:
                        # The gateway closed a kept-alive connection that idled while other arms ran: the
                        # request never reached it, so send it again (once) on a fresh connection.
                        if attempt:
                            raise
                        self.resent += 1

        pid = self.proc.pid
        t0 = run_ns(pid)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        # What the gateway does after the last byte of a reply (settle, telemetry) belongs to the batch: give
        # it a moment on the core before reading the clock, or it would land between batches, uncounted.
        await asyncio.sleep(settle_s)
        return run_ns(pid) - t0, bad


async def rounds(args: argparse.Namespace, arms: dict[str, Arm], n_rounds: int, rng: random.Random,
                 samples: dict[str, list[float]]) -> None:
    """Warm-up, then n_rounds rounds; appends to {"<variant>@<arm>|<mode>": CPU µs per request, one per round}."""
    modes = args.modes.split(",")
    errors = 0
    for arm in arms.values():
        arm.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        for mode in modes:  # warm-up: connections open, tenants' records and caches filled, code paths imported
            for arm in arms.values():
                await arm.batch(body(mode), args.warmup, args.concurrency, args.settle_ms / 1000)
        for arm in arms.values():
            arm.ticks0 = tick_seconds(arm.proc.pid)
        t0 = time.monotonic()
        for r in range(n_rounds):
            for mode in modes:
                payload = body(mode)
                order = list(arms)
                rng.shuffle(order)
                if args.schedule == "together":
                    # A variant's arms loaded at the same time, sharing the gateway core: whatever a neighbour
                    # does to the core's speed in that moment hits each of them.
                    groups = [[k for k in order if k.startswith(f"{v}@")] for v in args.variants.split(",")]
                else:
                    groups = [[k] for k in order]
                for group in groups:
                    got = await asyncio.gather(*(arms[k].batch(payload, args.requests, args.concurrency,
                                                               args.settle_ms / 1000) for k in group))
                    for key, (ns, bad) in zip(group, got, strict=True):
                        errors += bad
                        arms[key].errors += bad
                        samples.setdefault(f"{key}|{mode}", []).append(ns / 1000 / args.requests)
            if (r + 1) % 5 == 0:
                print(f"round {r + 1}/{n_rounds}, {time.monotonic() - t0:.0f} s, load average "
                      f"{os.getloadavg()[0]:.2f}, non-200 {errors}", flush=True)
    finally:
        for arm in arms.values():
            if arm.session is not None:
                await arm.session.close()
    for arm in arms.values():
        arm.ticks0 = tick_seconds(arm.proc.pid) - arm.ticks0  # from here on: utime+stime over the rounds


class Totals:
    """Per arm over every block: its run time in the rounds against utime+stime, non-200s, resent requests."""

    def __init__(self) -> None:
        self.ticks: dict[str, float] = {}
        self.errors: dict[str, int] = {}
        self.resent: dict[str, int] = {}

    def add(self, arms: dict[str, Arm]) -> None:
        """Add a finished block's arms."""
        for name, arm in arms.items():
            self.ticks[name] = self.ticks.get(name, 0.0) + arm.ticks0
            self.errors[name] = self.errors.get(name, 0) + arm.errors
            self.resent[name] = self.resent.get(name, 0) + arm.resent


def report(args: argparse.Namespace, totals: Totals, samples: dict[str, list[float]]) -> str:
    """The markdown table: per variant and mode, median µs/req per arm and the paired ratios with their CIs."""
    rng = random.Random(1)
    modes = args.modes.split(",")
    lines = ["| variant | mode | new µs/req | old µs/req | new-b µs/req | new / old: median [q1, q3] | 95 % CI "
             "| A/A new-b / new: median [q1, q3] | 95 % CI |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for variant in args.variants.split(","):
        for mode in modes:
            med = {a: statistics.median(samples[f"{variant}@{a}|{mode}"]) for a in ARMS}
            cells = []
            for num, den in RATIOS:
                ratios = [n / d for n, d in zip(samples[f"{variant}@{num}|{mode}"],
                                                samples[f"{variant}@{den}|{mode}"], strict=True)]
                q1, q2, q3 = quartiles(ratios)
                lo, hi = bootstrap_median(ratios, rng)
                cells.append(f"{q2:.3f} [{q1:.3f}, {q3:.3f}] | {lo:.3f}..{hi:.3f}")
            lines.append(f"| {variant} | {mode} | {med['new']:.1f} | {med['old']:.1f} | {med['new-b']:.1f} | "
                         + " | ".join(cells) + " |")
    # Cross-check: the ns run time summed over the rounds against utime+stime (ticks) over the same span.
    checks = []
    for key, ticks in totals.ticks.items():
        ns = sum(sum(samples[f"{key}|{m}"]) * args.requests / 1e6 for m in modes)
        checks.append(f"{key} {ns:.2f}/{ticks:.2f}")
    lines.append("")
    lines.append("run time in batches / utime+stime over the rounds (s): " + ", ".join(checks))
    lines.append("non-200 answers: " + ", ".join(f"{k} {n}" for k, n in totals.errors.items()))
    lines.append("requests sent again after a closed idle connection: "
                 + ", ".join(f"{k} {n}" for k, n in totals.resent.items()))
    return "\n".join(lines)


def git_head(checkout: Path) -> str:
    """The checkout's commit, with `+dirty` when its app/ has uncommitted changes."""
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "app"], capture_output=True,
                           text=True, check=False).stdout.strip()
    return head + ("+dirty" if dirty else "")


def main() -> int:
    """Start the upstream and the gateways, run the rounds, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare-checkout", type=Path, required=True, help="the `old` arm's checkout")
    ap.add_argument("--checkout", type=Path, default=ROOT, help="the `new` and `new-b` arms' checkout")
    ap.add_argument("--variants", default="kvgate,kvgate-full")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--requests", type=int, default=150, help="drained requests per arm, mode and round")
    ap.add_argument("--concurrency", type=int, default=8, help="as peers.py's drained CPU run")
    ap.add_argument("--warmup", type=int, default=300, help="requests per arm and mode before the rounds")
    ap.add_argument("--schedule", choices=["together", "alternate"], default="together",
                    help="together: a variant's three arms loaded at once in each round and mode; alternate: "
                    "one arm after another, in random order")
    ap.add_argument("--settle-ms", type=float, default=30.0, help="wait after a batch before reading its CPU")
    ap.add_argument("--restarts", type=int, default=3, help="blocks of rounds, each with freshly started gateways")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arms' order in each round")
    ap.add_argument("--json", type=Path, help="write every per-round sample here")
    args = ap.parse_args()
    os.sched_setaffinity(0, {int(LOAD_CORE)})

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-paired-"))
    # A Redis of our own for kvgate-full's store (a shared one restarted by someone else's job would turn a
    # round's answers into 503s), on either core: pinned beside the upstream and the loader it timed out.
    redis = RedisServer(tmp)
    redis.start()
    os.environ["REDIS_URL"] = redis.url  # read by overhead.gateway_config
    up_port = free_port()
    upstream = Proc("upstream", f"http://127.0.0.1:{up_port}",
                    ["taskset", "-c", LOAD_CORE, PY, str(ROOT / "experiments/instant_upstream.py"), str(up_port)],
                    log=tmp / "upstream.log")
    upstream.start(any_status=True)
    arms: dict[str, Arm] = {}
    started = dt.datetime.now(dt.UTC)
    load0 = os.getloadavg()[0]
    rng = random.Random(args.seed)
    samples: dict[str, list[float]] = {}
    totals = Totals()
    try:
        for block in range(args.restarts):
            # Fresh processes per block, started in a fresh order: what one process draws (hash seed, memory
            # layout, port) is averaged over blocks instead of fixed for the run. The A/A control shows it.
            names = [f"{v}@{a}" for v, a in itertools.product(args.variants.split(","), ARMS)]
            rng.shuffle(names)
            for name in names:
                variant, arm = name.split("@")
                checkout = args.compare_checkout if arm == "old" else args.checkout
                arms[name] = Arm(name, start_gateway(f"{name}.{block}", checkout, variant, upstream.url, tmp))
            n_rounds = args.rounds // args.restarts + (block < args.rounds % args.restarts)
            print(f"block {block + 1}/{args.restarts}: {n_rounds} rounds", flush=True)
            asyncio.run(rounds(args, arms, n_rounds, rng, samples))
            totals.add(arms)
            for a in arms.values():
                a.proc.stop()
            arms = {}
        worst = max(totals.errors.values())
        # A few non-200 answers (a store timeout on a starved machine) cost less than a served request; more
        # than 1 % of an arm's requests would make the figures incomparable.
        if worst > 0.01 * args.rounds * args.requests * len(args.modes.split(",")):
            raise SystemExit(f"non-200 answers, the figures would not be comparable: {totals.errors}")
        text = report(args, totals, samples)
    finally:
        for a in arms.values():
            a.proc.stop()
        upstream.stop()
        redis.stop()
    ended = dt.datetime.now(dt.UTC)
    print(f"\nnew = {args.checkout.resolve()} ({git_head(args.checkout)}), old = {args.compare_checkout.resolve()} "
          f"({git_head(args.compare_checkout)}); {started:%H:%M}-{ended:%H:%M} UTC, load average "
          f"{load0:.2f} -> {os.getloadavg()[0]:.2f}; {args.rounds} rounds x {args.requests} requests per arm and "
          f"mode in {args.restarts} blocks of fresh gateways, concurrency {args.concurrency}, schedule "
          f"{args.schedule}, settle {args.settle_ms:g} ms\n")
    print(text)
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
