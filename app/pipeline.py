"""The request path, one way: api → tenancy → limits → normalize → classify → pick → upstream → settle.

`Path.handle` runs the stages in that order; each stage is its own module (docs/architecture.md). Nothing here
retries, prices or parses: the dispatcher, the settler and the surfaces do. Optional features plug in at the
named hook points of app/hooks.py (registered by app/gateway.py), never as a branch here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from app.context import RequestContext
from app.dispatch import Complete, Dispatcher, StreamRelay
from app.errors import GatewayError
from app.headers import API_KEY, NORMALIZE_OPT_OUT
from app.normalize import VolatilityMemory, normalize, request_salt
from app.prefix_key import routing_key
from app.reply import Reply, gateway_headers
from app.routing.classify import classify
from app.telemetry.headers import OVERHEAD_HEADER, format_ms, overhead_s, response_headers, sse_trailer

if TYPE_CHECKING:
    from app.config import GatewayConfig
    from app.hooks import Hooks
    from app.limits import Limiter
    from app.settle import Settler
    from app.telemetry import Telemetry
    from app.tenancy import TenantRegistry


class Path:
    """The stages in order, the hook points between them, and the shape of what goes back to the client."""

    def __init__(self, cfg: GatewayConfig, *, registry: TenantRegistry, limiter: Limiter,
                 memory: VolatilityMemory, dispatcher: Dispatcher, settler: Settler, telemetry: Telemetry,
                 hooks: Hooks) -> None:
        self.cfg = cfg
        self.registry = registry
        self.limiter = limiter
        self.memory = memory
        self.dispatcher = dispatcher
        self.settler = settler
        self.telemetry = telemetry
        self.hooks = hooks

    async def handle(self, ctx: RequestContext) -> Reply:
        """Run a parsed request through every stage; errors come back in the surface's envelope."""
        self.telemetry.request_started(ctx)
        # The stages run in this coroutine, not one of their own: each coroutine in the await chain is resumed
        # at every suspension of the request (an upstream read, a store call).
        try:
            # tenancy
            headers = ctx.headers
            ctx.tenant = tenant = await self.registry.resolve(headers.get("authorization"), headers.get(API_KEY))
            # limits
            ctx.admission = admission = await self.limiter.admit(ctx)
            if admission.degraded is not None:
                self.telemetry.record_limited(ctx, admission.degraded, "degrade")
            # normalize
            model = self.cfg.model(ctx.model)
            assert model is not None  # the api stage already answered 404
            ctx.body, ctx.normalize_report = normalize(
                ctx.body, surface=ctx.surface, view=ctx.prompt, tenant=tenant, model=model, memory=self.memory,
                opt_out=headers.get(NORMALIZE_OPT_OUT, "").lower() == "off", headers=headers,
            )
            if ctx.normalize_report.applied:
                ctx.prompt = ctx.surface.view(ctx.body)
            ctx.cache_salt = request_salt(tenant, ctx.body.get("cache_salt"), self.cfg.normalize.salt_secret)
            # classify
            ctx.route_class = classify(
                ctx.body, headers, tenant, self.cfg.routing, degraded=admission.degraded is not None,
                cap_fields=ctx.surface.output_cap_fields,
            )
            for hook in self.hooks.before_pick:
                if (pending := hook(ctx, model)) is not None:  # None: nothing to wait for (app/hooks.py)
                    await pending
            # pick + upstream (the dispatcher runs the after_pick hooks once per attempt)
            ctx.routing_key = routing_key(ctx.prompt.key_head, ctx.cache_salt or tenant.id)
            outcome = await self.dispatcher.run(ctx, model, ctx.routing_key)
            for routed in self.hooks.routed:
                routed(ctx)
            if isinstance(outcome, StreamRelay):
                return self._stream_reply(ctx, outcome)
            return await self._complete_reply(ctx, outcome)
        except GatewayError as err:
            return self._error_reply(ctx, err)

    def _error_reply(self, ctx: RequestContext, err: GatewayError) -> Reply:
        ctx.status = err.status
        ctx.error_type = err.reason
        headers = gateway_headers(ctx)
        headers.update(err.headers)
        headers["content-type"] = "application/json"
        return Reply(err.status, headers, ctx.surface.error_body(err))

    # -- settle ---------------------------------------------------------------------------------
    async def finished(self, ctx: RequestContext, *, cancelled: bool = False) -> None:
        """After the last byte was sent, or the client left: settle (once), then the finished hooks."""
        await (self.settler.cancelled(ctx) if cancelled else self.settler.settle(ctx))
        for hook in self.hooks.finished:
            await hook(ctx, cancelled)

    async def _settle(self, ctx: RequestContext) -> None:
        for hook in self.hooks.before_settle:
            await hook(ctx)
        await self.settler.settle(ctx)

    # -- replies --------------------------------------------------------------------------------
    async def _complete_reply(self, ctx: RequestContext, reply: Complete) -> Reply:
        ctx.status = reply.status
        # Spend is recorded before the client sees the cost header: acknowledged spend is never lost.
        await self._settle(ctx)
        headers = gateway_headers(ctx)
        headers["content-type"] = reply.content_type
        headers.update(response_headers(ctx.cost_usd, overhead_s(ctx.timing)))
        return Reply(reply.status, headers, reply.body)

    def _stream_reply(self, ctx: RequestContext, relay: StreamRelay) -> Reply:
        ctx.status = 200
        headers = gateway_headers(ctx)
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
        await self._settle(ctx)
        # Cost and overhead travel as SSE comments: SDKs ignore comments, tools can read them.
        yield relay.observer.ending(sse_trailer(ctx.cost_usd, overhead_s(ctx.timing)))
