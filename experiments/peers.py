"""Gateway overhead against peers, side by side in one run: kvgate vs a bare pass-through vs LiteLLM proxy.

Every proxy runs one worker pinned to core 0 (taskset) in front of the same instant upstream
(experiments/instant_upstream.py); the upstream and the load generator share core 1. Per proxy and mode
(non-streaming, 16-chunk and 128-chunk streams) it measures, repeated --repeats times, median reported:

- CPU ms per request: utime+stime of the proxy process and its children over a drained closed loop
  (--cpu-concurrency workers that stop issuing at the deadline and finish what is in flight), divided by
  the requests it answered. The robust figure: other people's jobs on the machine change wall-clock
  numbers, not the CPU a request costs.
- req/s at --concurrency (wrk closed loop), and the CPU-bound ceiling 1000 / CPU-ms (what one dedicated
  core would give). The loaded run also records how busy core 0 (proxy) and core 1 (upstream + load) were,
  so a run limited by the load side or by a neighbour is visible in the table instead of hidden.
- p50 latency at concurrency 1, minus the upstream's own p50 (direct, same client) = added p50.

The same modes run on the agent surfaces too (--surfaces): POST /v1/responses (`input`, `max_output_tokens`)
and POST /v1/messages (Anthropic: `x-api-key`, `anthropic-version`, `max_tokens`), answered by the instant
upstream in vLLM 0.32's shapes. Those modes are named `responses/<mode>` and `messages/<mode>`; they run on
the pass-through (it relays bytes, whatever the path) and the kvgate variants, not on LiteLLM (its
/v1/messages translates to chat completions for an OpenAI-compatible backend, so it would not be the same
work). A second table lists them, a third the CPU per request of each surface over chat's, per mode.

The load generator is `wrk` (C, one thread) when installed, so the client costs little of core 1;
otherwise experiments/overhead.py's aiohttp loop. LiteLLM comes from its own venv (scripts/peer-venvs.sh litellm).

    scripts/peer-venvs.sh litellm
    apt-get install wrk   # optional, recommended: a C load generator
    .venv/bin/python experiments/peers.py [--seconds 6] [--concurrency 64] [--repeats 3] [--json samples.json]
        [--surfaces chat,responses,messages] [--modes non-stream,stream-16,stream-128]
        [--compare-checkout /tmp/kv-before [--compare-drop-anonymous-keys]]   # before/after in one run
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import MODES, PY, ROOT, TICKS, gateway_config, p50
from procs import Proc, free_port

CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache/kvgate"))
LITELLM_VENV = CACHE / "litellm-venv"
KEY = "sk-bench"
PROXY_CORE, LOAD_CORE = "0", "1"
SURFACES = ("chat", "responses", "messages")
ANTHROPIC_VERSION = "2023-06-01"

_WRK_LUA = """
wrk.method = "POST"
wrk.body = %s
wrk.headers["Content-Type"] = "application/json"
%s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests":%%d,"duration_us":%%d,"p50_us":%%d,"status_errors":%%d,' ..
    '"socket_errors":%%d}\\n', summary.requests, summary.duration, latency:percentile(50), e.status,
    e.connect + e.read + e.write + e.timeout))
end
"""


def tree_cpu_seconds(pid: int) -> float:
    """utime+stime of a process, its reaped children (cutime+cstime) and its live descendants, in seconds."""
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    total += sum(int(f) for f in fields[11:15]) / TICKS
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        total += sum(tree_cpu_seconds(int(k)) for k in kids)
    return total


def start_server(cmd: list[str], port: int, core: str, log: Path, env: dict[str, str | None] | None = None,
                 timeout: float = 120.0) -> Proc:
    """Start a server pinned to `core` (env values of None unset a variable); ready once it answers HTTP at all."""
    full = {**os.environ, **(env or {})}
    ready = "/health/liveliness" if "litellm" in cmd[0] else "/health"
    # Output goes to a file, not a pipe nobody reads: a chatty server would block on a full pipe.
    log.unlink(missing_ok=True)
    proc = Proc(cmd[0], f"http://127.0.0.1:{port}", ["taskset", "-c", core, *cmd], log=log,
                env={k: v for k, v in full.items() if v is not None})
    try:
        return proc.start(ready, timeout, any_status=True)
    except RuntimeError as err:
        proc.stop()
        raise RuntimeError(f"{cmd} did not start: {log.read_text()[-3000:]}") from err


def litellm_config(upstream: str) -> dict[str, object]:
    """LiteLLM proxy config: one openai-compatible model on the instant upstream, master key, no database."""
    return {
        "model_list": [{"model_name": "m", "litellm_params": {
            "model": "openai/m", "api_base": upstream + "/v1", "api_key": "none"}}],
        "general_settings": {"master_key": KEY},
        "litellm_settings": {"telemetry": False},
    }


def litellm_env() -> dict[str, str | None]:
    """Offline settings: the cost map from the package, no telemetry, quiet logs, no database."""
    return {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR",
            "DISABLE_SCHEMA_UPDATE": "True", "DATABASE_URL": None, "HF_HUB_OFFLINE": "1", "NO_PROXY": "*"}


@dataclass
class Run:
    """One closed-loop run's raw figures."""

    ok: int
    seconds: float
    p50_ms: float
    errors: int
    proxy_cpu: float = 0.0
    side_cpu: float = 0.0  # upstream + load generator, both on LOAD_CORE


def split_mode(mode: str) -> tuple[str, str]:
    """`responses/stream-16` -> (surface, chat mode); a bare chat mode name is the chat surface."""
    surface, _, base = mode.rpartition("/")
    return surface or "chat", base


def _chat_body(stream: bool, tokens: int) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": tokens,
            "stream": stream}


def _responses_body(stream: bool, tokens: int) -> dict[str, object]:
    return {"model": "m", "input": "hello there", "max_output_tokens": tokens, "stream": stream}


def _messages_body(stream: bool, tokens: int) -> dict[str, object]:
    return {"model": "m", "max_tokens": tokens, "messages": [{"role": "user", "content": "hello there"}],
            "stream": stream}


# surface -> (path, body for (stream, tokens)); the same prompt and output length on every surface.
_SURFACE_REQUESTS: dict[str, tuple[str, Callable[[bool, int], dict[str, object]]]] = {
    "chat": ("/v1/chat/completions", _chat_body),
    "responses": ("/v1/responses", _responses_body),
    "messages": ("/v1/messages", _messages_body),
}


def body_for(mode: str) -> bytes:
    """The request body every proxy gets in `mode`."""
    surface, base = split_mode(mode)
    stream, tokens = MODES[base]
    return orjson.dumps(_SURFACE_REQUESTS[surface][1](stream, tokens))


def path_for(mode: str) -> str:
    """The request path of `mode`'s surface."""
    return _SURFACE_REQUESTS[split_mode(mode)[0]][0]


def headers_for(mode: str) -> dict[str, str]:
    """Request headers: Bearer auth, or what the Anthropic SDK sends on Messages (x-api-key, anthropic-version)."""
    if split_mode(mode)[0] == "messages":
        return {"content-type": "application/json", "x-api-key": KEY, "anthropic-version": ANTHROPIC_VERSION}
    return {"content-type": "application/json", "authorization": f"Bearer {KEY}"}


def _wrk_headers(mode: str) -> str:
    lines = []
    for name, value in headers_for(mode).items():
        if name != "content-type":
            title = "-".join(part.capitalize() for part in name.split("-"))
            lines.append(f'wrk.headers["{title}"] = "{value}"')
    return "\n".join(lines)


async def load(url: str, mode: str, concurrency: int, seconds: float) -> tuple[int, list[float], int]:
    """Closed loop (experiments/overhead.py's, on any surface): `concurrency` workers for `seconds`, then drain;
    returns (ok count, latencies, errors)."""
    body = body_for(mode)
    headers = headers_for(mode)
    target = url + path_for(mode)
    lat: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                try:
                    async with s.post(target, data=body, headers=headers) as r:
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


def run_wrk(url: str, mode: str, concurrency: int, seconds: float, tmp: Path, core: str = LOAD_CORE) -> Run:
    """One wrk run pinned to `core`; returns its counts and the client's own CPU seconds in side_cpu."""
    script = tmp / f"{mode.replace('/', '-')}.lua"
    script.write_text(_WRK_LUA % (json.dumps(body_for(mode).decode()), _wrk_headers(mode)))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["taskset", "-c", core, "wrk", "-t1", f"-c{concurrency}", f"-d{seconds:.0f}s",
                          "--timeout", "30s", "-s", str(script), url + path_for(mode)],
                         capture_output=True, text=True, check=True, timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    client_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Run(ok=doc["requests"] - doc["status_errors"], seconds=doc["duration_us"] / 1e6,
               p50_ms=doc["p50_us"] / 1000, errors=doc["status_errors"] + doc["socket_errors"],
               side_cpu=client_cpu)


def run_python(url: str, mode: str, concurrency: int, seconds: float) -> Run:
    """One run with overhead.py's aiohttp loop (in this process, which sits on LOAD_CORE)."""
    before = time.process_time()
    t0 = time.perf_counter()
    n, lat, errors = asyncio.run(load(url, mode, concurrency, seconds))
    return Run(ok=n, seconds=time.perf_counter() - t0, p50_ms=1000 * p50(lat), errors=errors,
               side_cpu=time.process_time() - before)


@dataclass
class Bench:
    """Settings and the upstream shared by every measurement."""

    args: argparse.Namespace
    upstream: Proc
    tmp: Path
    results: dict[tuple[str, str], list[dict[str, float]]] = field(default_factory=dict)

    def one(self, url: str, mode: str, concurrency: int, seconds: float, proxy: Proc | None,
            loader: str | None = None) -> Run:
        """A run with CPU accounting of the proxy (core 0) and of the upstream + client (core 1)."""
        p0 = tree_cpu_seconds(proxy.pid) if proxy else 0.0
        u0 = tree_cpu_seconds(self.upstream.pid)
        if (loader or self.args.loader) == "wrk":
            run = run_wrk(url, mode, concurrency, seconds, self.tmp)
        else:
            run = run_python(url, mode, concurrency, seconds)
        run.proxy_cpu = (tree_cpu_seconds(proxy.pid) - p0) if proxy else 0.0
        run.side_cpu += tree_cpu_seconds(self.upstream.pid) - u0
        return run

    def measure(self, name: str, proxy: Proc | None, url: str, mode: str) -> None:
        """Warm-up, a loaded run (req/s), a drained run (CPU/request) and a concurrency-1 run (p50)."""
        a = self.args
        self.one(url, mode, 4, 1, proxy)
        loaded = self.one(url, mode, a.concurrency, a.seconds, proxy)
        # CPU per request needs a run that ends with no request half done: wrk stops mid-flight, and a
        # proxy as slow as LiteLLM on 128-chunk streams would otherwise be charged for up to `concurrency`
        # unfinished requests. The aiohttp loop stops issuing at the deadline and waits for what is in flight.
        drained = self.one(url, mode, a.cpu_concurrency, a.seconds_cpu, proxy, "python") if proxy else loaded
        single = self.one(url, mode, 1, a.seconds_c1, proxy)
        if single.ok < 5:  # slower than seconds_c1 / 5 per request: take a drained run with a few requests
            single = self.one(url, mode, 1, 3 * a.seconds_c1, proxy, "python")
        sample = {"cpu_ms": 1000 * drained.proxy_cpu / max(drained.ok, 1), "rps": loaded.ok / loaded.seconds,
                  "p50_ms": single.p50_ms, "errors": float(loaded.errors + drained.errors + single.errors),
                  "core0": loaded.proxy_cpu / loaded.seconds, "core1": loaded.side_cpu / loaded.seconds,
                  "n_cpu": float(drained.ok), "n_c1": float(single.ok)}
        self.results.setdefault((name, mode), []).append(sample)
        print(f"  {name:<12} {mode:<10} cpu {sample['cpu_ms']:.3f} ms/req (n={drained.ok})  "
              f"{sample['rps']:.0f} req/s  p50(c=1) {sample['p50_ms']:.2f} ms (n={single.ok})  "
              f"core0 {sample['core0']:.2f} core1 {sample['core1']:.2f}  errors {sample['errors']:.0f}", flush=True)

    def median(self, name: str, mode: str) -> dict[str, float]:
        """Per-figure median over the repeats."""
        samples = self.results[(name, mode)]
        return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def start_proxies(args: argparse.Namespace, upstream: Proc, tmp: Path, procs: dict[str, Proc]) -> None:
    """The pass-through, the kvgate variants and LiteLLM, each pinned to PROXY_CORE, added to `procs` as they
    start (so the caller can stop those already running when a later one fails)."""
    port = free_port()
    procs["passthrough"] = start_server([PY, str(ROOT / "experiments/passthrough.py"), str(port), upstream.url], port,
                                        PROXY_CORE, tmp / "passthrough.log")
    for variant in args.variants.split(","):
        port = free_port()
        cfg = gateway_config(upstream.url, variant)
        path = tmp / f"{variant}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        procs[variant] = start_server([PY, "-m", "app.cli", "serve", "--config", str(path), "--port", str(port)],
                                      port, PROXY_CORE, tmp / f"{variant}.log")
    if args.compare_checkout:
        # The same variants from another checkout (e.g. a `git worktree` of an older commit), interleaved with
        # these in every repeat, so a neighbour's load hits both alike. Its `app` package is imported first.
        other = str(args.compare_checkout.resolve())
        boot = (f"import sys; sys.path[:0] = [{other!r}]; import app; assert app.__file__.startswith({other!r}); "
                "from app.cli import main; sys.exit(main())")
        for variant in args.variants.split(","):
            port = free_port()
            cfg = gateway_config(upstream.url, variant)
            if args.compare_drop_anonymous_keys:
                cfg["auth"].pop("anonymous_keys", None)  # type: ignore[attr-defined]
            path = tmp / f"{variant}@compare.yaml"
            path.write_text(yaml.safe_dump(cfg))
            procs[f"{variant}@{args.compare_checkout.name}"] = start_server(
                [PY, "-c", boot, "serve", "--config", str(path), "--port", str(port)], port, PROXY_CORE,
                tmp / f"{variant}@compare.log")
    if not args.no_litellm:
        exe = LITELLM_VENV / "bin/litellm"
        if not exe.exists():
            raise SystemExit(f"{exe} missing: run scripts/peer-venvs.sh litellm (or pass --no-litellm)")
        port = free_port()
        path = tmp / "litellm.yaml"
        path.write_text(yaml.safe_dump(litellm_config(upstream.url)))
        procs["litellm"] = start_server([str(exe), "--config", str(path), "--host", "127.0.0.1", "--port", str(port),
                                         "--num_workers", "1"], port, PROXY_CORE, tmp / "litellm.log",
                                        env=litellm_env(), timeout=240)


def table(bench: Bench, names: list[str], modes: list[str]) -> str:
    """Markdown table of medians with ratios against the pass-through (CPU) and LiteLLM (req/s)."""
    c = bench.args.concurrency
    lines = [f"| proxy | mode | CPU ms/req | x pass-through CPU | req/s (c={c}) | x LiteLLM req/s | ceiling req/s "
             "(1000/CPU-ms) | x LiteLLM ceiling | p50 ms (c=1) | added p50 ms | core0 / core1 busy | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in modes:
        direct = bench.median("upstream", mode)
        base = bench.median("passthrough", mode)
        lite = bench.median("litellm", mode) if "litellm" in names else None
        for name in names:
            r = bench.median(name, mode)
            x_cpu = r["cpu_ms"] / base["cpu_ms"]
            x_rps = f"{r['rps'] / lite['rps']:.1f}" if lite else "-"
            x_ceil = f"{lite['cpu_ms'] / r['cpu_ms']:.1f}" if lite else "-"
            lines.append(f"| {name} | {mode} | {r['cpu_ms']:.3f} | {x_cpu:.2f} | {r['rps']:.0f} | {x_rps} | "
                         f"{1000 / r['cpu_ms']:.0f} | {x_ceil} | {r['p50_ms']:.2f} | "
                         f"{r['p50_ms'] - direct['p50_ms']:.2f} | {r['core0']:.2f} / {r['core1']:.2f} | "
                         f"{r['errors']:.0f} |")
        lines.append(f"| upstream (direct) | {mode} | - | - | {direct['rps']:.0f} | - | - | - | "
                     f"{direct['p50_ms']:.2f} | 0 | - / {direct['core1']:.2f} | {direct['errors']:.0f} |")
    return "\n".join(lines)


def surfaces_table(bench: Bench, names: list[str], modes: list[str], surfaces: list[str]) -> str:
    """CPU per request of each agent surface over chat's, per proxy and chat mode (1.00 = as cheap as chat)."""
    others = [s for s in surfaces if s != "chat"]
    head = "| proxy | mode | chat CPU ms/req | " + " | ".join(f"{s} CPU ms/req | {s} / chat" for s in others) + " |"
    lines = [head, "|---|---|---:|" + "---:|---:|" * len(others)]
    for mode in modes:
        for name in names:
            chat = bench.median(name, mode)["cpu_ms"]
            cells = []
            for surface in others:
                cpu = bench.median(name, f"{surface}/{mode}")["cpu_ms"]
                cells.append(f"{cpu:.3f} | {cpu / chat:.2f}")
            lines.append(f"| {name} | {mode} | {chat:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    """Start everything, measure every proxy x mode --repeats times (interleaved), print the median table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="closed-loop run length at --concurrency")
    ap.add_argument("--seconds-cpu", type=float, default=5.0, help="drained run length for CPU/request")
    ap.add_argument("--seconds-c1", type=float, default=3.0, help="run length at concurrency 1")
    ap.add_argument("--concurrency", type=int, default=64, help="closed-loop concurrency for max req/s")
    ap.add_argument("--cpu-concurrency", type=int, default=8, help="concurrency of the drained CPU run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="kvgate-full,kvgate", help="kvgate variants (see experiments/overhead.py)")
    ap.add_argument("--modes", default=",".join(MODES), help="chat modes, run on every surface")
    ap.add_argument("--surfaces", default=",".join(SURFACES),
                    help="chat, responses, messages (the last two on the pass-through and kvgate only)")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--compare-checkout", type=Path,
                    help="also run the kvgate variants from this checkout (chat only), named <variant>@<dir name>")
    ap.add_argument("--compare-drop-anonymous-keys", action="store_true",
                    help="leave auth.anonymous_keys out of the compared checkout's config (commits before it existed)")
    ap.add_argument("--loader", choices=["wrk", "python"], default="wrk" if shutil.which("wrk") else "python")
    ap.add_argument("--json", type=Path, help="write every sample here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-peers-"))
    os.sched_setaffinity(0, {int(LOAD_CORE)})  # the aiohttp loader runs in this process: keep it off core 0
    up_port = free_port()
    upstream = start_server([PY, str(ROOT / "experiments/instant_upstream.py"), str(up_port)], up_port, LOAD_CORE,
                            tmp / "upstream.log")
    procs: dict[str, Proc] = {}
    bench = Bench(args, upstream, tmp)
    modes = args.modes.split(",")
    surfaces = args.surfaces.split(",")
    unknown = set(surfaces) - set(SURFACES)
    if unknown:
        raise SystemExit(f"unknown surfaces: {sorted(unknown)}")
    agent_modes = [f"{s}/{m}" for s in surfaces if s != "chat" for m in modes]
    try:
        start_proxies(args, upstream, tmp, procs)
        print(f"loader {args.loader}; proxies on core {PROXY_CORE}, upstream + load on core {LOAD_CORE}", flush=True)
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}/{args.repeats}", flush=True)
            for mode in (modes if "chat" in surfaces else []) + agent_modes:
                bench.measure("upstream", None, upstream.url, mode)
                for name, proc in procs.items():
                    if (name != "litellm" and "@" not in name) or split_mode(mode)[0] == "chat":
                        bench.measure(name, proc, proc.url, mode)
    finally:
        for proc in procs.values():
            proc.stop()
        upstream.stop()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n{stamp}; medians of {args.repeats} repeats; req/s: {args.loader}, c={args.concurrency}, "
          f"{args.seconds:g} s; CPU/request: drained aiohttp loop, c={args.cpu_concurrency}, {args.seconds_cpu:g} s; "
          f"p50: c=1, {args.seconds_c1:g} s\n")
    if "chat" in surfaces:
        print(table(bench, list(procs), modes))
    if agent_modes:
        agents = [n for n in procs if n != "litellm" and "@" not in n]
        print("\nAgent surfaces (Responses, Anthropic Messages), same proxies and modes:\n")
        print(table(bench, agents, agent_modes))
        if "chat" in surfaces:
            print("\nCPU per request of each surface over chat's (same proxy, same mode):\n")
            print(surfaces_table(bench, agents, modes, surfaces))
    if args.json:
        args.json.write_text(json.dumps({f"{k[0]}|{k[1]}": v for k, v in bench.results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
