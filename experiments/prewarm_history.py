"""prewarm_eval.py --scenario history: a moved session's next turn after a replica joins, with no pre-warm, with
today's prefix pre-warm, and with the history pre-warm (each key's latest whole request replayed).

Per arm, fresh processes as in prewarm_eval.py (sims A, B up, C down; one `kvgate serve`, prefix affinity):

  1. a short agent session per tenant (so normalization learns the agent's volatile header); then
     `--sessions` agent sessions (one per tenant: each tenant's key and cache_salt, normalize on), each user turn
     carrying a `--turn-chars` tool output (a file read, a test log: what makes a coding agent's history long),
     run `--turns-before` turns each, `--concurrency` sessions at once;
  2. C starts; the gateway lists it `serving` (after its pre-warm in the pre-warm arms);
  3. every session sends its next turn, one at a time (so bounded load spills none). Those that land on C are
     the moved sessions (their key's rendezvous home is C now); their cached-token ratio and uncached prompt
     tokens, from the sims' usage, are the numbers.

Arms: cold (`prewarm.enabled: false`), prefix (`history_budget_chars: 0`: the stable prefixes only, as before
histories), history (the default).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.bench.workloads import Session, Workload, WorkloadOptions
from experiments.prewarm_eval import SIM, _seen, _spawn, _stop, api_path, gateway_config, post_turn, start_a_and_b
from experiments.procs import metric_sum, scrape, wait_http

ARMS = {"cold": {"enabled": False}, "prefix": {"history_budget_chars": 0}, "history": {}}
_WORDS = ("def", "return", "self", "import", "config", "value", "error", "test", "assert", "path", "file", "line")


@dataclass
class Turn:
    """One session's turn as the sim saw it."""

    session: int
    turn: int
    prompt: int = 0
    cached: int = 0
    seconds: float = 0.0


@dataclass
class HistoryResult:
    arm: str
    seed: int
    sessions: int
    moved: int = 0
    moved_ratio: float = 0.0
    moved_uncached: int = 0  # uncached prompt tokens of the moved sessions' first turn after the join, summed
    moved_prompt: int = 0
    moved_latency_s: float = 0.0
    stayed_ratio: float = 0.0
    replays: float = 0.0
    replayed_tokens: float = 0.0
    held_s: float = 0.0
    errors: int = 0
    moved_turns: list[tuple[int, int, int]] = field(default_factory=list)  # (session, prompt, cached)
    notes: list[str] = field(default_factory=list)


def tool_output(rng: random.Random, chars: int) -> str:
    """`chars` characters of code-like text, distinct per session and turn (no two sessions share blocks)."""
    out: list[str] = []
    size = 0
    while size < chars:
        line = " ".join(rng.choice(_WORDS) for _ in range(8)) + f"  # {rng.getrandbits(32):08x}"
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:chars]


def long_session(workload: Workload, index: int, turns: int, chars: int) -> Session:
    """Agent session `index` with exactly `turns` user turns, each followed by a `chars` tool output."""
    s = workload.session(index)
    rng = random.Random(f"history-{index}")
    base = (s.user_turns * turns)[:turns]
    s.user_turns = [f"{t}\n\nOutput of the last tool call:\n{tool_output(rng, chars)}" for t in base]
    return s


class Driver:
    """Sends sessions' turns through the gateway and keeps what the sim said about each."""

    def __init__(self, client: httpx.AsyncClient, api: str, max_tokens: int, concurrency: int) -> None:
        self.client, self.api, self.max_tokens = client, api, max_tokens
        self.sem = asyncio.Semaphore(concurrency)
        self.sent: dict[str, Turn] = {}
        self.errors = 0

    async def turn(self, s: Session) -> None:
        """Send `s`'s next turn and record the reply into its history."""
        async with self.sem:
            req = s.next_request("m", stream=False)
            req.body["max_tokens"] = self.max_tokens
            rid = uuid.uuid4().hex
            t = Turn(s.index, s.turn)
            t0 = time.monotonic()
            reply = await post_turn(self.client, self.api, req, rid)
            t.seconds = time.monotonic() - t0
            if reply is None:
                self.errors += 1
                s.record_reply("")
                return
            rec, text = reply
            t.prompt, t.cached = rec.prompt_tokens, rec.cached_tokens
            self.sent[rid] = t
            s.record_reply(text)


def _ratio(rows: list[Turn]) -> float:
    prompt = sum(t.prompt for t in rows)
    return sum(t.cached for t in rows) / prompt if prompt else 0.0


def _config(sims: list[str], args: argparse.Namespace, arm: str) -> dict[str, Any]:
    cfg = gateway_config(sims, args.sessions, True)
    cfg["routing"]["prewarm"] = {"enabled": True, **ARMS[arm]}
    return cfg


async def run_arm(arm: str, args: argparse.Namespace, workdir: Path) -> HistoryResult:
    """One arm: sessions before the join, C joins, every session's next turn."""
    res = HistoryResult(arm, args.seed, args.sessions)
    ports, sims, procs, base = start_a_and_b(f"h-{arm}", workdir, lambda s: _config(s, args, arm))
    try:
        await asyncio.sleep(1.0)  # C's probes fail: it leaves the rotation before any request
        options = WorkloadOptions(seed=args.seed, tenants=args.sessions,
                                  api_keys=tuple(f"sk-pw-{k}" for k in range(args.sessions)))
        workload = Workload("agent", options)
        n = args.sessions
        sessions = [long_session(workload, n + i, args.turns_before + 1, args.turn_chars) for i in range(n)]
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            driver = Driver(client, args.api, args.max_tokens, args.concurrency)
            # First a short session per tenant, so normalization has learned the agent's volatile header (until
            # then it is in the key, and each request has a key of its own) before the measured sessions start.
            warmup = [workload.session(i) for i in range(n)]
            for _ in range(3):
                await asyncio.gather(*(driver.turn(s) for s in warmup if not s.done))
            for _ in range(args.turns_before):
                await asyncio.gather(*(driver.turn(s) for s in sessions))
            procs.append(_spawn([*SIM, str(ports[2])], workdir / f"h-{arm}-sim2.log"))
            await asyncio.to_thread(wait_http, sims[2] + "/health", 60, procs[-1])
            deadline = time.monotonic() + 60
            while metric_sum(scrape(base), "gateway_pool_replicas", state="serving") < 3:
                if time.monotonic() > deadline:
                    res.notes.append("C never served")
                    break
                await asyncio.sleep(0.1)
            before = set(driver.sent)
            # One at a time: bounded load never spills a turn, so what lands on C is what C is now home for.
            driver.sem = asyncio.Semaphore(1)
            await asyncio.gather(*(driver.turn(s) for s in sessions))
        after = {rid: t for rid, t in driver.sent.items() if rid not in before}
        on_c = set(_seen(sims[2]))
        moved = [t for rid, t in after.items() if rid in on_c]
        res.moved, res.moved_ratio = len(moved), _ratio(moved)
        res.moved_turns = [(t.session, t.prompt, t.cached) for t in moved]
        res.moved_prompt = sum(t.prompt for t in moved)
        res.moved_uncached = res.moved_prompt - sum(t.cached for t in moved)
        res.moved_latency_s = sum(t.seconds for t in moved) / len(moved) if moved else 0.0
        res.stayed_ratio = _ratio([t for rid, t in after.items() if rid not in on_c])
        res.errors = driver.errors
        metrics = scrape(base)
        res.replays = metric_sum(metrics, "gateway_prewarm_requests_total", outcome="ok")
        res.replayed_tokens = metric_sum(metrics, "gateway_prewarm_tokens_total")
        res.held_s = metric_sum(metrics, "gateway_prewarm_duration_seconds_sum")
    finally:
        _stop(procs)
    return res


def run(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """Every arm for every seed; prints the table, returns the rows."""
    results: list[HistoryResult] = []
    for seed in (int(x) for x in args.seeds.split(",")):
        args.seed = seed
        results += [asyncio.run(run_arm(arm, args, workdir)) for arm in ARMS]
    print(f"\nlogs in {workdir}; {api_path(args.api)}, {args.sessions} sessions (one per tenant), "
          f"{args.turns_before} turns before C joins, {args.turn_chars} chars of tool output per turn\n")
    print("| arm | seed | moved sessions | cached ratio, moved sessions' next turn | uncached prompt tokens (sum) "
          "| per moved session | mean latency (s) | others' ratio | replays | replayed tokens | held (s) | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        per = r.moved_uncached / r.moved if r.moved else 0
        print(f"| {r.arm} | {r.seed} | {r.moved} | {r.moved_ratio:.3f} | {r.moved_uncached:,} | {per:,.0f} | "
              f"{r.moved_latency_s:.3f} | {r.stayed_ratio:.3f} | {r.replays:.0f} | {r.replayed_tokens:,.0f} | "
              f"{r.held_s:.2f} | {r.errors} |")
        for note in r.notes:
            print(f"  note ({r.arm}): {note}")
    for arm in ARMS:
        rows = [r for r in results if r.arm == arm]
        prompt = sum(r.moved_prompt for r in rows)
        uncached = sum(r.moved_uncached for r in rows)
        moved = sum(r.moved for r in rows)
        print(f"| **{arm}, all seeds** | | {moved} | **{(1 - uncached / prompt) if prompt else 0:.3f}** | "
              f"{uncached:,} | {uncached / moved if moved else 0:,.0f} | | | | | | |")
    return [asdict(r) for r in results]
