"""Soak of the default gateway (embedded config, in-memory store): old vs new MemoryStore, side by side.

Each arm is a real `kvgate serve` on the embedded config (config/local.yaml) with both pools pointed at
experiments/instant_upstream.py, driven by wrk (one thread, `--concurrency` connections, non-streaming
chat, anonymous: every request settles one spend record) until `--requests` answers or `--max-seconds`.
The arms differ only in app/store/memory.py: "old" loads it from `--baseline` (a git revision; default
the parent of the commit that introduced the bounded store) into the gateway process in place of the
checkout's, "new" is the checkout. The gateway runs alone on core 0, the upstream and wrk on core 1.

Every 5-second window prints answers/s (counted by wrk as they arrive), the gateway's CPU ms per answer
(its own utime+stime) and its RSS; then a table of windows: old req/s, new req/s, new/old ratio.

    .venv/bin/python experiments/memory_store_soak.py [--requests 200000] [--concurrency 64]
        [--max-seconds 180] [--baseline REV] [--arms old,new]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from procs import Proc, free_port

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


@dataclass
class Window:
    """One 5-second window of one arm."""

    seconds: float
    ok: int
    bad: int
    cpu_s: float
    rss_mb: float

    @property
    def rps(self) -> float:
        """Answers per second."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms(self) -> float:
        """Gateway CPU ms per answer."""
        return 1000 * self.cpu_s / self.ok if self.ok else float("nan")


@dataclass
class Arm:
    """One arm's windows and wrk's closing summary."""

    name: str
    windows: list[Window] = field(default_factory=list)
    summary: str = ""

    @property
    def ok(self) -> int:
        """Answers with status 200."""
        return sum(w.ok for w in self.windows)


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


def run_arm(name: str, memory_file: Path | None, cfg_path: Path, args: argparse.Namespace, tmp: Path) -> Arm:
    """Start a gateway, load it with wrk in windows until the request or time bound, stop it."""
    port = free_port()
    boot = ["-c", BOOT, str(memory_file)] if memory_file else ["-c", "import sys; from app.cli import main; "
                                                                      "sys.exit(main())"]
    gw = Proc(f"gateway-{name}", f"http://127.0.0.1:{port}",
              ["taskset", "-c", GATEWAY_CORE, PY, *boot, "serve", "--config", str(cfg_path), "--port", str(port),
               "--log-level", "warning"], log=tmp / f"gateway-{name}.log").start()
    model = yaml.safe_load(cfg_path.read_text())["models"][0]["name"]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16})
    script = tmp / "soak.lua"
    script.write_text(WRK_LUA % (json.dumps(body), BATCH))
    arm = Arm(name)
    events: list[tuple[float, int, int]] = []
    tail: list[str] = []
    wrk = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{args.concurrency}", f"-d{int(args.max_seconds) + 10}s",
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

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        t0 = time.monotonic()
        start, cpu0, seen, total = t0, cpu_seconds(gw.pid), 0, 0
        done = False
        while not done:
            end = start + WINDOW_S
            while time.monotonic() < end:
                time.sleep(0.05)
                answered = total + sum(e[1] for e in events[seen:])
                if answered >= args.requests or time.monotonic() - t0 >= args.max_seconds or wrk.poll() is not None:
                    done = True
                    break
            now, cpu = time.monotonic(), cpu_seconds(gw.pid)
            batch = events[seen:]
            seen += len(batch)
            ok, bad = sum(e[1] for e in batch), sum(e[2] for e in batch)
            total += ok
            w = Window(now - start, ok, bad, cpu - cpu0, rss_mb(gw.pid))
            arm.windows.append(w)
            print(f"  {name:>4} {now - t0:5.1f}s  {w.rps:8.0f} req/s  {w.cpu_ms:7.2f} CPU ms/req"
                  f"  RSS {w.rss_mb:6.1f} MiB  total {total}", flush=True)
            start, cpu0 = now, cpu
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


def main() -> None:
    """Run the arms once each and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200_000, help="stop an arm after this many answers")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=180.0, help="stop an arm after this long regardless")
    ap.add_argument("--baseline", default=None, help="git revision of the old app/store/memory.py")
    ap.add_argument("--arms", default="old,new")
    args = ap.parse_args()
    arms = args.arms.split(",")
    baseline = args.baseline or default_baseline()
    with tempfile.TemporaryDirectory(prefix="kvgate-soak-") as d:
        tmp = Path(d)
        old_file = tmp / "memory_old.py"
        old_file.write_text(git("show", f"{baseline}:app/store/memory.py"))
        up_port = free_port()
        upstream = Proc("upstream", f"http://127.0.0.1:{up_port}",
                        ["taskset", "-c", LOAD_CORE, PY, str(ROOT / "experiments" / "instant_upstream.py"),
                         str(up_port)]).start(any_status=True)
        cfg_path = tmp / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(embedded_config(upstream.url)))
        print(f"baseline {baseline} ({git('rev-parse', '--short', baseline).strip()}) vs checkout "
              f"{git('rev-parse', '--short', 'HEAD').strip()}; {args.requests} requests or {args.max_seconds:.0f} s "
              f"per arm at c={args.concurrency}", flush=True)
        results: dict[str, Arm] = {}
        try:
            for name in arms:
                results[name] = run_arm(name, old_file if name == "old" else None, cfg_path, args, tmp)
        finally:
            upstream.stop()
        report(results.get("old"), results.get("new"))


if __name__ == "__main__":
    main()
