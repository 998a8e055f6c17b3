"""Three `kvgate serve` processes (A, B, and C with `--workers 2`) on one Redis in front of four `kvgate sim`
replicas: does a shared prefix reach the same replica from every gateway process, do limits and spend hold
exactly across them, and is each process's /metrics one coherent set?

Every sim records the x-request-id of each request it serves (the gateway passes the client's id on), so each
request is attributed to the replica that served it. Phases, all bounded in count:
  1. affinity, light: 24 long shared prefixes (Zipf popularity) over every gateway, a few in flight;
  2. affinity, loaded: the same, many in flight, so bounded load spills some requests off their home;
     with --kill, gateway B is SIGKILLed halfway and the rest of its share goes to A;
  3. one rpm limit, 3 times its value in one concurrent burst spread over the four processes;
then spend (Redis, through the admin API) against the sum of x-kvgate-cost-usd, and a /metrics audit.

    .venv/bin/python experiments/multi_gateway.py [--light 240 --loaded 480 --concurrency 48 --kill]
        [--peer-load-s 0.1 (0: off)] [--min-bound 8] [--spill ranked]

Agreement is measured per request: every request of the same prefix that reached a sim in the same peer-load
round through another gateway went to the same replica (docs/deploy.md, "Many gateway processes").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import httpx2  # the openai SDK's own HTTP client package
import openai
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.routing.prefix_affinity import PrefixAffinity  # noqa: E402
from experiments.procs import free_port, wait_http  # noqa: E402
from kvlab.configs import gateway_config as lab_config  # noqa: E402
from kvlab.procs import start_logged  # noqa: E402

KVGATE = str(Path(sys.executable).parent / "kvgate")
SPENDER, LIMITED, ADMIN = "sk-mg-spender", "sk-mg-limited", "sk-mg-admin"
BENCHER, BENCH_LIMITED = "sk-mg-bencher", "sk-mg-bench-limited"  # the tenants `kvgate bench` drives
RPM = 20
BURSTS = 5  # one fresh tenant per burst: each starts with a whole minute's allowance
PREFIXES = 24
TIME_LIMIT_S = 600
US = 1_000_000


# --- a sim that remembers who it served ---------------------------------------------------------------


def _sim_child(port: int) -> None:
    """`kvgate sim` (h100-8b) plus GET /_seen: per chat/Messages/Responses request it served, its x-request-id,
    when it arrived and when its last byte left (wall clock: Redis runs on this host, so this is the store's clock
    the gateways' peer-load rounds are on, up to their estimate's error, ~0.1 ms)."""
    import uvicorn

    from app.sim.options import SimOptions
    from app.sim.server import create_sim_app

    sim = create_sim_app(SimOptions(model="served", profile="h100-8b", mean_output_tokens=24))
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/_seen":
            body = ("\n".join(seen)).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": body})
            return
        rid = ""
        if scope["type"] == "http" and scope["path"] in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
            rid = dict(scope["headers"]).get(b"x-request-id", b"").decode()
        if not rid:
            await sim(scope, receive, send)
            return
        start = time.time()

        async def timed_send(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                seen.append(f"{rid} {start:.6f} {time.time():.6f}")

        await sim(scope, receive, timed_send)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- processes ----------------------------------------------------------------------------------------


@dataclass
class Stack:
    sims: list[str]
    gateways: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]]
    redis_url: str
    prefix: str
    workdir: Path


def _spawn(stack: Stack, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    proc = start_logged(argv, stack.workdir / f"{name}.log")
    stack.procs[name] = proc
    return proc


def _gateway_config(sims: list[str], redis_url: str, prefix: str, args: argparse.Namespace) -> dict[str, Any]:
    policy = {
        "type": "prefix_affinity",
        "load_bound": args.load_bound,
        "min_bound": args.min_bound,
        "spill": args.spill,
    }
    return lab_config(
        {"main": {"role": "interactive", "replicas": sims, "policy": policy}},
        served_model="served", price={"input_per_m": 0.8, "cached_input_per_m": 0.08, "output_per_m": 2.4},
        tenants=[
            {"id": "spender", "api_keys": [SPENDER], "limits": {"rpm": 1_000_000}},
            *({"id": f"limited{k}", "api_keys": [f"{LIMITED}-{k}"], "limits": {"rpm": RPM}} for k in range(BURSTS)),
            {"id": "bencher", "api_keys": [BENCHER], "limits": {"rpm": 1_000_000}},
            {"id": "bench-limited", "api_keys": [BENCH_LIMITED], "limits": {"rpm": RPM}},
        ],
        listen={"host": "127.0.0.1", "drain_s": 5, "drain_notice_s": 0.2},
        store={"url": redis_url, "key_prefix": prefix, "socket_timeout_s": args.store_timeout},
        auth={"required": True, "admin_keys": [ADMIN]},
        routing={"probe_interval_s": 0.5,
                 "peer_load": {"enabled": args.peer_load_s > 0, "interval_s": args.peer_load_s or 0.1,
                               "route_header": True}},
    )


def start(workdir: Path, args: argparse.Namespace) -> Stack:
    stack = Stack([], {}, {}, args.redis_url or "", f"kvgate-mg:{uuid.uuid4().hex[:8]}:", workdir)
    if not args.redis_url:
        port = free_port()
        _spawn(stack, "redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(workdir)])  # fmt: skip
        stack.redis_url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() != b"PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
    for i in range(4):
        port = free_port()
        _spawn(stack, f"sim{i}", [sys.executable, __file__, "--_sim", str(port)])
        stack.sims.append(f"http://127.0.0.1:{port}")
    for i, url in enumerate(stack.sims):
        wait_http(url + "/health", 60, stack.procs[f"sim{i}"])
    cfg = workdir / "gateway.yaml"
    raw = _gateway_config(stack.sims, stack.redis_url, stack.prefix, args)
    cfg.write_text(yaml.safe_dump(raw))
    for name, extra in (("A", []), ("B", []), ("C", ["--workers", "2"])):
        port = free_port()
        _spawn(stack, f"gw{name}", [KVGATE, "serve", "--config", str(cfg), "--port", str(port), *extra])
        stack.gateways[name] = f"http://127.0.0.1:{port}"
    for name, url in stack.gateways.items():
        wait_http(url + "/ready", 120, stack.procs[f"gw{name}"])
    return stack


def stop(stack: Stack) -> None:
    for name, proc in stack.procs.items():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM if name.startswith("gw") else signal.SIGINT)
    for proc in stack.procs.values():
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# --- traffic ------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    rid: str
    prefix: int
    gateway: str
    status: int
    pick: str = ""
    cost: Decimal = Decimal(0)
    snapshot: int = -2  # the peer-load round whose counts decided (-1: the live view; -2: no stamp)
    decided_us: int = 0  # the store's clock at the pick as the deciding process reads it, µs
    attempt: int = 1


def _messages(prefix: int, i: int) -> list[dict[str, str]]:
    system = f"You are support agent {prefix} of ACME. " + f"Rule {prefix}: answer briefly and exactly. " * 60
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: order #{1000 + i}?"}]


class Clients:
    """openai clients per gateway; C's opens a new connection per request so both of its workers take some."""

    def __init__(self, stack: Stack, key: str) -> None:
        self.by_name: dict[str, openai.AsyncOpenAI] = {}
        for name, url in stack.gateways.items():
            limits = httpx2.Limits(max_keepalive_connections=0) if name == "C" else httpx2.Limits()
            self.by_name[name] = openai.AsyncOpenAI(
                base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60,
                http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=60),
            )  # fmt: skip

    async def close(self) -> None:
        for c in self.by_name.values():
            await c.close()


async def affinity(stack: Stack, n: int, concurrency: int, rng: random.Random, kill_at: int | None) -> list[Outcome]:
    clients = Clients(stack, SPENDER)
    weights = [1 / (k + 1) for k in range(PREFIXES)]  # Zipf: a few hot prefixes, a long tail
    plan = [(rng.choices(range(PREFIXES), weights)[0], "ABC"[i % 3]) for i in range(n)]
    sem = asyncio.Semaphore(concurrency)
    dead: set[str] = set()
    out: list[Outcome] = []
    started = 0

    async def one(i: int, prefix: int, gateway: str) -> None:
        nonlocal started
        async with sem:
            started += 1
            if kill_at is not None and started == kill_at and "B" not in dead:
                dead.add("B")
                stack.procs["gwB"].kill()  # SIGKILL mid-run: its in-flight requests die with it
            gw = "A" if gateway in dead else gateway
            rid = f"mg-{uuid.uuid4().hex[:12]}"
            try:
                raw = await clients.by_name[gw].chat.completions.with_raw_response.create(
                    model="m", messages=_messages(prefix, i), max_tokens=rng.randint(8, 32),  # type: ignore[arg-type]
                    extra_headers={"x-request-id": rid},
                )  # fmt: skip
            except (openai.APIConnectionError, openai.APIStatusError) as err:
                status = getattr(err, "status_code", 0) or 0
                out.append(Outcome(rid, prefix, gw, status))
                return
            route = dict(p.split("=", 1) for p in raw.headers.get("x-kvgate-route", "").split(";") if "=" in p)
            out.append(Outcome(
                rid, prefix, gw, 200, route.get("pick", ""), Decimal(raw.headers["x-kvgate-cost-usd"]),
                int(route.get("snapshot", -2)), int(route.get("decided", 0)), int(route.get("attempt", 1)),
            ))  # fmt: skip

    await asyncio.gather(*(one(i, p, g) for i, (p, g) in enumerate(plan)))
    await clients.close()
    return out


async def limit_burst(stack: Stack, k: int) -> tuple[collections.Counter[int], collections.Counter[str]]:
    clients = Clients(stack, f"{LIMITED}-{k}")
    live = [n for n in stack.gateways if stack.procs[f"gw{n}"].poll() is None]

    async def one(i: int) -> int:
        try:
            raw = await clients.by_name[live[i % len(live)]].chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=2
            )
        except openai.RateLimitError:
            return 429
        except openai.APIError:
            return 0
        # Fail-open: a store call that timed out serves the request unenforced and says so.
        return -200 if "unenforced" in raw.headers.get("x-kvgate-limit", "") else 200

    codes = await asyncio.gather(*(one(i) for i in range(3 * RPM)))
    await clients.close()
    return collections.Counter(codes), collections.Counter(live[i % len(live)] for i in range(3 * RPM))


@dataclass
class BenchPhase:
    """`kvgate bench` across every live gateway process: its records, and how many went to each process."""

    records: list[dict[str, Any]]
    sent: collections.Counter[str]


def kvgate_bench(stack: Stack, key: str, name: str, extra: list[str]) -> BenchPhase:
    """Run `kvgate bench` with one --base-url per live gateway process (sessions spread over them, session i on
    process i mod n) and read its per-request records."""
    live = [n for n in stack.gateways if stack.procs[f"gw{n}"].poll() is None]
    out = stack.workdir / f"bench-{name}.json"
    urls = [a for n in live for a in ("--base-url", stack.gateways[n])]
    subprocess.run([KVGATE, "bench", *urls, "--api-key", key, "--model", "m", "--quiet", "--json", str(out),
                    *extra], capture_output=True, timeout=300, cwd=ROOT)  # fmt: skip
    records = json.loads(out.read_text())["records"]
    return BenchPhase(records, collections.Counter(live[r["session"] % len(live)] for r in records))


async def bench_spend(stack: Stack, phase: BenchPhase, tenant: str) -> tuple[Decimal, Decimal]:
    """What `kvgate bench` summed of x-kvgate-cost-usd (every answered request) against the tenant's spend in Redis."""
    billed = sum((Decimal(str(r["cost_usd"])) for r in phase.records if r["cost_usd"] is not None), Decimal(0))
    stored, _ = await stored_usage(stack, tenant, sum(1 for r in phase.records if r["status"] == 200))
    return billed, stored


@dataclass(frozen=True)
class Span:
    """Where and when a sim served one request."""

    replica: int
    start: float
    end: float


def served_by(stack: Stack) -> dict[str, Span]:
    """Every completion the sims served, by x-request-id."""
    owner: dict[str, Span] = {}
    for i, url in enumerate(stack.sims):
        for line in httpx.get(url + "/_seen", timeout=10).text.splitlines():
            rid, start, end = line.split()
            owner[rid] = Span(i, float(start), float(end))
    return owner


def prefix_keys(salt_secret: str = "kvgate-dev-secret") -> list[int]:
    """Each prefix's routing key, computed as the gateway does (chat view's key head, the tenant's cache salt)."""
    from app.normalize import cache_salt_for
    from app.prefix_key import routing_key
    from app.surfaces import CHAT

    salt = cache_salt_for("spender", salt_secret)
    return [routing_key(CHAT.view({"messages": _messages(p, 0)}).key_head, salt) for p in range(PREFIXES)]


def _when_us(o: Outcome, owner: dict[str, Span], by: str) -> int:
    return o.decided_us if by == "decision" else round(owner[o.rid].start * US)


def _round(t_us: int, round_s: float) -> int:
    """The round a µs instant falls in, in integers (float division misplaces instants on a boundary)."""
    return t_us // round(round_s * US)


def _round_groups(
    outcomes: list[Outcome], owner: dict[str, Span], round_s: float, by: str
) -> list[list[tuple[Outcome, int, float]]]:
    """Served requests grouped by (prefix, round), with their replica and how far into the round they fell."""
    groups: dict[tuple[int, int], list[tuple[Outcome, int, float]]] = collections.defaultdict(list)
    for o in outcomes:
        if o.status == 200 and o.rid in owner and (by != "decision" or o.decided_us > 0):
            t = _when_us(o, owner, by)
            groups[(o.prefix, _round(t, round_s))].append((o, owner[o.rid].replica, t / US % round_s))
    return list(groups.values())


def same_round_agreement(
    outcomes: list[Outcome], owner: dict[str, Span], round_s: float, skip_s: float = 0.0, by: str = "arrival"
) -> tuple[float, int]:
    """Share of requests whose replica every other gateway also chose for that prefix in the same round.

    A round is the `round_s` slice (the store's clock) in which the gateways share one load snapshot (peer_load),
    so it is where they can agree at all; the same slices are used when peer_load is off. Per request: all requests
    of its prefix in the same round through *other* gateways went to its replica (C's two workers cannot be
    told apart, so pairs inside C do not count). `by`: "arrival" puts a request in the round in which it
    reached its sim (the sims' records), "decision" in the one in which its gateway picked (the gateway's
    `decided` stamp, the store's clock as it reads it). Returns (share %, requests with a peer). With `skip_s`,
    requests in a round's first `skip_s` are left out (where a late process still decides on the previous
    snapshot).
    """
    agree = counted = 0
    for members in _round_groups(outcomes, owner, round_s, by):
        for o, rep, since in members:
            others = {r for p, r, _ in members if p.gateway != o.gateway}
            if others and since >= skip_s:
                counted += 1
                agree += others == {rep}
    return 100 * agree / max(counted, 1), counted


CAUSES = (
    "retry after a failure (attempt > 1)",
    "decided in different rounds (arrival grouping only)",
    "a process on its live view (alone, store slow, round late)",
    "same round, different snapshots (one applied late or early)",
    "same snapshot, different replica (candidates differ)",
)


def disagreement_causes(
    outcomes: list[Outcome], owner: dict[str, Span], round_s: float, by: str
) -> collections.Counter[str]:
    """Every request that disagreed with a same-round peer of another gateway, by the first cause that explains
    it against the peers that chose another replica (checked in CAUSES' order)."""
    out: collections.Counter[str] = collections.Counter()
    for members in _round_groups(outcomes, owner, round_s, by):
        for o, rep, _ in members:
            dissent = [p for p, r, _ in members if p.gateway != o.gateway and r != rep]
            if not dissent:
                continue
            rounds = {_round(x.decided_us, round_s) for x in [o, *dissent]}
            snaps = {x.snapshot for x in [o, *dissent]}
            if any(x.attempt > 1 for x in [o, *dissent]):
                out[CAUSES[0]] += 1
            elif len(rounds) > 1:
                out[CAUSES[1]] += 1
            elif -1 in snaps:
                out[CAUSES[2]] += 1
            elif len(snaps) > 1:
                out[CAUSES[3]] += 1
            else:
                out[CAUSES[4]] += 1
    return out


def snapshot_lag(outcomes: list[Outcome], round_s: float) -> collections.Counter[int | str]:
    """Per pick: its decision round minus the round of the snapshot that decided ("live" for the live view)."""
    lag: collections.Counter[int | str] = collections.Counter()
    for o in outcomes:
        if o.status == 200 and o.decided_us > 0:
            lag["live" if o.snapshot < 0 else _round(o.decided_us, round_s) - o.snapshot] += 1
    return lag


def home_check(outcomes: list[Outcome], owner: dict[str, Span], sims: list[str]) -> str:
    """Whether the replay's routing keys are the gateway's: every prefix_home pick on the replayed home."""
    from app.routing.state import ReplicaState

    keys = prefix_keys()
    reps = [ReplicaState(u, "main", i) for i, u in enumerate(sims)]
    home = [PrefixAffinity().select(reps, k).chosen.index for k in keys]
    picks = [o for o in outcomes if o.pick == "prefix_home" and o.rid in owner]
    return f"{sum(owner[o.rid].replica == home[o.prefix] for o in picks)} of {len(picks)} prefix_home picks"


def mismatches(
    outcomes: list[Outcome], owner: dict[str, Span], ideal: dict[str, int], sims: list[str]
) -> tuple[float, float, float]:
    """Disagreements with the replay by kind: the bound judged too loose, too tight, or the spill target."""
    from app.routing.state import ReplicaState

    keys = prefix_keys()
    reps = [ReplicaState(u, "main", i) for i, u in enumerate(sims)]
    home = [PrefixAffinity().select(reps, k).chosen.index for k in keys]
    ok = [o for o in outcomes if o.status == 200 and o.rid in owner and o.rid in ideal]
    kinds = [0, 0, 0]
    for o in ok:
        got, want, h = owner[o.rid].replica, ideal[o.rid], home[o.prefix]
        if got == want:
            continue
        kinds[0 if got == h else 1 if want == h else 2] += 1
    n = max(len(ok), 1)
    return kinds[0] * 100 / n, kinds[1] * 100 / n, kinds[2] * 100 / n


def dictated(outcomes: list[Outcome], owner: dict[str, Span], sims: list[str], policy: Any) -> dict[str, int]:
    """The replica the cluster's true state dictates for each request: the gateways' own policy, replayed on
    what every sim held the moment the request arrived (the sims' own records, not any gateway's view).

    A request that went there is one any gateway with an exact, current view would have sent to the same
    replica: agreement between gateways, measured against one reference instead of pairwise. It is strict:
    two requests deciding within the same millisecond through different gateways cannot see each other, and
    the replay counts the second one as a disagreement if the first changed its choice.
    """
    from app.routing.state import ReplicaState

    keys = prefix_keys()
    spans = sorted(owner.values(), key=lambda sp: sp.start)
    out: dict[str, int] = {}
    for o in outcomes:
        sp = owner.get(o.rid)
        if o.status != 200 or sp is None:
            continue
        reps = [ReplicaState(u, "main", i) for i, u in enumerate(sims)]
        for other in spans:
            if other.start >= sp.start:
                break
            if other.end > sp.start:
                reps[other.replica].in_flight += 1
        out[o.rid] = policy.select(reps, keys[o.prefix]).chosen.index
    return out


def agreement(outcomes: list[Outcome], owner: dict[str, Span], ideal: dict[str, int]) -> dict[str, float]:
    """How often a prefix reached the same replica from every gateway process.

    A prefix's home is the replica its `prefix_home` picks went to (rendezvous hashing: the same from every
    process that sees the same replicas). Reported: the share of `prefix_home` picks on that home (determinism
    across processes, should be 100 %), the share of all requests on it (what bounded-load spills cost), and
    the share of prefixes whose home was the same from every gateway that made a home pick for it, and the
    share of requests on the replica the true cluster state dictated (`dictated`: agreement between gateways)
    next to how many of those an exact view would itself have kept on the home.
    """
    ok = [o for o in outcomes if o.status == 200 and o.rid in owner]
    where = {o.rid: owner[o.rid].replica for o in ok}
    homes: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    per_gw: dict[int, dict[str, collections.Counter[int]]] = collections.defaultdict(dict)
    for o in ok:
        if o.pick == "prefix_home":
            homes[o.prefix][where[o.rid]] += 1
            per_gw[o.prefix].setdefault(o.gateway, collections.Counter())[where[o.rid]] += 1
    home = {p: c.most_common(1)[0][0] for p, c in homes.items()}
    home_picks = [o for o in ok if o.pick == "prefix_home"]
    with_home = [o for o in ok if o.prefix in home]
    multi = [p for p, g in per_gw.items() if len(g) >= 2]
    same = sum(1 for p in multi if len({c.most_common(1)[0][0] for c in per_gw[p].values()}) == 1)
    return {
        "requests": len(ok),
        "home_picks_on_home_pct": 100
        * sum(where[o.rid] == home[o.prefix] for o in home_picks)
        / max(len(home_picks), 1),
        "on_home_pct": 100 * sum(where[o.rid] == home[o.prefix] for o in with_home) / max(len(with_home), 1),
        "spilled_pct": 100 * sum(o.pick == "prefix_bounded_spill" for o in ok) / max(len(ok), 1),
        "prefixes_same_home_pct": 100 * same / max(len(multi), 1),
        "prefixes": len(multi),
        "dictated_pct": 100 * sum(where[o.rid] == ideal.get(o.rid) for o in ok) / max(len(ok), 1),
        "dictated_home_pct": 100 * sum(ideal.get(o.rid) == home.get(o.prefix) for o in ok) / max(len(ok), 1),
        "errors": sum(1 for o in outcomes if o.status != 200),
    }


def metrics_audit(stack: Stack, sent: dict[str, int]) -> list[tuple[str, str, str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    rows = []
    for name, url in stack.gateways.items():
        if stack.procs[f"gw{name}"].poll() is not None:
            rows.append((name, "killed", "-", "-"))
            continue
        coherent, workers, total = True, set(), 0.0
        per_worker: collections.Counter[str] = collections.Counter()
        for _ in range(4):
            text = httpx.get(url + "/metrics", headers={"connection": "close"}, timeout=10).text
            types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
            coherent &= len(types) == len(set(types))
            total, per_worker = 0.0, collections.Counter()
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    workers.add(s.labels.get("worker", "-"))
                    if fam.name == "gateway_requests" and s.name.endswith("_total"):
                        total += s.value
                        per_worker[s.labels.get("worker", "-")] += int(s.value)
        split = " + ".join(f"{per_worker[w]}" for w in sorted(per_worker)) if len(per_worker) > 1 else ""
        rows.append((name, "yes" if coherent else "NO", ",".join(sorted(workers)),
                     f"{total:.0f} / {sent[name]}" + (f" (by worker: {split})" if split else "")))  # fmt: skip
    return rows


async def stored_usage(stack: Stack, tenant: str, ok: int) -> tuple[Decimal, int]:
    """The tenant's spend and request count in Redis (admin API of a live process), once `ok` requests are in."""
    live = next(u for n, u in stack.gateways.items() if stack.procs[f"gw{n}"].poll() is None)
    async with httpx.AsyncClient(base_url=live, headers={"authorization": f"Bearer {ADMIN}"}) as http:
        for _ in range(100):
            total = (await http.get(f"/admin/tenants/{tenant}/usage?days=1")).json()["total"]
            if total["requests"] >= ok:
                break
            await asyncio.sleep(0.1)
    return Decimal(total["usd_micros"]) / 1_000_000, int(total["requests"])


async def spend_check(stack: Stack, outcomes: list[Outcome]) -> tuple[Decimal, Decimal, int, int]:
    header_sum = sum((o.cost for o in outcomes if o.status == 200), Decimal(0))
    ok = sum(1 for o in outcomes if o.status == 200)
    stored, stored_n = await stored_usage(stack, "spender", ok)
    return header_sum, stored, ok, stored_n


def dump(
    path: Path, light: list[Outcome], loaded: list[Outcome], owner: dict[str, Span], ideal: dict[str, int]
) -> None:
    """Every affinity request as one JSON line: to look at single disagreements."""
    with path.open("w") as f:
        for phase_name, phase in (("light", light), ("loaded", loaded)):
            for o in phase:
                sp = owner.get(o.rid)
                row = {"phase": phase_name, "gateway": o.gateway, "prefix": o.prefix, "status": o.status,
                       "pick": o.pick, "snapshot": o.snapshot, "decided_us": o.decided_us, "attempt": o.attempt,
                       "replica": sp.replica if sp else None, "arrived": sp.start if sp else None,
                       "ideal": ideal.get(o.rid)}  # fmt: skip
                f.write(json.dumps(row) + "\n")


async def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-mg-"))
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    stack = start(workdir, args)
    try:
        print(f"stack up in {time.monotonic() - t0:.1f} s: sims {len(stack.sims)}, gateways "
              + ", ".join(f"{n} {u}" for n, u in stack.gateways.items()))  # fmt: skip
        light = await asyncio.wait_for(affinity(stack, args.light, 3, rng, None), TIME_LIMIT_S)
        kill_at = args.loaded // 2 if args.kill else None
        loaded = await asyncio.wait_for(affinity(stack, args.loaded, args.concurrency, rng, kill_at), TIME_LIMIT_S)
        owner = served_by(stack)
        bursts = [await asyncio.wait_for(limit_burst(stack, k), 120) for k in range(BURSTS)]
        burst_sent = sum((b[1] for b in bursts), collections.Counter())
        header_sum, stored, ok, stored_n = await spend_check(stack, light + loaded)
        # The driver: `kvgate bench` across every live process, agent sessions (spend) and one burst at a
        # fresh rpm-limited tenant (the limit), sessions spread over the processes.
        spend_phase = kvgate_bench(stack, BENCHER, "spend", ["--workload", "agent", "--requests", "96", "--warmup",
                                                            "0", "--concurrency", "12", "--max-tokens", "16"])
        limit_phase = kvgate_bench(stack, BENCH_LIMITED, "limit", ["--workload", "chat", "--requests", str(3 * RPM),
                                                                  "--concurrency", str(3 * RPM), "--max-tokens", "2",
                                                                  "--no-stream", "--warmup", "0"])  # fmt: skip
        bench_billed, bench_stored = await bench_spend(stack, spend_phase, "bencher")
        sent = (collections.Counter(o.gateway for o in light + loaded) + burst_sent + spend_phase.sent
                + limit_phase.sent)  # fmt: skip
        audit = metrics_audit(stack, {n: sent.get(n, 0) for n in stack.gateways})
    finally:
        stop(stack)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"\n## Same prefix, same replica (4 sims, prefix_affinity, load_bound {args.load_bound}, "
        f"min_bound {args.min_bound}, spill {args.spill}, "
        f"peer_load {f'every {args.peer_load_s} s' if args.peer_load_s else 'off'})\n"
    )
    round_s = args.peer_load_s or 0.1
    print(
        f"| phase | in flight | requests | **same replica as every other gateway (same prefix, same {round_s} s "
        "round)** | all requests on the home | spilled by bounded load | prefix_home picks on the home "
        "| prefixes with one home from every gateway | on the replica an exact view picks | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    policy = PrefixAffinity(args.load_bound, args.min_bound, args.spill)
    ideal = dictated(light + loaded, owner, stack.sims, policy)
    if args.dump:
        dump(Path(args.dump), light, loaded, owner, ideal)
    for label, conc, phase in (("light", 3, light), ("loaded", args.concurrency, loaded)):
        r = agreement(phase, owner, ideal)
        same, pairs = same_round_agreement(phase, owner, round_s)
        print(
            f"| {label} | {conc} | {r['requests']} | **{same:.1f} %** (of {pairs} with a peer) "
            f"| {r['on_home_pct']:.1f} % | {r['spilled_pct']:.1f} % | {r['home_picks_on_home_pct']:.1f} % "
            f"| {r['prefixes_same_home_pct']:.0f} % of {r['prefixes']} | {r['dictated_pct']:.1f} % | {r['errors']} |"
        )
    print(f"\nreplayed homes = observed prefix_home replicas: {home_check(light + loaded, owner, stack.sims)}")
    if any(o.decided_us > 0 for o in light + loaded):
        print("\nBy decision round (the round in which the gateway picked, its own stamp; the table above groups by "
              "the round in which the request reached its sim):\n")  # fmt: skip
        print("| phase | **same replica as every other gateway, same decision round** | snapshot used: decision "
              "round minus snapshot round (share of picks) |")  # fmt: skip
        print("|---|---|---|")
        for label, phase in (("light", light), ("loaded", loaded)):
            same, pairs = same_round_agreement(phase, owner, round_s, by="decision")
            lag = snapshot_lag(phase, round_s)
            n = max(sum(lag.values()), 1)
            lags = ", ".join(f"{k}: {100 * v / n:.1f} %" for k, v in sorted(lag.items(), key=str))
            print(f"| {label} | **{same:.1f} %** (of {pairs}) | {lags} |")
        for label, phase in (("light", light), ("loaded", loaded)):
            stamped = [o for o in phase if o.rid in owner and o.decided_us > 0]
            delays = sorted(owner[o.rid].start - o.decided_us / US for o in stamped)
            crossed = sum(
                _round(_when_us(o, owner, "arrival"), round_s) != _round(o.decided_us, round_s) for o in stamped
            )
            if delays:
                print(f"{label}: pick to arrival at the sim {1000 * delays[len(delays) // 2]:.1f} ms (median), "
                      f"{1000 * delays[9 * len(delays) // 10]:.1f} ms (p90); reached the sim in a later round than "
                      f"decided: {100 * crossed / len(delays):.1f} % of requests")  # fmt: skip
        print("\nWhy requests disagreed (requests, by the first cause that explains each; rounds by arrival at the "
              "sim / by decision):\n")  # fmt: skip
        print("| cause | light, by arrival | light, by decision | loaded, by arrival | loaded, by decision |")
        print("|---|---|---|---|---|")
        groupings = [(ph, by) for ph in (light, loaded) for by in ("arrival", "decision")]
        tallies = [disagreement_causes(ph, owner, round_s, by) for ph, by in groupings]
        for cause in CAUSES:
            print(f"| {cause} | " + " | ".join(str(t[cause]) for t in tallies) + " |")
        print("| total | " + " | ".join(str(sum(t.values())) for t in tallies) + " |")
    for label, phase in (("light", light), ("loaded", loaded)):
        late, n = same_round_agreement(phase, owner, round_s, 0.02)
        print(
            f"{label}: same replica as every other gateway, leaving out each round's first 20 ms: {late:.1f} % of {n}"
        )
    for label, phase in (("light", light), ("loaded", loaded)):
        took = sorted(owner[o.rid].end - owner[o.rid].start for o in phase if o.rid in owner)
        if took:
            print(f"{label}: a request held its sim for {1000 * took[len(took) // 2]:.0f} ms (median), "
                  f"{1000 * took[9 * len(took) // 10]:.0f} ms (p90)")  # fmt: skip
    print("\nWhere a request left the replica the cluster state dictated (share of the phase's requests):\n")
    print("| phase | sent home, state said spill | spilled, state said home | spilled elsewhere than the state |")
    print("|---|---|---|---|")
    for label, phase in (("light", light), ("loaded", loaded)):
        m = mismatches(phase, owner, ideal, stack.sims)
        print(f"| {label} | {m[0]:.1f} % | {m[1]:.1f} % | {m[2]:.1f} % |")
    print(f"\n(store.socket_timeout_s {args.store_timeout}; `uptime`: {os.getloadavg()[0]:.2f} load avg)")
    print(f"\n## One rpm limit ({RPM}/min) across the gateway processes: {3 * RPM} requests at once, {BURSTS} times\n")
    for k, (burst, _) in enumerate(bursts):
        passed = burst.get(200, 0) + burst.get(-200, 0)
        print(
            f"burst {k}: 200 {passed} (of which unenforced, the store timed out and fail_mode open served it: "
            f"{burst.get(-200, 0)}), 429 {burst.get(429, 0)}, other {burst.get(0, 0)} "
            f"-> {'exact' if passed == RPM else 'NOT exact'}"
        )
    print("\n## Spend (tenant spender)\n")
    print(
        f"sum of x-kvgate-cost-usd over {ok} answered requests: {header_sum:.6f} USD; "
        f"in Redis: {stored:.6f} USD over {stored_n} requests; difference {stored - header_sum:+.6f} USD"
    )
    if args.kill:
        print("(B was SIGKILLed mid-run: requests it settled but could not answer are in Redis without a header)")

    print("\n## Driven by `kvgate bench` across every live gateway process (one --base-url each)\n")
    statuses = collections.Counter(r["status"] for r in limit_phase.records)
    verdict = "exact" if statuses.get(200) == RPM and statuses.get(429) == 2 * RPM else "NOT exact"
    print(f"rpm {RPM}/min, {3 * RPM} requests at once over {dict(limit_phase.sent)}: status {dict(statuses)} "
          f"-> {verdict}")
    bench_ok = sum(1 for r in spend_phase.records if r["status"] == 200)
    print(f"agent sessions, {bench_ok} of {len(spend_phase.records)} answered over {dict(spend_phase.sent)}: "
          f"billed (sum of x-kvgate-cost-usd the bench recorded) {bench_billed:.6f} USD; in Redis "
          f"{bench_stored:.6f} USD; difference {bench_stored - bench_billed:+.6f} USD")  # fmt: skip
    print("\n## /metrics per process (4 scrapes each, new connection each)\n")
    print("| gateway | each family once | worker labels | gateway_requests_total / requests sent |")
    print("|---|---|---|---|")
    for row in audit:
        print("| " + " | ".join(row) + " |")
    print(f"\ntotal {time.monotonic() - t0:.0f} s")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--_sim":
        _sim_child(int(sys.argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--light", type=int, default=240, help="requests in the light phase (3 in flight)")
    p.add_argument("--loaded", type=int, default=480, help="requests in the loaded phase")
    p.add_argument("--concurrency", type=int, default=48, help="in flight in the loaded phase")
    p.add_argument("--kill", action="store_true", help="SIGKILL gateway B halfway through the loaded phase")
    p.add_argument("--redis-url", help="an existing Redis (keys under a fresh prefix); default: a throwaway one")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--store-timeout", type=float, default=0.25, help="store.socket_timeout_s (the default: 0.25)")
    p.add_argument("--load-bound", type=float, default=1.25, help="prefix_affinity's c (its load_bound's default)")
    p.add_argument(
        "--min-bound", type=int, default=0, help="prefix_affinity's min_bound (requests a home always takes)"
    )
    p.add_argument(
        "--spill", choices=["least_loaded", "ranked"], default="least_loaded", help="prefix_affinity's spill order"
    )
    p.add_argument(
        "--peer-load-s",
        type=float,
        default=0.1,
        help="routing.peer_load.interval_s (0: peer load off, each process sees only its own in-flight)",
    )
    p.add_argument("--keep", action="store_true", help="keep the logs folder")
    p.add_argument("--dump", help="write every affinity request (gateway, prefix, stamps, replica) as JSON lines")
    args = p.parse_args()
    if not args.redis_url and shutil.which("redis-server") is None:
        sys.exit("needs redis-server or --redis-url")
    asyncio.run(run(args))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
