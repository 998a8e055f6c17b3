"""The request path, one way: api → tenancy → limits → normalize → classify → pick → upstream → settle.

`Gateway.handle` runs the stages in that order; each stage is its own module (README: how a request
flows). Nothing here retries, prices or parses: the dispatcher, the settler and the surfaces do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiohttp

from app.admission import AdmissionRejected
from app.admission.step import build_queues, predicted_tokens, queue_error, route_suffix
from app.call_estimate import estimate_call
from app.config import GatewayConfig, ModelConfig
from app.context import RequestContext, Tenant
from app.dispatch import Complete, Dispatcher, StreamRelay
from app.errors import GatewayError
from app.headers import API_KEY, LIMIT, NORMALIZE_OPT_OUT, NORMALIZED, REQUEST_ID, ROUTE
from app.kvcache.replies import ReplyLearner
from app.kvcache.subscriber import EventSource, KvEventsHub
from app.kvcache.tokens import ChatRenderError
from app.limits import Limiter
from app.normalize import VolatilityMemory, normalize, salt_for_tenant
from app.normalize.shared import SharedLearning
from app.prewarm.memory import PrefixMemory
from app.prewarm.warmer import Prewarmer
from app.routing.classify import classify
from app.routing.discovery import Discoverer
from app.routing.kv_events import KvEventsParams
from app.routing.peer_load import PeerLoad
from app.routing.prefix_key import routing_key
from app.routing.response_affinity import Holder, ResponseRoutes
from app.routing.scraper import Scraper
from app.routing.spill import cached_home_and_other
from app.routing.state import ClusterState, ReplicaState
from app.settle import Settler
from app.store.base import Store
from app.store.factory import create_store
from app.surfaces import CHAT, RESPONSES
from app.telemetry import Telemetry
from app.telemetry.headers import OVERHEAD_HEADER, format_ms, overhead_s, response_headers, sse_trailer
from app.telemetry.kv_metrics import register_kv_metrics
from app.telemetry.queue_metrics import register_queue_metrics
from app.telemetry.replica_metrics import register_replica_metrics
from app.tenancy import TenantRegistry
from app.upstream import AiohttpTransport, create_session

if TYPE_CHECKING:
    from app.kvcache.tokens import RequestBlocks


@dataclass(slots=True)
class Reply:
    """What the api layer sends back: either a complete body or an SSE stream."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


class Gateway:
    """Holds the stages' long-lived state (created once per app) and runs each request through them."""

    def __init__(
        self,
        cfg: GatewayConfig,
        *,
        store: Store | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.cfg = cfg
        # Created in start(): an aiohttp session belongs to the running event loop.
        self.session: aiohttp.ClientSession | None = None
        self.scraper: Scraper | None = None
        self.store = store or create_store(cfg.store)
        self.registry = TenantRegistry(cfg, self.store)
        # A concurrency lease must outlive the longest request the upstream timeout allows.
        self.limiter = Limiter(
            self.store, self.registry, cfg.store.fail_mode, lease_s=cfg.upstream.read_timeout_s + 60
        )
        self.telemetry = telemetry or Telemetry(cfg.telemetry, cfg.pools)
        self.settler = Settler(cfg, self.registry, self.limiter, self.telemetry)
        self.memory = VolatilityMemory(
            capacity_per_tenant=cfg.normalize.memory_per_tenant, secret=cfg.normalize.salt_secret
        )
        self.shared_learning = SharedLearning.for_config(cfg, self.memory, self.store)
        self.kv_hub = _kv_hub(cfg)
        self.cluster = ClusterState.from_config(cfg, kv_hub=self.kv_hub)
        self._hashers = _block_hashers(cfg) if self.kv_hub is not None else {}
        self.replies = ReplyLearner(self._hashers)
        self.discoverer = Discoverer.for_config(cfg, self._rediscovered)
        # A replica that becomes healthy replays the top stable prefixes it will serve before it joins.
        self.prefixes = PrefixMemory(cfg.routing.prewarm)
        self.prewarmer = (
            Prewarmer(cfg.routing.prewarm, self.prefixes, self.cluster, meter=self.telemetry.meter,
                      tracer=self.telemetry.tracer)
            if cfg.routing.prewarm.enabled else None
        )  # fmt: skip
        self.peer_load = PeerLoad.for_config(cfg, self.store, lambda: self.cluster, self.telemetry.meter)
        self.dispatcher: Dispatcher | None = None
        # Fair admission per pool that enables it (pools.<p>.admission); fed by the scraper's rounds.
        self.queues = build_queues({name: pool.admission for name, pool in cfg.pools.items()})
        self.responses = ResponseRoutes(self.store, cfg.routing.response_ttl_s)
        self._salts: dict[str, str | None] = {}
        self._background: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        """Open the upstream session, load tenant keys, start replica probes and the spend flusher."""
        self.session = create_session(self.cfg.upstream)
        self.dispatcher = Dispatcher(
            self.cfg, self.cluster, AiohttpTransport(self.session), on_attempt=self.telemetry.upstream_started,
            on_pick=self._priced,
        )  # fmt: skip
        self.scraper = Scraper(
            self.cluster, self.session, self.cfg.routing, on_scrape=self._on_scrape if self.queues else None,
            on_health=self.prewarmer.on_health if self.prewarmer is not None else None,
        )  # fmt: skip
        await self.registry.load()
        if self.shared_learning is not None:  # before serving: a new replica starts with what others learned
            await self.shared_learning.load()
            self._background.append(asyncio.create_task(self.shared_learning.run(), name="kvgate-shared-learning"))
        if self.prewarmer is not None:
            await self.prewarmer.start()
        await self.scraper.start()
        register_replica_metrics(self.telemetry.meter, lambda: self.cluster)
        if self.peer_load is not None:
            self._background.append(asyncio.create_task(self.peer_load.run(), name="kvgate-peer-load"))
        if self.discoverer is not None:
            self.discoverer.register_metrics(self.telemetry.meter)
            await self.discoverer.start()
        if self.kv_hub is not None:
            register_kv_metrics(self.telemetry.meter, self.kv_hub)
            await self.kv_hub.start()
        if self.queues:
            register_queue_metrics(self.telemetry.meter, self.queues)
        self._background.append(asyncio.create_task(self.limiter.ledger.run(), name="kvgate-spend-flush"))

    async def stop(self) -> None:
        """Stop background work, flush what is buffered, close the store and exporters."""
        if self.discoverer is not None:
            await self.discoverer.stop()
        if self.scraper is not None:
            await self.scraper.stop()
        if self.prewarmer is not None:
            await self.prewarmer.stop()
        if self.kv_hub is not None:
            await self.kv_hub.stop()
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self.limiter.ledger.flush()
        if self.shared_learning is not None:
            await self.shared_learning.flush()  # fails open (False) when the store is down
        await self.store.aclose()
        await self.telemetry.shutdown()
        if self.session is not None:
            await self.session.close()

    def _rediscovered(self, cfg: GatewayConfig) -> None:
        """Discovery changed a pool's replicas: survivors keep their state, new ones join after a good probe,
        vanished ones drain (their requests finish; nothing new goes to them)."""
        self.cluster = ClusterState.from_config(cfg, self.cluster, kv_hub=self.kv_hub, probe_before_joining=True)
        if self.kv_hub is not None:  # a discovered replica's KV events follow it in and out
            self.kv_hub.follow(_event_sources(cfg))
        if self.dispatcher is not None:
            self.dispatcher.cluster = self.cluster
        if self.scraper is not None:
            self.scraper.track(self.cluster)
        if self.prewarmer is not None:
            self.prewarmer.track(self.cluster)

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

    async def finished(self, ctx: RequestContext, *, cancelled: bool = False) -> None:
        """After the last byte was sent, or the client left: settle, then learn a kv_events request's reply."""
        await (self.settler.cancelled(ctx) if cancelled else self.settler.settle(ctx))
        if not cancelled:
            await self.replies.learn(ctx)

    # -- the path -------------------------------------------------------------------------------
    async def handle(self, ctx: RequestContext) -> Reply:
        """Run a parsed request through every stage; errors come back in the surface's envelope."""
        self.telemetry.request_started(ctx)
        try:
            return await self._handle(ctx)
        except GatewayError as err:
            ctx.status = err.status
            ctx.error_type = err.reason
            headers = self._gateway_headers(ctx)
            headers.update(err.headers)
            headers["content-type"] = "application/json"
            return Reply(err.status, headers, ctx.surface.error_body(err))

    async def _handle(self, ctx: RequestContext) -> Reply:
        # tenancy
        ctx.tenant = tenant = await self.registry.resolve(ctx.headers.get("authorization"), ctx.headers.get(API_KEY))
        # limits
        ctx.admission = admission = await self.limiter.admit(ctx)
        if admission.degraded is not None:
            self.telemetry.record_limited(ctx, admission.degraded, "degrade")
        # normalize
        model = self.cfg.model(ctx.model)
        assert model is not None  # the api stage already answered 404
        ctx.body, ctx.normalize_report = normalize(
            ctx.body,
            surface=ctx.surface,
            view=ctx.prompt,
            tenant=tenant,
            model=model,
            memory=self.memory,
            opt_out=ctx.headers.get(NORMALIZE_OPT_OUT, "").lower() == "off",
            now=datetime.now(UTC),
        )
        if ctx.normalize_report.applied:
            ctx.prompt = ctx.surface.view(ctx.body)
        ctx.cache_salt = self._salt(tenant)
        # classify
        ctx.route_class = classify(
            ctx.body, ctx.headers, tenant, self.cfg.routing, degraded=admission.degraded is not None
        )
        # pick + upstream
        assert self.dispatcher is not None, "Gateway.start() opens the upstream"
        previous = ctx.body.get("previous_response_id") if ctx.surface is RESPONSES else None
        if isinstance(previous, str):
            holder = ResponseRoutes.usable(previous, await self.responses.recall(previous))
            ctx.pinned = (holder.pool, holder.replica)
        # admission: the pool's fair queue (only where enabled; waits only while that pool is saturated)
        if self.queues:
            await self._admit(ctx, model, tenant)
        key = routing_key(ctx.prompt.key_head, ctx.cache_salt or tenant.id)
        hasher = self._hashers.get(model.name) if ctx.surface is CHAT else None
        if hasher is not None:
            try:
                ctx.blocks = hasher.blocks(ctx.body, ctx.cache_salt)
            except ChatRenderError:
                ctx.blocks = None  # a body the gateway cannot render exactly: the policy falls back
        outcome = await self.dispatcher.run(ctx, model, key)
        if self.prewarmer is not None and ctx.route is not None:
            self.prefixes.record(ctx.route.pool, tenant.id, key, ctx.body, ctx.cache_salt, ctx.surface, ctx.prompt)
        if isinstance(outcome, StreamRelay):
            return self._stream_reply(ctx, outcome)
        return await self._complete_reply(ctx, outcome)

    async def _admit(self, ctx: RequestContext, model: ModelConfig, tenant: Tenant) -> None:
        """Hold a slot of the request's pool on the context (settle releases it), or raise the queue's 429;
        with on_exceed degrade, a refused interactive request is served as bulk (its pool, its queue)."""
        assert ctx.route_class is not None
        while True:
            rclass = ctx.route_class.route_class
            if ctx.pinned is not None:
                pool = ctx.pinned[0]
            else:
                pool = cached_home_and_other(model, rclass, self.cluster)[0].name
            queue = self.queues.get(pool)
            if queue is None:
                return
            try:
                ctx.queue_ticket = ticket = await queue.acquire(tenant.id, rclass, predicted_tokens(ctx),
                                                                watch_first_token=ctx.stream)  # fmt: skip
            except AdmissionRejected as err:
                degrade = queue.cfg.on_exceed == "degrade" and rclass == "interactive" and ctx.pinned is None
                self.telemetry.record_limited(ctx, "queue", "degrade" if degrade else "reject")
                if not degrade:
                    raise queue_error(err, tenant.id) from None
                ctx.limit_notes.append("degraded:queue")
                ctx.route_class = classify(ctx.body, ctx.headers, tenant, self.cfg.routing, degraded=True)
                continue
            self.telemetry.record_queue_wait(pool, tenant.id, rclass, ticket.waited_s)
            return

    def _priced(self, ctx: RequestContext) -> None:
        """After pick, before the upstream call: the request's estimate on its replica; the TPM reservation follows."""
        ctx.call_estimate = estimate = estimate_call(ctx)
        if ctx.admission is not None:
            self.limiter.reserve_estimate(ctx.admission, estimate)

    def _on_scrape(self, replica: ReplicaState) -> None:
        """After a replica's probe: its pool's queue re-assesses saturation (and may release waiters)."""
        queue = self.queues.get(replica.pool)
        pool = self.cluster.pools.get(replica.pool)
        if queue is not None and pool is not None:
            queue.on_state_change(pool.candidates())

    def _salt(self, tenant: Tenant) -> str | None:
        # An HMAC per request is measurable; a tenant's salt never changes while the config lives.
        if tenant.id not in self._salts:
            self._salts[tenant.id] = salt_for_tenant(tenant, self.cfg.normalize.salt_secret)
        return self._salts[tenant.id]

    # -- replies --------------------------------------------------------------------------------
    def _gateway_headers(self, ctx: RequestContext) -> dict[str, str]:
        headers = {REQUEST_ID: ctx.request_id}
        if ctx.route is not None and ctx.route_class is not None:
            r = ctx.route
            headers[ROUTE] = (
                f"pool={r.pool};class={ctx.route_class.route_class};reason={ctx.route_class.reason};"
                f"policy={r.policy};pick={r.reason};attempt={r.attempt}"
            )
            if r.cached_tokens is not None:
                headers[ROUTE] += f";cached={r.cached_tokens}"
            if r.runner_up is not None:
                headers[ROUTE] += f";runner_up={r.runner_up}"
            headers[ROUTE] += route_suffix(ctx.queue_ticket) + (f";{r.load_stamp}" if r.load_stamp else "")
        if ctx.normalize_report is not None:
            headers[NORMALIZED] = ctx.normalize_report.header()
        if ctx.limit_notes:
            headers[LIMIT] = ";".join(ctx.limit_notes)
        return headers

    async def _remember_response(self, ctx: RequestContext) -> None:
        # Only the Responses API stores responses on the replica (previous_response_id, GET, cancel).
        if ctx.surface is RESPONSES and ctx.response_id and ctx.route is not None and ctx.status == 200:
            holder = Holder(ctx.route.pool, ctx.route.replica, ctx.model, migrated=ctx.migrations > 0)
            await self.responses.remember(ctx.response_id, holder)

    async def _complete_reply(self, ctx: RequestContext, reply: Complete) -> Reply:
        ctx.status = reply.status
        await self._remember_response(ctx)
        # Spend is recorded before the client sees the cost header: acknowledged spend is never lost.
        await self.settler.settle(ctx)
        headers = self._gateway_headers(ctx)
        headers["content-type"] = reply.content_type
        headers.update(response_headers(ctx.cost_usd, overhead_s(ctx.timing)))
        return Reply(reply.status, headers, reply.body)

    def _stream_reply(self, ctx: RequestContext, relay: StreamRelay) -> Reply:
        ctx.status = 200
        headers = self._gateway_headers(ctx)
        headers["content-type"] = "text/event-stream; charset=utf-8"
        headers["cache-control"] = "no-cache"
        # For a stream the header can only hold the time spent before the upstream answered.
        headers[OVERHEAD_HEADER] = format_ms(ctx.timing.upstream_start - ctx.timing.start)
        return Reply(200, headers, stream=self._relay(ctx, relay))

    async def _relay(self, ctx: RequestContext, relay: StreamRelay) -> AsyncIterator[bytes]:
        events = relay.events()
        try:
            async for chunk in events:
                yield chunk
        finally:
            await events.aclose()
        await self._remember_response(ctx)
        await self.settler.settle(ctx)
        # Cost and overhead travel as SSE comments: SDKs ignore comments, tools can read them.
        yield relay.observer.ending(sse_trailer(ctx.cost_usd, overhead_s(ctx.timing)))


def _event_sources(cfg: GatewayConfig) -> list[EventSource]:
    """One per replica that declared its KV-event endpoint (or whose pool's discovery names it)."""
    return [
        EventSource(url, ev.endpoint, ev.replay, ev.topic)
        for pool in cfg.pools.values()
        for url, ev in pool.replica_events.items()
    ]


def _kv_hub(cfg: GatewayConfig) -> KvEventsHub | None:
    """The KV-event hub, when some replica publishes events or some pool discovers replicas that do."""
    sources = _event_sources(cfg)
    discovered = any(p.discovery is not None and p.discovery.kv_events is not None for p in cfg.pools.values())
    return KvEventsHub(sources) if sources or discovered else None


def _block_hashers(cfg: GatewayConfig) -> dict[str, RequestBlocks]:
    """Per model: the hasher of its first kv_events pool that names a tokenizer folder."""
    from app.kvcache.tokens import RequestBlocks  # needs the `kv` extra (tokenizers, jinja2)

    by_folder: dict[tuple[str, int], RequestBlocks] = {}
    out: dict[str, RequestBlocks] = {}
    for model in cfg.models:
        for name in model.pools:
            pool = cfg.pools[name]
            policy = pool.effective_policy()
            if isinstance(policy, KvEventsParams) and pool.tokenizer is not None:
                k = (pool.tokenizer, policy.block_size)
                if k not in by_folder:
                    by_folder[k] = RequestBlocks(pool.tokenizer, policy.block_size)
                out[model.name] = by_folder[k]
                break
    return out
