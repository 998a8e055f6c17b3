"""The request path, one way: api → tenancy → limits → normalize → classify → pick → upstream → settle."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from app.config import GatewayConfig, ModelConfig
from app.context import RequestContext, RouteDecision
from app.errors import GatewayError
from app.limits import Limiter
from app.normalize import VolatilityMemory, normalize, salt_for_tenant
from app.routing.classify import classify
from app.routing.pick import pick, routing_key
from app.routing.retry import backoff_s
from app.routing.scraper import Scraper
from app.routing.state import ClusterState, FailureKind, ReplicaState
from app.settle import Settler
from app.store.base import Store
from app.store.factory import create_store
from app.telemetry import Telemetry
from app.telemetry.headers import OVERHEAD_HEADER, format_ms, overhead_s, response_headers, sse_trailer
from app.tenancy import TenantRegistry
from app.upstream import (
    RetryableUpstreamError,
    StreamRelay,
    UpstreamReply,
    create_session,
    forward_headers,
    open_upstream,
    read_complete,
    sse_error_event,
)

NORMALIZE_OPT_OUT = "x-kvgate-normalize"


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
        self.session: aiohttp.ClientSession = None  # type: ignore[assignment]
        self.scraper: Scraper | None = None
        self.store = store or create_store(cfg.store)
        self.registry = TenantRegistry(cfg, self.store)
        # A concurrency lease must outlive the longest request the upstream timeout allows.
        self.limiter = Limiter(
            self.store, self.registry, cfg.store.fail_mode, lease_s=cfg.upstream.read_timeout_s + 60
        )
        self.telemetry = telemetry or Telemetry(cfg.telemetry, cfg.pools)
        self.settler = Settler(cfg, self.registry, self.limiter, self.telemetry)
        self.memory = VolatilityMemory(capacity_per_tenant=cfg.normalize.memory_per_tenant)
        self.cluster = ClusterState.from_config(cfg)
        self._replicas = {(r.pool, r.url): r for r in self.cluster.replicas()}
        self._rng = random.Random()
        self._background: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        """Open the upstream session, load tenant keys, start replica probes and the spend flusher."""
        self.session = create_session(self.cfg.upstream)
        self.scraper = Scraper(self.cluster, self.session, self.cfg.routing)
        await self.registry.load()
        await self.scraper.start()
        self._background.append(asyncio.create_task(self.limiter.ledger.run(), name="kvgate-spend-flush"))

    async def stop(self) -> None:
        """Stop background work, flush what is buffered, close the store and exporters."""
        if self.scraper is not None:
            await self.scraper.stop()
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self.limiter.ledger.flush()
        await self.store.aclose()
        await self.telemetry.shutdown()
        if self.session is not None:
            await self.session.close()

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

    async def finished(self, ctx: RequestContext) -> None:
        """After the last byte was sent or the client left: settle what is not settled yet."""
        await self.settler.settle(ctx)

    # -- the path -------------------------------------------------------------------------------
    async def handle(self, ctx: RequestContext) -> Reply:
        """Run a parsed request through every stage; errors come back as OpenAI-shaped replies."""
        self.telemetry.request_started(ctx)
        try:
            return await self._handle(ctx)
        except GatewayError as err:
            ctx.status = err.status
            ctx.error_type = err.code or err.type
            if err.status == 429:
                reason = err.headers.get("x-kvgate-limit", "rejected:limit").rsplit(":", 1)[-1]
                ctx.error_type = reason
            await self.settler.settle(ctx)
            return self._error_reply(ctx, err)

    async def _handle(self, ctx: RequestContext) -> Reply:
        # tenancy
        ctx.tenant = tenant = await self.registry.resolve(ctx.headers.get("authorization"))
        # limits
        ctx.admission = await self.limiter.admit(ctx)
        if ctx.admission.degraded is not None:
            self.telemetry.record_limited(ctx, ctx.admission.degraded, "degrade")
        # normalize
        model = self.cfg.model(ctx.model)
        assert model is not None  # the api stage already answered 404
        ctx.body, ctx.normalize_report = normalize(
            ctx.body,
            operation=ctx.operation,
            tenant=tenant,
            model=model,
            memory=self.memory,
            opt_out=ctx.headers.get(NORMALIZE_OPT_OUT, "").lower() == "off",
            now=datetime.now(UTC),
        )
        ctx.cache_salt = salt_for_tenant(tenant, self.cfg.normalize.salt_secret)
        # classify
        ctx.route_class = classify(ctx.body, ctx.headers, tenant, self.cfg.routing, preset=ctx.route_class)
        # pick + upstream
        key = routing_key(ctx.body, ctx.operation, ctx.cache_salt or tenant.id)
        return await self._send(ctx, model, key)

    async def _send(self, ctx: RequestContext, model: ModelConfig, key: int) -> Reply:
        assert ctx.route_class is not None
        tried: set[str] = set()
        last: GatewayError | None = None
        for attempt in range(1, self.cfg.upstream.retries + 2):
            try:
                route = pick(
                    model=model, decision=ctx.route_class, key=key, cluster=self.cluster,
                    cfg=self.cfg.routing, exclude=frozenset(tried),
                )  # fmt: skip
            except GatewayError as err:
                raise (last or err) from None
            ctx.route = route
            replica = self._replicas[(route.pool, route.replica)]
            served = self.cfg.pools[route.pool].served_model
            headers = forward_headers(ctx.headers, ctx.request_id)
            self.telemetry.upstream_started(ctx, headers)
            ctx.upstream_called = True
            replica.on_start()
            try:
                payload = self._payload(ctx, served, route)
                resp = await open_upstream(self.session, ctx, route.replica + ctx.path, payload, headers)
            except RetryableUpstreamError as err:
                replica.on_failure(_failure_kind(err.error))
                tried.add(route.replica)
                last = err.error
                ctx.error_type = err.error.code
                if attempt <= self.cfg.upstream.retries:
                    await asyncio.sleep(backoff_s(attempt, self._rng))
                continue
            except BaseException:
                replica.on_release()
                raise
            ctx.error_type = None
            if ctx.stream and resp.status == 200:
                return self._stream_reply(ctx, StreamRelay(resp, ctx, served), replica)
            try:
                reply = await read_complete(resp, ctx, served)
            except GatewayError as err:
                replica.on_failure(_failure_kind(err))
                raise
            except BaseException:
                replica.on_release()
                raise
            finally:
                ctx.timing.upstream_busy = ctx.timing.end - ctx.timing.upstream_start
            resp.release()
            replica.on_success()
            return await self._complete_reply(ctx, reply)
        assert last is not None
        raise last

    def _payload(self, ctx: RequestContext, served_model: str, route: RouteDecision) -> bytes:
        body: dict[str, Any] = ctx.body
        if served_model != ctx.model or route.priority is not None or ctx.cache_salt is not None:
            body = dict(body)
            body["model"] = served_model
            if route.priority is not None and ctx.operation != "embeddings":
                body["priority"] = route.priority
            if ctx.cache_salt is not None and ctx.operation != "embeddings":
                body["cache_salt"] = ctx.cache_salt
        return orjson.dumps(body)

    # -- replies --------------------------------------------------------------------------------
    def _gateway_headers(self, ctx: RequestContext) -> dict[str, str]:
        headers = {"x-request-id": ctx.request_id}
        if ctx.route is not None and ctx.route_class is not None:
            r = ctx.route
            headers["x-kvgate-route"] = (
                f"pool={r.pool};class={ctx.route_class.route_class};reason={ctx.route_class.reason};"
                f"policy={r.policy};pick={r.reason};attempt={r.attempt}"
            )
        if ctx.normalize_report is not None:
            headers["x-kvgate-normalized"] = ctx.normalize_report.header()
        if ctx.limit_notes:
            headers["x-kvgate-limit"] = ";".join(ctx.limit_notes)
        headers.update(ctx.extra_response_headers)
        return headers

    def _error_reply(self, ctx: RequestContext, err: GatewayError) -> Reply:
        headers = self._gateway_headers(ctx)
        headers.update(err.headers)
        headers["content-type"] = "application/json"
        return Reply(err.status, headers, err.body())

    async def _complete_reply(self, ctx: RequestContext, reply: UpstreamReply) -> Reply:
        ctx.status = reply.status
        self.settler.price(ctx)
        headers = self._gateway_headers(ctx)
        headers["content-type"] = reply.content_type
        headers.update(response_headers(ctx.cost_usd, overhead_s(ctx.timing)))
        # Spend is recorded before the client sees the cost header: acknowledged spend is never lost.
        await self.settler.settle(ctx)
        return Reply(reply.status, headers, reply.body)

    def _stream_reply(self, ctx: RequestContext, relay: StreamRelay, replica: ReplicaState) -> Reply:
        ctx.status = 200
        headers = self._gateway_headers(ctx)
        headers["content-type"] = "text/event-stream; charset=utf-8"
        headers["cache-control"] = "no-cache"
        # For a stream the header can only hold the time spent before the upstream answered.
        headers[OVERHEAD_HEADER] = format_ms(ctx.timing.upstream_start - ctx.timing.start)
        return Reply(200, headers, stream=self._relay(ctx, relay, replica))

    async def _relay(self, ctx: RequestContext, relay: StreamRelay, replica: ReplicaState) -> AsyncIterator[bytes]:
        verdict: FailureKind | None = None
        clean = False
        try:
            try:
                async for chunk in relay.events():
                    if ctx.timing.first_token and not replica.ttft_ewma_s:
                        replica.on_first_token(ctx.timing.first_token - ctx.timing.upstream_start)
                    yield chunk
            except GatewayError as err:
                verdict = _failure_kind(err)
                ctx.error_type = err.code or err.type
                yield sse_error_event(err.message, err.type, err.code or "upstream_error")
            else:
                clean = True
            ctx.timing.upstream_busy = ctx.timing.end - ctx.timing.upstream_start
            self.settler.price(ctx)
            await self.settler.settle(ctx)
            # Cost and overhead travel as SSE comments: SDKs ignore comments, tools can read them.
            yield sse_trailer(ctx.cost_usd, overhead_s(ctx.timing))
            yield b"data: [DONE]\n\n"
        finally:
            relay.close()
            if verdict is not None:
                replica.on_failure(verdict)
            elif clean:
                replica.on_success()
            else:
                replica.on_release()
                ctx.error_type = ctx.error_type or "client_disconnected"
                ctx.timing.end = ctx.timing.end or time.perf_counter()
                ctx.timing.upstream_busy = ctx.timing.end - ctx.timing.upstream_start


def _failure_kind(err: GatewayError) -> FailureKind:
    if err.status == 504:
        return "timeout"
    if err.code == "upstream_error":
        return "status_5xx"
    if err.code == "upstream_unreachable" and "before [DONE]" not in err.message:
        return "connect"
    return "protocol"
