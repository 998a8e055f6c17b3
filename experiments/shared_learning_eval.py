"""Issue 14, shared learning: the first request per tenant on a freshly started gateway replica, warm vs cold.

One Redis (a throwaway `redis-server`, or `--redis-url` with a unique key prefix), two `kvgate sim --profile
h100-8b` upstreams in one prefix-affinity pool, and `kvgate serve` processes in front of them, each its own
process on the same Redis:

  1. gateway A serves `--learn` requests per tenant of an agent-shaped trace, then stops (SIGTERM: it writes
     what it learned on the way out; the script also waits until Redis holds it);
  2. a fresh gateway B (a new process, same config and Redis) serves `--measure` requests per tenant, each the
     first turn of a new session (new user, new nonce, new time and request id: what a replica that starts or
     restarts meets).

The trace: a chat request whose system prompt starts with four volatile lines, then ~4 KB of static
instructions (Claude-Code-like) and the user's task:

  x-client-header: cc_version=2.1.37; cc_entrypoint=cli; cch=<5 hex>;   learned (no typed rule): 3 requests
  Current time: <ISO 8601>                                              typed, presumed volatile at first sight
  Request ID: req_<16 hex>                                              typed, presumed volatile at first sight
  User ID: user_<n>                                                     typed, volatile once seen to change

Arms, each with its own tenants (own cache_salt, so no arm meets another's blocks) and key prefix:

  cold      share_learning off on both gateways: today's cold start (B re-learns from scratch)
  shared    share_learning on (the default): B loads A's fingerprints before it serves
  in-place  no restart: A itself serves the measured requests (the warm replica B could at best equal)

Cached tokens are the sims' `usage.prompt_tokens_details.cached_tokens` over `usage.prompt_tokens`.

    .venv/bin/python experiments/shared_learning_eval.py                 # 8 tenants, 3 learning + 3 measured each
    .venv/bin/python experiments/shared_learning_eval.py --tenants 4 --json /tmp/shared-learning.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import openai
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_trace_eval import CLAUDE_IDENTITY, CLAUDE_INSTRUCTIONS, TASKS  # noqa: E402
from normalize_eval import gateway_process, sim_processes  # noqa: E402

from kvlab.configs import gateway_config as lab_config  # noqa: E402
from kvlab.redis_server import RedisServer  # noqa: E402

MODEL = "llama-3.1-8b"
SECRET = "shared-learning-eval"
ARMS = ("cold", "shared", "in-place")
BASE_TIME = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Turn:
    """One request's volatile values (one session's first turn)."""

    nonce: str
    time: str
    request_id: str
    user: str
    task: str


def turns(arm: str, tenant: int, n: int, seed: int) -> list[Turn]:
    """`n` first turns of new sessions for one tenant: every volatile value new each time."""
    rng = random.Random(f"{seed}/{arm}/{tenant}")
    out = []
    for k in range(n):
        t = BASE_TIME + timedelta(minutes=7 * k, seconds=rng.randint(0, 59))
        out.append(Turn(nonce=f"{rng.getrandbits(20):05x}", time=f"{t:%Y-%m-%dT%H:%M:%S}.{rng.randint(0, 999):03d}Z",
                        request_id=f"req_{rng.getrandbits(64):016x}", user=f"user_{rng.randint(10_000, 99_999)}",
                        task=TASKS[(tenant + k) % len(TASKS)]))  # fmt: skip
    return out


def messages(t: Turn) -> list[dict[str, str]]:
    """The chat messages of one turn: volatile head, static instructions, the user's task."""
    system = (
        f"x-client-header: cc_version=2.1.37; cc_entrypoint=cli; cch={t.nonce};\n"
        f"Current time: {t.time}\nRequest ID: {t.request_id}\nUser ID: {t.user}\n\n"
        f"{CLAUDE_IDENTITY}\n\n{CLAUDE_INSTRUCTIONS}"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": t.task}]


@dataclass
class Sent:
    """One measured request."""

    tenant: str
    prompt: int
    cached: int
    header: str


@dataclass
class ArmResult:
    """What one arm measured on its measuring gateway."""

    arm: str
    tenants: int
    learn: int
    sent: list[Sent] = field(default_factory=list)
    shared_fingerprints: int = 0  # in Redis after A stopped, summed over the arm's tenants

    def ratio(self, k: int | None) -> tuple[int, int]:
        """(Σcached, Σprompt) of the k-th measured request per tenant (None: all of them)."""
        per: dict[str, int] = {}
        cached = prompt = 0
        for s in self.sent:
            i = per.get(s.tenant, 0)
            per[s.tenant] = i + 1
            if k is None or i == k:
                cached += s.cached
                prompt += s.prompt
        return cached, prompt


# -- processes -------------------------------------------------------------------------------------


@contextlib.contextmanager
def throwaway_redis() -> Iterator[str]:
    """A `redis-server` on a free loopback port, no persistence; yields its URL."""
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not installed: pass --redis-url")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


def gateway_config(replicas: list[str], redis_url: str, prefix: str, tenant_ids: list[str], *, share: bool) -> dict:
    """One model, one prefix-affinity pool over the sims, the arm's tenants (normalize on), the shared Redis."""
    return lab_config(
        {"main": {"role": "interactive", "replicas": replicas, "policy": "prefix_affinity"}},
        model=MODEL, price={"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 6000.0},
        tenants=[{"id": t, "api_keys": [f"sk-{t}"], "default_class": "interactive", "normalize": "on"}
                 for t in tenant_ids],
        listen={"host": "127.0.0.1", "port": 0, "drain_s": 2, "drain_notice_s": 0},
        store={"url": redis_url, "key_prefix": prefix},
        normalize={"salt_secret": SECRET, "share_learning": share, "shared_refresh_s": 0.5},
        upstream={"read_timeout_s": 60},
    )


# -- the driver ------------------------------------------------------------------------------------


async def send(base: str, tenant: str, t: Turn, max_tokens: int) -> Sent:
    """One chat request with the OpenAI SDK; its usage and x-kvgate-normalized header."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=f"sk-{tenant}", max_retries=0, timeout=60)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(t), max_tokens=max_tokens,  # type: ignore[arg-type]
            extra_body={"ignore_eos": True, "temperature": 0},
        )
        usage = raw.parse().usage
    finally:
        await client.close()
    assert usage is not None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Sent(tenant, usage.prompt_tokens, cached, raw.headers.get("x-kvgate-normalized", ""))


async def serve_turns(base: str, tenant_ids: list[str], plan: dict[str, list[Turn]], max_tokens: int) -> list[Sent]:
    """Each tenant's turns in order (one tenant after another: a tenant's k-th request follows its k-1-th)."""
    out = []
    for tid in tenant_ids:
        for t in plan[tid]:
            out.append(await send(base, tid, t, max_tokens))
    return out


def wait_shared(redis_url: str, prefix: str, tenant_ids: list[str], timeout_s: float = 15) -> int:
    """Until every tenant's shared set is non-empty (A flushes every 0.5 s); the fingerprints held in all."""
    client = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            sizes = [int(client.zcard(f"{prefix}{{{t}}}:volatile")) for t in tenant_ids]
            if all(sizes) or time.monotonic() > deadline:
                return sum(sizes)
            time.sleep(0.2)
    finally:
        client.close()


def run_arm(arm: str, replicas: list[str], redis_url: str, args: argparse.Namespace) -> ArmResult:
    """Gateway A learns, then (bar in-place) a fresh gateway B serves the measured turns."""
    run_tag = uuid.uuid4().hex[:6]
    tenant_ids = [f"{arm}-{run_tag}-{i}" for i in range(args.tenants)]
    prefix = f"kvgate-shared-eval:{run_tag}:{arm}:"
    plans = {tid: turns(arm, i, args.learn + args.measure, args.seed) for i, tid in enumerate(tenant_ids)}
    learn = {tid: p[: args.learn] for tid, p in plans.items()}
    measure = {tid: p[args.learn :] for tid, p in plans.items()}
    cfg = gateway_config(replicas, redis_url, prefix, tenant_ids, share=arm != "cold")
    result = ArmResult(arm, args.tenants, args.learn)
    with gateway_process(cfg) as a:
        asyncio.run(serve_turns(a, tenant_ids, learn, args.max_tokens))
        if arm == "in-place":
            result.sent = asyncio.run(serve_turns(a, tenant_ids, measure, args.max_tokens))
            return result
        if arm == "shared":  # written by A's refresh task while it runs (its stop writes the rest)
            wait_shared(redis_url, prefix, tenant_ids)
    if arm == "shared":
        result.shared_fingerprints = wait_shared(redis_url, prefix, tenant_ids, timeout_s=0)
    with gateway_process(cfg) as b:  # a new process: its volatility memory is empty bar what it loads
        result.sent = asyncio.run(serve_turns(b, tenant_ids, measure, args.max_tokens))
    return result


# -- output ----------------------------------------------------------------------------------------


def _pct(cached: int, prompt: int) -> str:
    return f"{cached / prompt * 100:.1f}%" if prompt else "-"


def markdown(results: list[ArmResult], args: argparse.Namespace) -> str:
    """The table of ratios, cold start as the baseline."""
    base = {r.arm: r for r in results}.get("cold")
    lines = [
        f"**shared learning** — 2 x `kvgate sim --profile h100-8b` in one prefix_affinity pool, one Redis, "
        f"{args.tenants} tenants x ({args.learn} requests on gateway A, then {args.measure} on a fresh gateway B), "
        f"{args.max_tokens} output tokens",
        "",
        "| arm | B's 1st request per tenant: Σcached / Σprompt | vs cold | B's first "
        f"{args.measure}: Σcached / Σprompt | vs cold | header of B's 1st request | fingerprints in Redis |",
        "|---|--:|--:|--:|--:|---|--:|",
    ]
    for r in results:
        c1, p1 = r.ratio(0)
        ca, pa = r.ratio(None)
        vs1 = vsa = "-"
        if base is not None:
            b1, bp1 = base.ratio(0)
            ba, bpa = base.ratio(None)
            vs1 = f"{(c1 / p1) / (b1 / bp1):.1f}x" if b1 and p1 and bp1 else ("∞" if c1 else "-")
            vsa = f"{(ca / pa) / (ba / bpa):.1f}x" if ba and pa and bpa else ("∞" if ca else "-")
        first = [s.header for s in r.sent[:: args.measure]]
        header = max(set(first), key=first.count) if first else "-"
        fps = str(r.shared_fingerprints) if r.arm == "shared" else "-"
        lines.append(f"| {r.arm} | {_pct(c1, p1)} ({c1:,} / {p1:,}) | {vs1} | {_pct(ca, pa)} ({ca:,} / {pa:,}) | "
                     f"{vsa} | `{header}` ({first.count(header)}/{len(first)}) | {fps} |")
    return "\n".join(lines)


def main() -> int:
    """CLI entry."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenants", type=int, default=8, choices=range(1, 65), metavar="1..64")
    p.add_argument("--learn", type=int, default=3, choices=range(1, 11), metavar="1..10",
                   help="requests per tenant on gateway A (the learned nonce needs 3)")
    p.add_argument("--measure", type=int, default=3, choices=range(1, 11), metavar="1..10",
                   help="requests per tenant on gateway B")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--redis-url", default=None, help="an existing Redis (keys go under a unique prefix)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if any(a not in ARMS for a in arms):
        p.error(f"--arms: of {', '.join(ARMS)}")
    started = datetime.now(UTC)
    with contextlib.ExitStack() as es:
        redis_url = args.redis_url or es.enter_context(throwaway_redis())
        replicas = es.enter_context(sim_processes(2, MODEL, 1.0))
        results = []
        for arm in arms:
            print(f"[{datetime.now(UTC):%H:%M:%S}] arm {arm} ...", file=sys.stderr)
            results.append(run_arm(arm, replicas, redis_url, args))
    wall = (datetime.now(UTC) - started).total_seconds()
    print(f"Measured {started:%Y-%m-%d %H:%M} UTC, {wall:.0f} s of wall time.\n")
    print(markdown(results, args))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
