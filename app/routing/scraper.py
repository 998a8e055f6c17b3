"""Background probes: one asyncio task per replica polls /health and /metrics and updates ReplicaState."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

import aiohttp

from app.config import RoutingConfig
from app.routing.engine_read import Disagreements, EngineReader
from app.routing.promtext import parse_metrics
from app.routing.state import ClusterState, ReplicaState

log = logging.getLogger(__name__)

# Spread the probes of many replicas over the interval instead of firing them in lockstep.
JITTER = 0.1


class Scraper:
    """Keeps every replica's health and load fresh; start() after the app's aiohttp session exists."""

    def __init__(
        self,
        cluster: ClusterState,
        session: aiohttp.ClientSession,
        cfg: RoutingConfig,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_scrape: Callable[[ReplicaState], None] | None = None,
        on_health: Callable[[ReplicaState, bool], None] | None = None,
        disagreements: Disagreements | None = None,
    ) -> None:
        self.cluster = cluster
        # What each replica publishes about its engine (block size, speculation, max_model_len, ...).
        self.engine = EngineReader(cluster, disagreements)
        # Called right after each /health verdict with whether the replica was healthy before it, before any
        # await: a replica that just became healthy can be held (pre-warm) before a request sees it.
        self._on_health = on_health
        # Called after each probe of a replica (healthy or not): state that depends on fresh load follows it.
        self._on_scrape = on_scrape
        self.session = session
        self.cfg = cfg
        self._rng = rng or random.Random()
        self._clock = clock
        # One polling task per replica, keyed by (pool, url); track() follows a rebuilt cluster.
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._started = False
        # Two intervals (clamped to routing.probe_timeout_min_s..max_s): a busy engine answers /health late,
        # and a late answer is not a dead engine; a probe that takes longer than that is counted as failed.
        self._timeout = aiohttp.ClientTimeout(
            total=min(max(2 * cfg.probe_interval_s, cfg.probe_timeout_min_s), cfg.probe_timeout_max_s)
        )

    async def start(self) -> None:
        """Start one polling task per replica (idempotent)."""
        if self._started:
            return
        self._started = True
        self.track(self.cluster)

    def track(self, cluster: ClusterState) -> None:
        """Probe `cluster`'s replicas from now on: new ones get a task, vanished ones' tasks end."""
        self.cluster = cluster
        self.engine.cluster = cluster
        if not self._started:
            return
        wanted = {(r.pool, r.url): r for r in cluster.replicas()}
        for key in [k for k in self._tasks if k not in wanted]:
            self._tasks.pop(key).cancel()
        for key, replica in wanted.items():
            if key not in self._tasks:
                self._tasks[key] = asyncio.create_task(self._run(replica), name=f"kvgate-probe {replica.url}")

    async def stop(self) -> None:
        """Cancel the polling tasks and wait for them to end."""
        tasks, self._tasks = list(self._tasks.values()), {}
        self._started = False
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def probe_once(self, replica: ReplicaState) -> None:
        """One round: /health decides health; when healthy, /metrics refreshes load and counters."""
        ok = await self._health(replica)
        was_healthy = replica.healthy
        replica.apply_probe(ok, self.cfg.healthy_after, self.cfg.unhealthy_after)
        if self._on_health is not None:
            self._on_health(replica, was_healthy)
        if not ok:
            self.engine.on_unhealthy(replica)
            return
        asked_at = self._clock()
        text = await self._get_text(replica.url + "/metrics")
        if text is None:
            replica.clear_metrics()
            return
        replica.apply_metrics(parse_metrics(text), self._clock(), asked_at)
        self.engine.on_metrics(replica, text)
        await self.engine.read_once(self.session, replica, self._timeout)

    async def _run(self, replica: ReplicaState) -> None:
        interval = self.cfg.probe_interval_s
        await asyncio.sleep(self._rng.uniform(0, interval * JITTER))
        while True:
            try:
                await self.probe_once(replica)
                if self._on_scrape is not None:
                    self._on_scrape(replica)
            except asyncio.CancelledError:
                raise
            except Exception:  # a probe bug must not kill the task: health would freeze as it was
                log.exception("probe of %s failed", replica.url)
            await asyncio.sleep(interval * self._rng.uniform(1 - JITTER, 1 + JITTER))

    async def _health(self, replica: ReplicaState) -> bool:
        try:
            async with self.session.get(replica.url + "/health", timeout=self._timeout) as resp:
                await resp.read()
                if resp.status != 200:
                    replica.last_error = f"health {resp.status}"
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError) as err:
            replica.last_error = f"health {type(err).__name__}"
            return False

    async def _get_text(self, url: str) -> str | None:
        try:
            async with self.session.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return None
                return await resp.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None
