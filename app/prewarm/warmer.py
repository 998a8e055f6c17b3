"""Hold a replica that just became healthy out of rotation, replay its share of the top prefixes, then let it in.

Triggered by the scraper's health verdict (`on_health`), synchronously, so no request sees the replica before it
is held: a discovered replica after its first good probe, a known one after it was unhealthy (a restart clears
vLLM's prefix cache). What a demanding operator can count on:
- other replicas are never delayed: the replica is out of rotation (its future share keeps going where it went),
  the replays use their own small connection pool, and nothing here runs on the request path;
- a failing replica is never warmed: only a healthy one starts, a bad probe or a failed replay (connect error,
  timeout, 5xx) ends the pre-warm, and the replica joins cold (or, unhealthy, not at all until it recovers);
- it is bounded: `prefixes` replays, `concurrency` at once, `budget_s` of wall time, then it joins whatever is left;
- it never holds capacity a pool needs now: with no other replica in rotation, or all of them queueing, the new
  one joins at once (run result `skipped`);
- only prefixes the replica will serve: under a prefix-keyed policy those whose rendezvous home, among the pool's
  healthy replicas, is the new one (≈ 1/n); under another policy the top prefixes of every tenant;
- each as the most it can fill: a key's latest history (its session so far, history.py) when one is kept, which
  starts with the prefix, else the bare prefix; one replay per key either way, read when it is sent (the newest).
Each run leaves counts (never text) in /metrics, one log line and one `kvgate.prewarm` span.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from opentelemetry.metrics import Counter, Histogram, Meter
from opentelemetry.trace import Tracer

from app.config.prewarm import PrewarmConfig
from app.prewarm.memory import Prefix, PrefixMemory
from app.routing.hashing import GOLDEN64, MASK64
from app.routing.state import ClusterState, ReplicaState
from app.telemetry import instruments as ins

if TYPE_CHECKING:
    from app.surfaces.base import WarmRequest

log = logging.getLogger(__name__)

KEYED_POLICIES = frozenset({"prefix_affinity", "kv_events"})  # kv_events falls back to the rendezvous home


def home_of(key: int, replicas: list[ReplicaState]) -> ReplicaState:
    """The rendezvous home of `key` among `replicas` (prefix_affinity's score)."""
    return max(replicas, key=lambda r: ((key ^ r.hash) * GOLDEN64) & MASK64)


RUN_RESULTS = ("done", "budget", "failed", "aborted", "skipped")
REPLAY_OUTCOMES = ("ok", "skipped", "failed", "capped")
TOKEN_TYPES = ("uncached", "cached")


@dataclass(slots=True)
class Run:
    """One pre-warm's counts."""

    planned: int
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    histories: int = 0  # replays that were a session's history, not a bare prefix
    chars: int = 0  # sent so far, against run_max_chars
    capped: int = 0  # prefixes not sent: they would have passed run_max_chars
    result: str = "done"  # done | budget | failed | aborted | skipped


class Prewarmer:
    """Pre-warms replicas as they become healthy; `track` follows a rebuilt cluster."""

    def __init__(
        self,
        cfg: PrewarmConfig,
        memory: PrefixMemory,
        cluster: ClusterState,
        *,
        meter: Meter | None = None,
        tracer: Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.memory = memory
        self.cluster = cluster
        self._tracer = tracer
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.runs: list[Run] = []  # the last few, for tests and the experiment
        self._requests: Counter | None = None
        self._runs: Counter | None = None
        self._duration: Histogram | None = None
        self._tokens: Counter | None = None
        if meter is not None:
            self._requests = ins.instrument(meter, ins.PREWARM_REQUESTS)
            self._runs = ins.instrument(meter, ins.PREWARM_RUNS)
            self._duration = ins.instrument(meter, ins.PREWARM_DURATION)
            self._tokens = ins.instrument(meter, ins.PREWARM_TOKENS)
            # Every series from 0: a counter whose first scrape already reads 1 shows no increase in Prometheus,
            # and a pool's first pre-warm (often its only one) would vanish from the panels.
            for pool in cluster.pools:
                for result in RUN_RESULTS:
                    self._runs.add(0, {"pool": pool, "result": result})
                for outcome in REPLAY_OUTCOMES:
                    self._requests.add(0, {"pool": pool, "outcome": outcome})
                for kind in TOKEN_TYPES:
                    self._tokens.add(0, {"pool": pool, "type": kind})

    async def start(self) -> None:
        """Open the replays' own connection pool (requests to other replicas never wait behind it)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.cfg.concurrency * 4, limit_per_host=self.cfg.concurrency)
            self._session = aiohttp.ClientSession(connector=connector)

    async def stop(self) -> None:
        """Cancel running pre-warms (their replicas join) and close the pool."""
        tasks, self._tasks = list(self._tasks.values()), {}
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._session is not None:
            await self._session.close()
            self._session = None

    def track(self, cluster: ClusterState) -> None:
        """Follow a rebuilt cluster: a replica that left stops being warmed."""
        self.cluster = cluster
        present = {(r.pool, r.url) for r in cluster.replicas()}
        for key in [k for k in self._tasks if k not in present]:
            self._tasks.pop(key).cancel()

    def on_health(self, replica: ReplicaState, was_healthy: bool) -> None:
        """After a /health verdict: hold and warm a replica that just became healthy; stop one that failed."""
        key = (replica.pool, replica.url)
        if not replica.healthy:
            task = self._tasks.pop(key, None)
            if task is not None:
                task.cancel()
            return
        if was_healthy or not self.cfg.enabled or key in self._tasks or self._session is None:
            return
        plan = self.plan(replica)
        if not plan:
            return  # nothing it would serve is known: it joins at once
        if not self._pool_can_wait(replica):
            self._report(replica, Run(len(plan), result="skipped"), 0.0, None)
            return
        replica.set_warming(True)
        run = Run(len(plan))
        span = self._tracer.start_span("kvgate.prewarm") if self._tracer is not None else None
        task = asyncio.create_task(self._warm(replica, plan, run), name=f"kvgate-prewarm {replica.url}")
        # A callback, not a `finally`: a task cancelled before its first step never runs its body.
        task.add_done_callback(functools.partial(self._finished, replica, run, self._clock(), span))
        self._tasks[key] = task

    def _pool_can_wait(self, replica: ReplicaState) -> bool:
        """Hold a replica only while another one serves its pool and not all of those queue: a pool with no other
        replica, or a saturated one, needs the capacity now more than a warm cache."""
        pool = self.cluster.pools.get(replica.pool)
        others = [r for r in pool.replicas if r is not replica and r.available()] if pool is not None else []
        return bool(others) and not all(r.queued() > 0 for r in others)

    def plan(self, replica: ReplicaState) -> list[Prefix]:
        """The prefixes to replay to `replica`: its share of its pool's top prefixes, at most `prefixes`."""
        pool = self.cluster.pools.get(replica.pool)
        if pool is None:
            return []
        top = self.memory.top(replica.pool)
        if pool.policy.name in KEYED_POLICIES:
            peers = [r for r in pool.replicas if r.healthy or r is replica]
            top = [p for p in top if home_of(p.key, peers) is replica]
        return top[: self.cfg.prefixes]

    async def _warm(self, replica: ReplicaState, plan: list[Prefix], run: Run) -> None:
        todo = iter(plan)
        try:
            async with asyncio.timeout(self.cfg.budget_s):
                await asyncio.gather(*(self._worker(replica, todo, run) for _ in range(self.cfg.concurrency)))
        except TimeoutError:
            run.result = "budget"
            return
        if run.failed:
            run.result = "failed"

    def _finished(self, replica: ReplicaState, run: Run, start: float, span: Any, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            run.result = "aborted"  # a bad probe, the replica left, or the gateway stops
        elif task.exception() is not None:
            run.result = "failed"
            log.error("prewarm of %s failed", replica.url, exc_info=task.exception())
        key = (replica.pool, replica.url)
        if self._tasks.get(key) is task:
            del self._tasks[key]
        replica.set_warming(False)
        self._report(replica, run, self._clock() - start, span)

    async def _worker(self, replica: ReplicaState, todo: Iterator[Prefix], run: Run) -> None:
        pool = self.cluster.pools.get(replica.pool)
        if pool is None or self._session is None:
            return
        served = pool.cfg.served_model
        for prefix in todo:
            if run.failed or not replica.healthy:
                return
            outcome = await self._replay(replica.url, prefix, served, run)
            if self._requests is not None:
                self._requests.add(1, {"pool": replica.pool, "outcome": outcome})

    async def _replay(self, url: str, prefix: Prefix, served: str, run: Run) -> str:
        request = prefix.replay()
        # Within run_max_chars (what the replica's KV cache holds): a history that would pass it goes as its
        # prefix, a prefix that would is not sent. Checked and counted before the send: the workers share `run`.
        cap = self.cfg.run_max_chars
        if request is not prefix.request and run.chars + request.chars > cap:
            request = prefix.request
        if run.chars + request.chars > cap:
            run.capped += 1
            return "capped"
        run.chars += request.chars
        outcome = await self._send(url, prefix, request, served, run)
        if outcome == "skipped" and request is not prefix.request:
            # A history the engine refuses (longer than its context, say): the prefix is still worth its blocks.
            run.skipped -= 1
            outcome = await self._send(url, prefix, prefix.request, served, run)
        return outcome

    async def _send(self, url: str, prefix: Prefix, request: WarmRequest, served: str, run: Run) -> str:
        assert self._session is not None
        # On the surface the prefix came in on, as its requests reach vLLM (served name, the tenant's salt).
        body = prefix.surface.upstream_body(request.body, served_model=served, priority=None,
                                            cache_salt=prefix.salt)  # fmt: skip
        try:
            async with self._session.post(
                url + request.path, data=orjson.dumps(body), headers={"content-type": "application/json"}
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, OSError):
            run.failed += 1
            return "failed"
        if status >= 500:
            run.failed += 1
            return "failed"
        if status != 200:  # this prefix's problem (too long for the context, a template it rejects)
            run.skipped += 1
            return "skipped"
        run.ok += 1
        run.histories += request is not prefix.request
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            usage = prefix.surface.reply_usage(orjson.loads(raw))
            run.prompt_tokens += usage.prompt_tokens
            run.cached_tokens += usage.cached_tokens
        return "ok"

    def _report(self, replica: ReplicaState, run: Run, seconds: float, span: Any) -> None:
        attrs = {"pool": replica.pool, "result": run.result}
        if self._runs is not None and self._duration is not None and self._tokens is not None:
            self._runs.add(1, attrs)
            self._duration.record(seconds, attrs)
            uncached, cached = TOKEN_TYPES
            self._tokens.add(run.prompt_tokens - run.cached_tokens, {"pool": replica.pool, "type": uncached})
            self._tokens.add(run.cached_tokens, {"pool": replica.pool, "type": cached})
        self.runs = [*self.runs[-15:], run]
        # A pre-warm that failed or ran out of budget let a replica in cold: worth an operator's attention.
        level = logging.WARNING if run.result in ("failed", "budget") else logging.INFO
        log.log(level, "prewarm pool=%s replica=%s result=%s planned=%d ok=%d histories=%d skipped=%d failed=%d "
                 "capped=%d prompt_tokens=%d cached_tokens=%d seconds=%.2f", replica.pool, replica.url, run.result,
                 run.planned, run.ok, run.histories, run.skipped, run.failed, run.capped, run.prompt_tokens,
                 run.cached_tokens, seconds)  # fmt: skip
        if span is not None:
            span.set_attributes({
                "kvgate.pool": replica.pool, "server.address": replica.url, "kvgate.prewarm.result": run.result,
                "kvgate.prewarm.planned": run.planned, "kvgate.prewarm.ok": run.ok,
                "kvgate.prewarm.histories": run.histories,
                "kvgate.prewarm.skipped": run.skipped, "kvgate.prewarm.failed": run.failed,
                "kvgate.prewarm.capped": run.capped,
                "kvgate.prewarm.prompt_tokens": run.prompt_tokens, "kvgate.prewarm.cached_tokens": run.cached_tokens,
            })  # fmt: skip
            span.end()
