"""Issue 14, pre-warming: a replica joins mid-run under an agent workload; its first N requests' cached-token
ratio with pre-warm (routing.prewarm on, the default) against without.

Per arm, fresh processes: three `kvgate sim` replicas (h100-8b; experiments/multi_gateway.py's sim, which records
the x-request-id of every chat request it serves, so each request is attributed to its replica), one
`kvgate serve` whose prefix-affinity pool lists all three. Replica C is down when the gateway starts (its probe
fails, it is out of the pool), so the pool routes over A and B. Then:

  1. the agent workload (`kvgate bench`'s `agent`: ~1.45k-token system prompt with a volatile header, eight
     tools, 3-6 turns per session; `--tenants` tenants, each its own key and cache_salt, normalize on) runs
     with `--concurrency` sessions in flight; after `--warm` requests
  2. C starts (an empty cache, as a new pod or a restarted engine): its first good probes bring it in, the
     pre-warm arm first replays its share of the top prefixes with max_tokens 1;
  3. the load goes on until C has served `--first-n` client requests; those requests' cached tokens over their
     prompt tokens (the sims' usage) is the number this measures. Pre-warm replays carry no client request id,
     so they are not among them.

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/prewarm_eval.py
    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/prewarm_eval.py --tenants 16 --first-n 30 --json out.json
    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/prewarm_eval.py --api messages   # or responses

`--scenario history` measures instead what a moved session's next turn finds on C: sessions run several long turns
before C joins, then one more; no pre-warm vs prefix pre-warm vs history pre-warm (experiments/prewarm_history.py):

    flock /tmp/kvgate-bench.lock .venv/bin/python experiments/prewarm_eval.py --scenario history --api messages

`--api messages|responses` sends the same sessions through /v1/messages (system, Anthropic tools) or /v1/responses
(instructions, input items, flat function tools), as Claude Code and Codex do: `kvgate bench`'s own re-shaping
(app/bench/apis.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.bench.apis import API_NAMES, PATHS, to_body, whole_text  # noqa: E402
from app.bench.spec import RequestRecord  # noqa: E402
from app.bench.workloads import Session, Workload, WorkloadOptions  # noqa: E402
from experiments.procs import free_port, metric_sum, scrape, wait_http  # noqa: E402
from kvlab.configs import gateway_config as lab_config  # noqa: E402
from kvlab.procs import start_logged, stop_all  # noqa: E402

KVGATE = str(Path(sys.executable).parent / "kvgate")
SIM = [sys.executable, str(ROOT / "experiments" / "multi_gateway.py"), "--_sim"]
ARMS = ("cold", "prewarm")


@dataclass
class Sent:
    """One client request: who sent it, what the sim reported, how long it took."""

    rid: str
    tenant: int
    turn: int
    prompt: int = 0
    cached: int = 0
    seconds: float = 0.0
    after_join: bool = False


@dataclass
class ArmResult:
    arm: str
    seed: int
    first_n: int
    c_requests: int = 0
    c_cached_ratio: float = 0.0
    c_first_turn_ratio: float | None = None
    c_mean_latency_s: float = 0.0
    others_cached_ratio: float = 0.0
    join_s: float = 0.0
    prewarm_replays: float = 0.0
    prewarm_tokens: float = 0.0
    prewarm_held_s: float = 0.0
    requests: int = 0
    errors: int = 0
    notes: list[str] = field(default_factory=list)


def gateway_config(sims: list[str], tenants: int, prewarm: bool) -> dict[str, Any]:
    """One model over one prefix-affinity pool of every sim; `tenants` tenants with normalize on."""
    return lab_config(
        {"main": {"role": "interactive", "replicas": sims, "policy": "prefix_affinity"}},
        served_model="served", price={"input_per_m": 0.8, "cached_input_per_m": 0.08, "output_per_m": 2.4},
        tenants=[{"id": f"t{k}", "api_keys": [f"sk-pw-{k}"], "default_class": "interactive", "normalize": "on"}
                 for k in range(tenants)],
        listen={"host": "127.0.0.1"},
        routing={"probe_interval_s": 0.25, "healthy_after": 2, "unhealthy_after": 1, "prewarm": {"enabled": prewarm}},
    )


def api_path(api: str) -> str:
    """The path `api` is served on."""
    return "/v1" + PATHS[api]


class Load:
    """`concurrency` agent sessions in flight, turn after turn, until stopped."""

    def __init__(self, base: str, workload: Workload, concurrency: int, max_tokens: int, warm: int,
                 api: str = "chat") -> None:
        self.api = api
        self.base = base
        self.workload = workload
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.sent: dict[str, Sent] = {}
        self.errors = 0
        self.joined = False
        self.stop = asyncio.Event()
        self.warm = warm
        self.warmed = asyncio.Event()  # `warm` requests answered
        self._next = 0

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=120) as client:
            await asyncio.gather(*(self._worker(client) for _ in range(self.concurrency)))

    async def _worker(self, client: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            session = self.workload.session(self._next)
            self._next += 1
            while not session.done and not self.stop.is_set():
                await self._turn(client, session)

    async def _turn(self, client: httpx.AsyncClient, session: Session) -> None:
        req = session.next_request("m", stream=False)
        req.body["max_tokens"] = self.max_tokens
        rid = uuid.uuid4().hex
        sent = Sent(rid, req.tenant, req.turn, after_join=self.joined)
        t0 = time.monotonic()
        reply = await post_turn(client, self.api, req, rid)
        sent.seconds = time.monotonic() - t0
        if reply is None:
            self.errors += 1
            session.record_reply("")
            return
        rec, text = reply
        sent.prompt, sent.cached = rec.prompt_tokens, rec.cached_tokens
        self.sent[rid] = sent
        if len(self.sent) >= self.warm:
            self.warmed.set()
        session.record_reply(text)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return start_logged(argv, log)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    stop_all(procs, timeout_s=20)


def _seen(url: str) -> list[str]:
    try:
        return httpx.get(url + "/_seen", timeout=5).text.split()
    except httpx.TransportError:
        return []


async def post_turn(client: httpx.AsyncClient, api: str, req: Any, rid: str) -> tuple[RequestRecord, str] | None:
    """One bench request (`kvgate bench`'s own re-shaping: the same prompt on each API) with its request id: the
    usage the reply reports and its text, or None if it was not a 200."""
    r = await client.post(api_path(api), json=to_body(api, req.body),
                          headers={**req.headers, "authorization": f"Bearer {req.api_key}", "x-request-id": rid})
    if r.status_code != 200:
        return None
    rec = RequestRecord(0, req.session, req.turn, req.tenant, req.route_class)
    return rec, whole_text(api, r.json(), rec)


def _ratio(rows: list[Sent]) -> float:
    prompt = sum(s.prompt for s in rows)
    return sum(s.cached for s in rows) / prompt if prompt else 0.0


def start_a_and_b(tag: str, workdir: Path, config: Callable[[list[str]], dict[str, Any]]
                  ) -> tuple[list[int], list[str], list[subprocess.Popen[bytes]], str]:
    """Sims A and B and a gateway whose config (`config(sims)`) lists C too, not started yet: the three ports,
    the sims' URLs, the processes (stopped here if the start fails) and the gateway's URL."""
    ports = [free_port() for _ in range(3)]
    sims = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [_spawn([*SIM, str(p)], workdir / f"{tag}-sim{i}.log") for i, p in enumerate(ports[:2])]
    try:
        for url, proc in zip(sims[:2], procs, strict=True):
            wait_http(url + "/health", 60, proc)
        cfg_path = workdir / f"{tag}-gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(config(sims)))
        gw_port = free_port()
        procs.append(_spawn([KVGATE, "serve", "--config", str(cfg_path), "--port", str(gw_port), "--log-level",
                             "info"], workdir / f"{tag}-gateway.log"))
        base = f"http://127.0.0.1:{gw_port}"
        wait_http(base + "/ready", 120, procs[-1])
    except BaseException:
        _stop(procs)
        raise
    return ports, sims, procs, base


async def run_arm(arm: str, args: argparse.Namespace, workdir: Path) -> ArmResult:
    res = ArmResult(arm, args.seed, args.first_n)
    ports, sims, procs, base = start_a_and_b(arm, workdir, lambda s: gateway_config(s, args.tenants, arm == "prewarm"))
    try:
        await asyncio.sleep(1.0)  # C's probes fail: it leaves the rotation before any request
        options = WorkloadOptions(seed=args.seed, tenants=args.tenants,
                                  api_keys=tuple(f"sk-pw-{k}" for k in range(args.tenants)))
        load = Load(base, Workload("agent", options), args.concurrency, args.max_tokens, args.warm, args.api)
        task = asyncio.create_task(load.run())
        deadline = time.monotonic() + args.time_limit_s
        await asyncio.wait_for(load.warmed.wait(), args.time_limit_s)
        t_join = time.monotonic()
        procs.append(_spawn([*SIM, str(ports[2])], workdir / f"{arm}-sim2.log"))
        await asyncio.to_thread(wait_http, sims[2] + "/health", 60, procs[-1])
        load.joined = True
        while time.monotonic() < deadline:
            seen = [r for r in _seen(sims[2]) if r in load.sent]
            if len(seen) >= args.first_n:
                break
            if not seen:
                res.join_s = time.monotonic() - t_join
            await asyncio.sleep(0.2)
        else:
            res.notes.append(f"time limit: C served {len(seen)} requests")
        load.stop.set()
        await task
        on_c = [load.sent[r] for r in _seen(sims[2]) if r in load.sent]
        first = on_c[: args.first_n]
        res.c_requests = len(first)
        res.c_cached_ratio = _ratio(first)
        first_turns = [s for s in first if s.turn == 0]
        res.c_first_turn_ratio = _ratio(first_turns) if first_turns else None
        res.c_mean_latency_s = sum(s.seconds for s in first) / len(first) if first else 0.0
        c_ids = set(_seen(sims[2]))
        res.others_cached_ratio = _ratio([s for s in load.sent.values() if s.after_join and s.rid not in c_ids])
        res.requests, res.errors = len(load.sent), load.errors
        metrics = scrape(base)
        res.prewarm_replays = metric_sum(metrics, "gateway_prewarm_requests_total", outcome="ok")
        res.prewarm_tokens = metric_sum(metrics, "gateway_prewarm_tokens_total")
        res.prewarm_held_s = metric_sum(metrics, "gateway_prewarm_duration_seconds_sum")
    finally:
        _stop(procs)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--concurrency", type=int, default=4, help="agent sessions in flight")
    p.add_argument("--warm", type=int, default=80, help="requests before replica C starts")
    p.add_argument("--first-n", type=int, default=20, help="C's first N client requests are measured")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--seeds", default="7,8,9", help="one run of both arms per seed (sessions and ports differ)")
    p.add_argument("--time-limit-s", type=float, default=240)
    p.add_argument("--api", choices=API_NAMES, default="chat", help="the API the sessions speak")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--scenario", choices=("join", "history"), default="join",
                   help="join: C's first N requests under load; history: moved sessions' next turn after C joins")
    p.add_argument("--sessions", type=int, default=18, help="history: sessions, one per tenant")
    p.add_argument("--turns-before", type=int, default=4, help="history: turns each session sends before C joins")
    p.add_argument("--turn-chars", type=int, default=8000, help="history: tool output in each user turn (chars)")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-prewarm-"))
    print(f"uptime: {os.popen('uptime').read().strip()}")
    if args.scenario == "history":
        from experiments.prewarm_history import run as run_history  # it builds on this module's helpers

        rows = run_history(args, workdir)
        print(f"\nuptime: {os.popen('uptime').read().strip()}")
        if args.json is not None:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    results = []
    for seed in (int(x) for x in args.seeds.split(",")):
        args.seed = seed
        results += [asyncio.run(run_arm(arm, args, workdir)) for arm in ARMS]
    print(f"\nlogs in {workdir}; {api_path(args.api)}, {args.tenants} tenants, {args.concurrency} sessions in "
          f"flight, C joins after {args.warm} requests, C's first {args.first_n} client requests\n")
    print("| arm | seed | C's requests measured | cached-token ratio on C | on C, first turns | mean latency on C (s) "
          "| others' ratio after join | pre-warm replays | replayed tokens | held (s) | C's first request after (s) "
          "| requests | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ft = f"{r.c_first_turn_ratio:.3f}" if r.c_first_turn_ratio is not None else "-"
        print(f"| {r.arm} | {r.seed} | {r.c_requests} | {r.c_cached_ratio:.3f} | {ft} | {r.c_mean_latency_s:.3f} | "
              f"{r.others_cached_ratio:.3f} | {r.prewarm_replays:.0f} | {r.prewarm_tokens:.0f} | "
              f"{r.prewarm_held_s:.2f} | {r.join_s:.2f} | {r.requests} | {r.errors} |")
        for note in r.notes:
            print(f"  note ({r.arm}): {note}")
    for arm in ARMS:
        rows = [r for r in results if r.arm == arm]
        print(f"| **{arm}, mean** | | {sum(r.c_requests for r in rows)} | "
              f"**{sum(r.c_cached_ratio for r in rows) / len(rows):.3f}** | | "
              f"{sum(r.c_mean_latency_s for r in rows) / len(rows):.3f} | "
              f"{sum(r.others_cached_ratio for r in rows) / len(rows):.3f} | | | | | | |")
    print(f"\nuptime: {os.popen('uptime').read().strip()}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
