"""Soak of the default gateway: old vs new MemoryStore side by side, or a long soak of the in-memory and Redis stores.

Each arm is a real `kvgate serve` on the embedded config (config/local.yaml) with both pools pointed at
experiments/instant_upstream.py, driven by wrk (one thread, `--concurrency` connections, non-streaming
chat, anonymous: every request settles one spend record) until `--requests` answers or `--max-seconds`.
The gateway runs alone on core 0, the upstream and wrk on core 1. Every window prints answers/s (counted
by wrk as they arrive), the gateway's CPU ms per answer (its own utime+stime, not wall time: the cores are
shared) and its RSS.

Old vs new (`--arms old,new`, 5-second windows): the arms differ only in app/store/memory.py: "old" loads it
from `--baseline` (a git revision; default the parent of the commit that introduced the bounded store) into
the gateway process in place of the checkout's, "new" is the checkout. Then a table of windows: old req/s,
new req/s, new/old ratio.

Soak (`--soak MINUTES`, arms `memory,redis`, 1-minute windows): the checkout with the in-memory store, and
with the Redis store at `--redis-url` under a key prefix of its own (`kvgate-soak-<random>:`, deleted after
the arm). Every request has a prompt of its own (a counter in the user turn), so anything keyed by prompt
sees new keys at the request rate. First the calibration: `--calibrate` concurrencies, 15 s each on a fresh
gateway (the first 5 s discarded), the one with the highest rate is the soak's (closed loop at saturation:
the highest rate one gateway process sustains). Then per arm a table per minute: answers/s, gateway CPU
ms/answer, RSS, each with its ratio to minute 1 (and, for Redis, redis-server's CPU ms/answer and memory);
"flat" means every ratio within 10%.

`--store-only` measures just the store, in this process: `--requests` settles (one spend record each,
real clock) on each arm's MemoryStore, CPU µs per settle per 10k-settle batch and the id count, each arm
bounded by `--max-seconds`. It needs no free core, so it still reads true on a busy machine.

    .venv/bin/python experiments/memory_store_soak.py [--requests 200000] [--concurrency 64]
        [--max-seconds 180] [--baseline REV] [--arms old,new] [--store-only]
    .venv/bin/python experiments/memory_store_soak.py --soak 10 [--arms memory,redis] [--calibrate 16,32,64,128]
        [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import yaml
from procs import Proc, free_port

from app.store.base import SpendRecord

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TICKS = os.sysconf("SC_CLK_TCK")
WINDOW_S = 5.0
GATEWAY_CORE, LOAD_CORE = "0", "1"
BATCH = 16  # wrk reports answers in batches this size; the parent timestamps each batch

# Replace app.store.memory with another file before the app is built: `-c BOOT <file> serve ...`.
BOOT = """
import importlib.util, sys
import app.store, app.store.factory
path = sys.argv.pop(1)
spec = importlib.util.spec_from_file_location("app.store.memory", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.modules["app.store.memory"] = mod
app.store.MemoryStore = app.store.factory.MemoryStore = mod.MemoryStore
from app.cli import main
sys.exit(main())
"""

WRK_LUA = """
wrk.method = "POST"
wrk.body = %s
wrk.headers["Content-Type"] = "application/json"
%s
local ok, bad = 0, 0
response = function(status, headers, body)
  if status == 200 then ok = ok + 1 else bad = bad + 1 end
  if ok + bad >= %d then
    io.write(ok, " ", bad, "\\n")
    io.stdout:flush()
    ok, bad = 0, 0
  end
end
"""

# A prompt per request: "<head><counter><tail>" is the JSON body (one wrk thread, so the counter is unique).
WRK_DISTINCT = """
local n = 0
local head, tail = %s, %s
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, head .. n .. tail)
end
"""


@dataclass
class Window:
    """One window of one arm (redis-server's CPU and memory too, on the Redis arm)."""

    seconds: float
    ok: int
    bad: int
    cpu_s: float
    rss_mb: float
    store_cpu_s: float | None = None
    store_mb: float | None = None

    @property
    def rps(self) -> float:
        """Answers per second."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms(self) -> float:
        """Gateway CPU ms per answer."""
        return 1000 * self.cpu_s / self.ok if self.ok else float("nan")

    @property
    def store_cpu_ms(self) -> float:
        """redis-server CPU ms per answer (nan without Redis)."""
        return 1000 * self.store_cpu_s / self.ok if self.ok and self.store_cpu_s is not None else float("nan")


@dataclass
class Arm:
    """One arm's windows and wrk's closing summary."""

    name: str
    windows: list[Window] = field(default_factory=list)
    summary: str = ""
    concurrency: int = 0

    @property
    def ok(self) -> int:
        """Answers with status 200."""
        return sum(w.ok for w in self.windows)


@dataclass
class Load:
    """How one arm is driven: connections, window length, and when it stops."""

    concurrency: int
    window_s: float
    max_seconds: float
    requests: float = float("inf")
    distinct: bool = False  # a prompt of its own per request


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of a process (or another /proc status field: RssAnon is its heap), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class RedisProbe:
    """redis-server's pid and memory (through redis-cli), and the cleanup of one key prefix."""

    def __init__(self, url: str) -> None:
        self.cli = ["redis-cli", "-u", url]
        self.pid = int(self.info("server")["process_id"])

    def info(self, section: str) -> dict[str, str]:
        """One INFO section as a dict."""
        out = subprocess.run([*self.cli, "info", section], capture_output=True, text=True, check=True).stdout
        return dict(line.split(":", 1) for line in out.splitlines() if ":" in line)

    def used_mb(self) -> float:
        """Redis's used_memory, MiB."""
        return int(self.info("memory")["used_memory"]) / 2**20

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under `prefix` (SCAN, then DEL in batches); how many there were."""
        scan = subprocess.run([*self.cli, "--scan", "--pattern", prefix + "*"], capture_output=True, text=True,
                              check=True).stdout.split()
        for i in range(0, len(scan), 1000):
            subprocess.run([*self.cli, "del", *scan[i:i + 1000]], capture_output=True, check=True)
        return len(scan)


def git(*args: str) -> str:
    """Output of a git command in this checkout."""
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def default_baseline() -> str:
    """The parent of the commit that introduced the bounded store (HEAD if it is not committed yet)."""
    fix = git("log", "--format=%H", "--reverse", "-S", "class RecentIds", "--", "app/store/memory.py").split()
    return f"{fix[0]}^" if fix else "HEAD"


def embedded_config(upstream: str) -> dict[str, object]:
    """The embedded default config with every pool's replicas pointed at the instant upstream."""
    cfg: dict[str, object] = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    pools = cfg["pools"]
    assert isinstance(pools, dict)
    for pool in pools.values():
        pool["replicas"] = [upstream]
    return cfg


def wrk_script(model: str, distinct: bool) -> str:
    """The wrk Lua script: one fixed body, or a prompt per request (a shared system turn, a numbered user turn)."""
    if not distinct:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16})
        return WRK_LUA % (json.dumps(body), "", BATCH)
    msgs = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "question #\0: hello there"}]
    body = json.dumps({"model": model, "messages": msgs, "max_tokens": 16})
    head, tail = body.split("\\u0000")
    return WRK_LUA % (json.dumps(body), WRK_DISTINCT % (json.dumps(head), json.dumps(tail)), BATCH)


def run_arm(name: str, memory_file: Path | None, cfg_path: Path, load: Load, tmp: Path,
            redis: RedisProbe | None = None) -> Arm:
    """Start a gateway, load it with wrk in windows until the request or time bound, stop it."""
    port = free_port()
    boot = ["-c", BOOT, str(memory_file)] if memory_file else ["-c", "import sys; from app.cli import main; "
                                                                      "sys.exit(main())"]
    gw = Proc(f"gateway-{name}", f"http://127.0.0.1:{port}",
              ["taskset", "-c", GATEWAY_CORE, PY, *boot, "serve", "--config", str(cfg_path), "--port", str(port),
               "--log-level", "warning"], log=tmp / f"gateway-{name}.log").start()
    script = tmp / f"soak-{name}.lua"
    script.write_text(wrk_script(yaml.safe_load(cfg_path.read_text())["models"][0]["name"], load.distinct))
    arm = Arm(name, concurrency=load.concurrency)
    events: list[tuple[float, int, int]] = []
    tail: list[str] = []
    wrk = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{load.concurrency}", f"-d{int(load.max_seconds) + 10}s",
         "--timeout", "60s", "-s", str(script), gw.url + "/v1/chat/completions"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def read() -> None:
        assert wrk.stdout is not None
        for line in wrk.stdout:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                events.append((time.monotonic(), int(parts[0]), int(parts[1])))
            else:
                tail.append(line.rstrip())

    def store_cpu() -> float | None:
        return cpu_seconds(redis.pid) if redis else None

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        t0 = time.monotonic()
        start, cpu0, store0, seen, total = t0, cpu_seconds(gw.pid), store_cpu(), 0, 0
        done = False
        while not done:
            end = start + load.window_s
            while time.monotonic() < end:
                time.sleep(0.05)
                answered = total + sum(e[1] for e in events[seen:])
                if answered >= load.requests or time.monotonic() - t0 >= load.max_seconds or wrk.poll() is not None:
                    done = True
                    break
            now, cpu, store = time.monotonic(), cpu_seconds(gw.pid), store_cpu()
            batch = events[seen:]
            seen += len(batch)
            ok, bad = sum(e[1] for e in batch), sum(e[2] for e in batch)
            total += ok
            w = Window(now - start, ok, bad, cpu - cpu0, rss_mb(gw.pid),
                       None if store is None or store0 is None else store - store0,
                       redis.used_mb() if redis else None)
            arm.windows.append(w)
            extra = f"  redis {w.store_cpu_ms:5.3f} CPU ms/req {w.store_mb:6.1f} MiB" if redis else ""
            print(f"  {name:>6} {now - t0:6.1f}s  {w.rps:8.0f} req/s  {w.cpu_ms:7.3f} CPU ms/req"
                  f"  RSS {w.rss_mb:6.1f} MiB (anon {rss_mb(gw.pid, 'RssAnon'):6.1f})  total {total}"
                  f"  non-200 {bad}{extra}", flush=True)
            start, cpu0, store0 = now, cpu, store
    finally:
        if wrk.poll() is None:
            wrk.send_signal(signal.SIGINT)
            try:
                wrk.wait(30)
            except subprocess.TimeoutExpired:
                wrk.kill()
        reader.join(5)
        gw.stop()
    if not arm.ok:
        raise RuntimeError(f"{name}: no answers; wrk said: " + " / ".join(tail[-5:]))
    arm.summary = "; ".join(t.strip() for t in tail if re.search(r"requests in|Non-2xx|Socket errors", t))
    return arm


def cell(arm: Arm | None, i: int, fmt: str, attr: str) -> str:
    """One table cell, or '-' when that arm had stopped by window i."""
    if arm is None or i >= len(arm.windows):
        return "-"
    return format(getattr(arm.windows[i], attr), fmt)


def report(old: Arm | None, new: Arm | None) -> None:
    """The side-by-side table of windows, then each arm's totals."""
    print("\n| window | old req/s | new req/s | new/old | old CPU ms/req | new CPU ms/req "
          "| old RSS MiB | new RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = max(len(a.windows) for a in (old, new) if a is not None)
    for i in range(rows):
        ratio = "-"
        if old and new and i < len(old.windows) and i < len(new.windows) and old.windows[i].rps > 0:
            ratio = f"{new.windows[i].rps / old.windows[i].rps:.2f}x"
        print(f"| {i * WINDOW_S:.0f}-{(i + 1) * WINDOW_S:.0f} s "
              f"| {cell(old, i, '.0f', 'rps')} | {cell(new, i, '.0f', 'rps')} "
              f"| {ratio} | {cell(old, i, '.2f', 'cpu_ms')} | {cell(new, i, '.2f', 'cpu_ms')} "
              f"| {cell(old, i, '.0f', 'rss_mb')} | {cell(new, i, '.0f', 'rss_mb')} |")
    print("(an arm's last window ends when it reaches --requests; its rate is over the time it ran)")
    for arm in (old, new):
        if arm is None:
            continue
        secs = sum(w.seconds for w in arm.windows)
        cpu = sum(w.cpu_s for w in arm.windows)
        bad = sum(w.bad for w in arm.windows)
        rates = [w.rps for w in arm.windows if w.seconds >= WINDOW_S * 0.9]
        print(f"{arm.name}: {arm.ok} answers (+{bad} non-200) in {secs:.0f} s = {arm.ok / secs:.0f} req/s mean, "
              f"window min/max {min(rates, default=0):.0f}/{max(rates, default=0):.0f} req/s, "
              f"{1000 * cpu / max(arm.ok, 1):.2f} CPU ms/req; wrk: {arm.summary}")


@dataclass
class Batch:
    """One batch of settles on one arm's store."""

    settles: int
    cpu_s: float
    ids: int

    @property
    def cpu_us(self) -> float:
        """CPU µs per settle."""
        return 1e6 * self.cpu_s / self.settles if self.settles else float("nan")


async def store_arm(module: ModuleType, n: int, max_s: float, batch: int = 10_000) -> list[Batch]:
    """Settle up to `n` spend records on a fresh MemoryStore from `module`, timing CPU per batch."""
    store = module.MemoryStore()
    day = datetime.now(UTC).date().isoformat()
    out: list[Batch] = []
    start = time.process_time()
    done = 0
    while done < n and time.process_time() - start < max_s:
        t0, k = time.process_time(), 0
        while k < batch and time.process_time() - start < max_s:
            await store.settle(None, SpendRecord(uuid.uuid4().hex, "anonymous", day, "fast", 120, 8, 32, 16))
            k += 1
        out.append(Batch(k, time.process_time() - t0, len(store._seen)))
        done += k
    return out


def store_report(arms: dict[str, list[Batch]], batch: int = 10_000) -> None:
    """Per-batch CPU µs per settle, old vs new."""
    old, new = arms.get("old", []), arms.get("new", [])
    print("\n| settles | old µs/settle | new µs/settle | old/new | old ids kept | new ids kept |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i in range(max(len(old), len(new))):
        o, w = (old[i] if i < len(old) else None), (new[i] if i < len(new) else None)
        ratio = f"{o.cpu_us / w.cpu_us:.2f}x" if o and w and w.cpu_s > 0 else "-"
        print(f"| {i * batch}-{(i + 1) * batch} "
              f"| {f'{o.cpu_us:.1f}' if o else '-'} | {f'{w.cpu_us:.1f}' if w else '-'} "
              f"| {ratio} | {o.ids if o else '-'} | {w.ids if w else '-'} |")
    for name, rows in arms.items():
        n, cpu = sum(b.settles for b in rows), sum(b.cpu_s for b in rows)
        print(f"{name}: {n} settles in {cpu:.1f} CPU s = {1e6 * cpu / max(n, 1):.1f} µs/settle "
              f"(last batch {rows[-1].settles} settles)")


def load_module(path: Path) -> ModuleType:
    """Import a memory.py file under its own name (it imports app.store.base like the checkout's)."""
    spec = importlib.util.spec_from_file_location("memory_baseline", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def calibrate(cfg_path: Path, levels: list[int], tmp: Path) -> int:
    """The concurrency (of `levels`) at which a fresh gateway answers the most per second (after 5 s warm-up)."""
    rates: dict[int, float] = {}
    for c in levels:
        arm = run_arm(f"c{c}", None, cfg_path, Load(c, WINDOW_S, 3 * WINDOW_S, distinct=True), tmp)
        warm = arm.windows[1:] or arm.windows
        rates[c] = sum(w.ok for w in warm) / sum(w.seconds for w in warm)
    best = max(rates, key=lambda c: rates[c])
    print("\n| concurrency | req/s (5-15 s) |\n|---:|---:|")
    for c, r in rates.items():
        print(f"| {c}{' (soak)' if c == best else ''} | {r:.0f} |")
    return best


def flat(values: list[float], tolerance: float = 0.10) -> tuple[float, bool]:
    """The largest |v / v[0] - 1| over `values`, and whether it is within `tolerance`."""
    worst = max((abs(v / values[0] - 1) for v in values[1:]), default=0.0) if values and values[0] else float("nan")
    return worst, worst <= tolerance


def soak_report(arm: Arm, window_s: float) -> None:
    """One arm's table per window with each value's ratio to the first window, then the flatness verdict."""
    full = [w for w in arm.windows if w.seconds >= 0.9 * window_s]
    redis = any(w.store_cpu_s is not None for w in full)
    head = "| window s | req/s | x w1 | gateway CPU ms/req | x w1 | RSS MiB | x w1 | non-200 |"
    rule = "|---:|---:|---:|---:|---:|---:|---:|---:|"
    if redis:
        head += " redis CPU ms/req | x w1 | redis MiB |"
        rule += "---:|---:|---:|"
    print(f"\n{arm.name} (c={arm.concurrency}, {window_s:.0f} s windows)\n{head}\n{rule}")
    m1 = full[0]
    for i, w in enumerate(full):
        row = (f"| {i * window_s:.0f}-{(i + 1) * window_s:.0f} | {w.rps:.0f} | {w.rps / m1.rps:.2f} "
               f"| {w.cpu_ms:.3f} | {w.cpu_ms / m1.cpu_ms:.2f} "
               f"| {w.rss_mb:.0f} | {w.rss_mb / m1.rss_mb:.2f} | {w.bad} |")
        if redis:
            row += f" {w.store_cpu_ms:.3f} | {w.store_cpu_ms / m1.store_cpu_ms:.2f} | {w.store_mb:.0f} |"
        print(row)
    verdicts = []
    series = {"req/s": [w.rps for w in full], "CPU/req": [w.cpu_ms for w in full], "RSS": [w.rss_mb for w in full]}
    if redis:
        series["redis CPU/req"] = [w.store_cpu_ms for w in full]
    for label, values in series.items():
        worst, ok = flat(values)
        verdicts.append(f"{label} {'flat' if ok else 'NOT flat'} (worst {worst:.1%} from window 1)")
    total_s = sum(w.seconds for w in full)
    print(f"{arm.name}: {sum(w.ok for w in full)} answers in {total_s:.0f} s, "
          f"{sum(w.bad for w in full)} non-200; " + "; ".join(verdicts) + f"; wrk: {arm.summary}")


def soak(args: argparse.Namespace, cfg: dict[str, object], tmp: Path) -> None:
    """Calibrate the concurrency, then run each store's arm for `--soak` minutes and print its table."""
    cfg_path = tmp / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    levels = [int(c) for c in args.calibrate.split(",")] if args.calibrate else [args.concurrency]
    print(f"soak: checkout {git('rev-parse', '--short', 'HEAD').strip()}, arms {args.arms}, "
          f"{args.soak:g} min each; {os.uname().nodename}; uptime: {os.getloadavg()}", flush=True)
    c = calibrate(cfg_path, levels, tmp) if len(levels) > 1 else levels[0]
    load = Load(c, args.window, args.soak * 60, distinct=True)
    results = []
    for name in args.arms.split(","):
        if name == "memory":
            results.append(run_arm(name, None, cfg_path, load, tmp))
            continue
        if name != "redis":
            raise SystemExit(f"--soak runs the arms memory and redis, not {name!r}")
        probe = RedisProbe(args.redis_url)
        prefix = f"kvgate-soak-{uuid.uuid4().hex[:8]}:"
        rcfg = dict(cfg, store={"url": args.redis_url, "key_prefix": prefix})
        rpath = tmp / "gateway-redis.yaml"
        rpath.write_text(yaml.safe_dump(rcfg))
        try:
            results.append(run_arm(name, None, rpath, load, tmp, probe))
        finally:
            print(f"  deleted {probe.delete_prefix(prefix)} keys under {prefix}", flush=True)
    for arm in results:
        soak_report(arm, args.window)
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


def main() -> None:
    """Run the arms once each and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200_000, help="stop an arm after this many answers")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=180.0, help="stop an arm after this long regardless")
    ap.add_argument("--baseline", default=None, help="git revision of the old app/store/memory.py")
    ap.add_argument("--arms", default="old,new")
    ap.add_argument("--store-only", action="store_true", help="time the store alone, in this process")
    ap.add_argument("--soak", type=float, default=None, metavar="MINUTES",
                    help="soak each store's arm this long (arms memory,redis unless --arms says otherwise)")
    ap.add_argument("--window", type=float, default=60.0, help="--soak: window length, s")
    ap.add_argument("--calibrate", default="16,32,64,128",
                    help="--soak: concurrencies tried first, the fastest is used ('' to use --concurrency)")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="--soak: the Redis arm's server")
    args = ap.parse_args()
    if args.soak is not None and args.arms == "old,new":
        args.arms = "memory,redis"
    arms = args.arms.split(",")
    baseline = args.baseline or default_baseline()
    with tempfile.TemporaryDirectory(prefix="kvgate-soak-") as d:
        tmp = Path(d)
        old_file = tmp / "memory_old.py"
        old_file.write_text(git("show", f"{baseline}:app/store/memory.py"))
        if args.store_only:
            import app.store.memory as current

            print(f"store only: baseline {baseline} vs checkout; {args.requests} settles or "
                  f"{args.max_seconds:.0f} CPU s per arm", flush=True)
            modules = {"old": load_module(old_file), "new": current}
            store_report({a: asyncio.run(store_arm(modules[a], args.requests, args.max_seconds)) for a in arms})
            return
        up_port = free_port()
        upstream = Proc("upstream", f"http://127.0.0.1:{up_port}",
                        ["taskset", "-c", LOAD_CORE, PY, str(ROOT / "experiments" / "instant_upstream.py"),
                         str(up_port)]).start(any_status=True)
        if args.soak is not None:
            try:
                soak(args, embedded_config(upstream.url), tmp)
            finally:
                upstream.stop()
            return
        cfg_path = tmp / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(embedded_config(upstream.url)))
        load = Load(args.concurrency, WINDOW_S, args.max_seconds, args.requests)
        print(f"baseline {baseline} ({git('rev-parse', '--short', baseline).strip()}) vs checkout "
              f"{git('rev-parse', '--short', 'HEAD').strip()}; {args.requests} requests or {args.max_seconds:.0f} s "
              f"per arm at c={args.concurrency}", flush=True)
        results: dict[str, Arm] = {}
        try:
            for name in arms:
                results[name] = run_arm(name, old_file if name == "old" else None, cfg_path, load, tmp)
        finally:
            upstream.stop()
        report(results.get("old"), results.get("new"))


if __name__ == "__main__":
    main()
