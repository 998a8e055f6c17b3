"""Gateway overhead on real agent bodies (30-140 KB, tests/fixtures/agents: Claude Code, Codex, opencode, Qwen
Code): this tree against another checkout, side by side, over one instant upstream (experiments/instant_upstream.py).

Per client, every captured generation request is sent `--repeats` times, alternating: straight to the upstream,
through the gateway of this tree, through the gateway of `--baseline` (each a `kvgate serve` of one worker with a
tenant whose normalize mode is `--normalize`). Added latency = through - straight for the same body, same round;
the table gives the median per client and gateway and their ratio. Streams are read to the end. Beside it, the
gateway process's own CPU (utime+stime from /proc/<pid>/stat) per request over the same rounds: on a loaded machine
the latency column carries the neighbours' noise, the CPU column does not.

Claude Code's bodies carry a system turn inside `messages`, which kvgate before issue 21 refused (400): the
`claude-user` rows send them with that turn as a user turn, the same work for both gateways; the `claude` rows
are the real bodies (the baseline's column is its 400).

    git -C /work/main worktree add /tmp/al-base 73924d6
    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/agents_lab/overhead.py --baseline /tmp/al-base \
        [--repeats 15] [--normalize on]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from procs import Proc, free_port  # noqa: E402
from run import API_KEY, MODEL, PY, ROOT, gateway_cfg, start_gateway  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "agents"
SKIP = {"host", "content-length", "connection", "accept-encoding", "authorization", "x-api-key"}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process, in seconds (the gateway is one worker: one process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def bodies(client: str, *, system_as_user: bool = False) -> list[dict[str, Any]]:
    """The client's captured generation requests (path, headers, body)."""
    out = []
    for line in (FIXTURES / f"{client}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if not rec.get("api") or not isinstance(rec.get("body"), dict):
            continue
        # 16 output tokens: the instant upstream streams one event per token, and the bodies ask up to 32000.
        body = {**rec["body"], "max_output_tokens" if rec["api"] == "responses" else "max_tokens": 16}
        if system_as_user:
            body = {**body, "messages": [
                {**m, "role": "user"} if m.get("role") == "system" else m for m in body["messages"]]}
        out.append({"path": rec["path"], "api": rec["api"], "body": body, "bytes": len(json.dumps(body)),
                    "headers": {k: v for k, v in rec["headers"].items() if k.lower() not in SKIP}})
    return out


def send(client: httpx.Client, base: str, req: dict[str, Any]) -> tuple[float, int]:
    """Seconds to the last byte, and the status."""
    headers = dict(req["headers"])
    if req["api"] == "messages":
        headers["x-api-key"] = API_KEY
    else:
        headers["authorization"] = f"Bearer {API_KEY}"
    t0 = time.perf_counter()
    with client.stream("POST", base + req["path"], json=req["body"], headers=headers) as r:
        for _ in r.iter_raw():
            pass
        status = r.status_code
    return time.perf_counter() - t0, status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="a checkout of the tree to compare against")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--normalize", default="on", choices=["off", "on"])
    p.add_argument("--out", type=Path, default=Path("/work/agents-captures/overhead"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    upstream = Proc("instant", f"http://127.0.0.1:{port}", [PY, str(HERE.parent / "instant_upstream.py"), str(port)],
                    log=args.out / "instant.log").start("/health")
    procs = [upstream]
    try:
        cfg = gateway_cfg([upstream.url], args.normalize)
        cfg["pools"]["main"]["served_model"] = "m"
        cfg["models"] = [{"name": MODEL, "pools": ["main"]}]
        gws = {"this": start_gateway(args.out, "gw-this", cfg),
               "base": start_gateway(args.out, "gw-base", cfg, args.baseline)}
        procs += gws.values()
        sets = {"claude": bodies("claude"), "claude-user": bodies("claude", system_as_user=True),
                "codex": bodies("codex"), "opencode": bodies("opencode"), "qwen": bodies("qwen")}
        rows = []
        with httpx.Client(timeout=60) as client:
            for name, reqs in sets.items():
                added: dict[str, list[float]] = {"this": [], "base": []}
                status: dict[str, set[int]] = {"this": set(), "base": set()}
                cpu0 = {g: cpu_seconds(proc.pid) for g, proc in gws.items()}
                for _ in range(args.repeats):
                    for req in reqs:
                        direct, _ = send(client, upstream.url, req)
                        for g, proc in gws.items():
                            secs, st = send(client, proc.url, req)
                            added[g].append(secs - direct)
                            status[g].add(st)
                sent = args.repeats * len(reqs)
                cpu = {g: (cpu_seconds(proc.pid) - cpu0[g]) / sent for g, proc in gws.items()}
                sizes = [r["bytes"] for r in reqs]
                this, base = statistics.median(added["this"]), statistics.median(added["base"])
                rows.append((name, len(reqs), min(sizes), max(sizes), base, this, cpu, status))
        print(f"gateway overhead, added latency per request (median of {args.repeats} rounds x every body), "
              f"normalize {args.normalize}; baseline {args.baseline}\n")
        print("| bodies | requests | size | latency base ms | this ms | this / base | CPU base ms/req | this ms/req "
              "| this / base | status base / this |")
        print("|---|--:|---|--:|--:|--:|--:|--:|--:|---|")
        for name, n, lo, hi, base, this, cpu, status in rows:
            ratio = this / base if base > 0 else float("nan")
            cpu_ratio = cpu["this"] / cpu["base"] if cpu["base"] > 0 else float("nan")
            print(f"| {name} | {n} | {lo // 1000}-{hi // 1000} KB | {1000 * base:.2f} | {1000 * this:.2f} | "
                  f"{ratio:.2f} | {1000 * cpu['base']:.2f} | {1000 * cpu['this']:.2f} | {cpu_ratio:.2f} | "
                  f"{sorted(status['base'])} / {sorted(status['this'])} |")
    finally:
        for proc in reversed(procs):
            proc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
