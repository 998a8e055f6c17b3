"""The composition root: builds every stage and background service from the config, starts and stops them,
rebuilds the cluster in place after rediscovery, and registers the hooks of the optional features it enables.

It holds no request logic: `Gateway.handle` is the path's (app/pipeline.py). A new optional feature is a
`PathHook` in its own package plus one line in `_hooks`; the path is not edited.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp

from app.admission.hook import FairAdmission
from app.admission.metrics import register_queue_metrics
from app.admission.step import build_queues
from app.call_estimate import CallPricing
from app.cancel import cancel_and_wait
from app.config import GatewayConfig
from app.dispatch import Dispatcher
from app.hooks import Hooks, PathHook
from app.kvcache.build import event_sources, kv_hub
from app.kvcache.hashers import BlockHashers
from app.kvcache.hook import BlockHashing
from app.kvcache.metrics import register_kv_metrics
from app.kvcache.replies import ReplyLearner
from app.limits import Limiter
from app.normalize import VolatilityMemory
from app.normalize.shared import SharedLearning
from app.pipeline import Path
from app.prewarm.hook import PrewarmRecord
from app.prewarm.memory import PrefixMemory
from app.prewarm.warmer import Prewarmer
from app.reply import Reply
from app.routing.discovery import Discoverer
from app.routing.engine_read import Disagreements
from app.routing.peer_load import PeerLoad
from app.routing.replica_metrics import register_replica_metrics
from app.routing.response_affinity import ResponseRoutes
from app.routing.response_hook import ResponsePinning
from app.routing.scraper import Scraper
from app.routing.state import ClusterState
from app.routing.tpot.hook import TpotLearning
from app.settle import Settler
from app.spend_metrics import register_spend_metrics
from app.store.base import Store
from app.store.factory import create_store
from app.telemetry import Telemetry
from app.tenancy import TenantRegistry
from app.upstream import AiohttpTransport, create_session

if TYPE_CHECKING:
    from app.context import RequestContext


class Gateway:
    """Every long-lived part, created once per app; `start()` opens the upstream and the background services."""

    def __init__(self, cfg: GatewayConfig, *, store: Store | None = None, telemetry: Telemetry | None = None) -> None:
        self.cfg = cfg
        # Created in start(): an aiohttp session belongs to the running event loop.
        self.session: aiohttp.ClientSession | None = None
        self.scraper: Scraper | None = None
        self.dispatcher: Dispatcher | None = None
        self.path: Path | None = None
        self.store = store or create_store(cfg.store)
        # Tenants are built here once, with their limits (a lease outliving the longest upstream read) and prices.
        self.registry = TenantRegistry(cfg, self.store)
        self.limiter = Limiter(self.store, cfg.store.fail_mode)
        self.telemetry = telemetry or Telemetry(cfg.telemetry, cfg.pools)
        self.settler = Settler(cfg, self.limiter, self.telemetry)
        self.memory = VolatilityMemory(
            capacity_per_tenant=cfg.normalize.memory_per_tenant, secret=cfg.normalize.salt_secret
        )
        self.shared_learning = SharedLearning.for_config(cfg, self.memory, self.store)
        self.kv_hub = kv_hub(cfg)
        self.cluster = ClusterState.from_config(cfg, kv_hub=self.kv_hub)
        self.discoverer = Discoverer.for_config(cfg, self._rediscovered)
        # A replica that becomes healthy replays the top stable prefixes it will serve before it joins.
        self.prefixes = PrefixMemory(cfg.routing.prewarm)
        self.prewarmer = (
            Prewarmer(cfg.routing.prewarm, self.prefixes, self.cluster, meter=self.telemetry.meter,
                      tracer=self.telemetry.tracer)
            if cfg.routing.prewarm.enabled else None
        )
        self.peer_load = PeerLoad.for_config(cfg, self.store, lambda: self.cluster, self.telemetry.meter)
        # Fair admission per pool that enables it (pools.<p>.admission); fed by the scraper's rounds.
        self.queues = build_queues({name: pool.admission for name, pool in cfg.pools.items()})
        self.responses = ResponseRoutes(self.store, cfg.routing.response_ttl_s)
        self.admission = (
            FairAdmission(self.queues, lambda: self.cluster, cfg.routing, self.telemetry) if self.queues else None
        )
        self.disagreements = Disagreements()  # config vs what the replicas publish (app/routing/engine_read.py)
        hashers = BlockHashers(cfg, self.kv_hub, lambda: self.cluster, self.disagreements)
        self.blocks = BlockHashing(hashers) if self.kv_hub is not None else None
        self.replies = self.blocks.replies if self.blocks is not None else ReplyLearner({})
        self.hooks = Hooks.of(self._hooks())
        self._background: list[asyncio.Task[Any]] = []

    def _hooks(self) -> list[PathHook]:
        """The hooks of the features this config enables, in the order the path meets them at each point."""
        hooks: list[PathHook] = [ResponsePinning(self.responses), CallPricing(self.limiter)]
        if self.admission is not None:
            hooks.append(self.admission)
        if self.blocks is not None:
            hooks.append(self.blocks)
        if self.prewarmer is not None:
            hooks.append(PrewarmRecord(self.prefixes))
        if (tpot := TpotLearning.install(self.cfg, self.cluster, self.telemetry.meter)) is not None:
            hooks.append(tpot)
        return hooks

    async def start(self) -> None:
        """Open the upstream session, load tenant keys, start replica probes and the spend flusher."""
        self.session = create_session(self.cfg.upstream)
        self.dispatcher = Dispatcher(
            self.cfg, self.cluster, AiohttpTransport(self.session), on_attempt=self.telemetry.upstream_started,
            on_pick=self.hooks.after_pick_runner(),
        )
        self.path = Path(self.cfg, registry=self.registry, limiter=self.limiter, memory=self.memory,
                         dispatcher=self.dispatcher, settler=self.settler, telemetry=self.telemetry,
                         hooks=self.hooks)
        self.scraper = Scraper(
            self.cluster, self.session, self.cfg.routing,
            on_scrape=self.admission.on_scrape if self.admission is not None else None,
            on_health=self.prewarmer.on_health if self.prewarmer is not None else None,
            disagreements=self.disagreements,
        )
        await self.registry.load()
        if self.shared_learning is not None:  # before serving: a new replica starts with what others learned
            await self.shared_learning.load()
            self._spawn(self.shared_learning.run(), "kvgate-shared-learning")
        if self.prewarmer is not None:
            await self.prewarmer.start()
        await self.scraper.start()
        register_replica_metrics(self.telemetry.meter, lambda: self.cluster, self.disagreements)
        if self.peer_load is not None:
            self._spawn(self.peer_load.run(), "kvgate-peer-load")
        if self.discoverer is not None:
            self.discoverer.register_metrics(self.telemetry.meter)
            await self.discoverer.start()
        if self.kv_hub is not None:
            register_kv_metrics(self.telemetry.meter, self.kv_hub)
            await self.kv_hub.start()
        if self.queues:
            register_queue_metrics(self.telemetry.meter, self.queues)
        self._spawn(self.limiter.ledger.run(), "kvgate-spend-flush")
        register_spend_metrics(self.telemetry.meter, self.limiter.ledger)

    def _spawn(self, work: Any, name: str) -> None:
        self._background.append(asyncio.create_task(work, name=name))

    async def stop(self) -> None:
        """Stop background work, flush what is buffered, close the store and exporters."""
        for service in (self.discoverer, self.scraper, self.prewarmer, self.kv_hub):
            if service is not None:
                await service.stop()
        for task in self._background:
            await cancel_and_wait(task)
        with contextlib.suppress(Exception):
            await self.limiter.ledger.flush()
        if self.shared_learning is not None:
            await self.shared_learning.flush()  # fails open (False) when the store is down
        await self.store.aclose()
        await self.telemetry.shutdown()
        if self.session is not None:
            await self.session.close()

    def _rediscovered(self, cfg: GatewayConfig) -> None:
        """Discovery changed a pool's replicas: the cluster is rebuilt in place (everyone holding it sees the new
        pools); survivors keep their state, new ones join after a good probe, vanished ones drain."""
        self.cluster.rebuild(cfg, kv_hub=self.kv_hub, probe_before_joining=True)
        if self.kv_hub is not None:  # a discovered replica's KV events follow it in and out
            self.kv_hub.follow(event_sources(cfg))
        if self.scraper is not None:
            self.scraper.track(self.cluster)
        if self.prewarmer is not None:
            self.prewarmer.track(self.cluster)

    # -- what the api layer asks ----------------------------------------------------------------
    # Both hand back the path's own coroutine rather than awaiting it in one of their own: every coroutine in
    # the await chain is resumed at each suspension of the request (an upstream read, a store call).
    def handle(self, ctx: RequestContext) -> Coroutine[Any, Any, Reply]:
        """Run a parsed request through the path (app/pipeline.py); await the result."""
        assert self.path is not None, "Gateway.start() builds the path"
        return self.path.handle(ctx)

    def finished(self, ctx: RequestContext, *, cancelled: bool = False) -> Coroutine[Any, Any, None]:
        """After the last byte was sent, or the client left: settle and the finished hooks; await the result."""
        assert self.path is not None, "Gateway.start() builds the path"
        return self.path.finished(ctx, cancelled=cancelled)

    def unready_models(self) -> list[str]:
        """Models with no healthy replica in any of their pools."""
        return [
            m.name
            for m in self.cfg.models
            if not any(r.available() for p in m.pools for r in self.cluster.pools[p].replicas)
        ]

    def render_metrics(self) -> tuple[bytes, str]:
        """Prometheus text of the gateway's own metrics."""
        return self.telemetry.render_prometheus()
