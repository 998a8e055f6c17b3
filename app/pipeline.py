"""The request path, one way: api → tenancy → limits → normalize → classify → pick → upstream → settle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from app.config import GatewayConfig
from app.context import ClassDecision, RequestContext, RouteDecision
from app.errors import GatewayError, upstream_unavailable
from app.upstream import (
    RetryableUpstreamError,
    StreamRelay,
    UpstreamReply,
    forward_headers,
    open_upstream,
    read_complete,
    sse_error_event,
)


@dataclass(slots=True)
class Reply:
    """What the api layer sends back: either a complete body or an SSE stream."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    on_close: Callable[[], Awaitable[None]] | None = None


@dataclass
class _RoundRobin:
    counters: dict[str, int] = field(default_factory=dict)


class Gateway:
    """Holds the stages' long-lived state and runs one request through them."""

    def __init__(self, cfg: GatewayConfig, session: aiohttp.ClientSession) -> None:
        self.cfg = cfg
        self.session = session
        self._rr = _RoundRobin()

    async def start(self) -> None:
        """Start background work (replica probes)."""

    async def stop(self) -> None:
        """Stop background work."""

    def unready_models(self) -> list[str]:
        """Models with no healthy replica in any of their pools."""
        return []

    def render_metrics(self) -> tuple[bytes, str]:
        """Prometheus text of the gateway's own metrics."""
        return b"", "text/plain; version=0.0.4; charset=utf-8"

    async def finished(self, ctx: RequestContext) -> None:
        """Called once per request after the last byte was sent (or the client left)."""

    # -- pick (interim: first pool, round robin) --------------------------------------------
    def _pick(self, ctx: RequestContext, exclude: frozenset[str]) -> RouteDecision:
        model = self.cfg.model(ctx.model)
        assert model is not None
        pool_name = model.pools[0]
        pool = self.cfg.pools[pool_name]
        candidates = [r for r in pool.replicas if r not in exclude]
        if not candidates:
            raise upstream_unavailable(f"no healthy replica for model `{ctx.model}`")
        i = self._rr.counters.get(pool_name, 0)
        self._rr.counters[pool_name] = i + 1
        return RouteDecision(pool=pool_name, replica=candidates[i % len(candidates)], policy="round_robin",
                             reason="round_robin")

    # -- the path -------------------------------------------------------------------------
    async def handle(self, ctx: RequestContext) -> Reply:
        """Run a parsed request through every stage; errors come back as OpenAI-shaped replies."""
        try:
            return await self._handle(ctx)
        except GatewayError as err:
            ctx.status = err.status
            ctx.error_type = err.code or err.type
            return self._error_reply(ctx, err)

    async def _handle(self, ctx: RequestContext) -> Reply:
        ctx.route_class = ctx.route_class or ClassDecision("interactive", "default")
        return await self._send(ctx)

    async def _send(self, ctx: RequestContext) -> Reply:
        tried: set[str] = set()
        attempts = 1 + self.cfg.upstream.retries
        last: GatewayError | None = None
        for attempt in range(1, attempts + 1):
            try:
                route = self._pick(ctx, frozenset(tried))
            except GatewayError as err:
                raise (last or err) from None
            route.attempt = attempt
            ctx.route = route
            pool = self.cfg.pools[route.pool]
            payload = self._payload(ctx, pool.served_model, route)
            headers = forward_headers(ctx.headers, ctx.request_id)
            url = route.replica + ctx.path
            try:
                resp = await open_upstream(self.session, ctx, url, payload, headers)
            except RetryableUpstreamError as err:
                tried.add(route.replica)
                last = err.error
                continue
            if ctx.stream and resp.status == 200:
                return self._stream_reply(ctx, StreamRelay(resp, ctx, pool.served_model))
            reply = await read_complete(resp, ctx, pool.served_model)
            resp.release()
            return self._complete_reply(ctx, reply)
        assert last is not None
        raise last

    def _payload(self, ctx: RequestContext, served_model: str, route: RouteDecision) -> bytes:
        body: dict[str, Any] = ctx.body
        if served_model != ctx.model or route.priority is not None or ctx.cache_salt is not None:
            body = dict(body)
            body["model"] = served_model
            if route.priority is not None:
                body["priority"] = route.priority
            if ctx.cache_salt is not None and ctx.operation != "embeddings":
                body["cache_salt"] = ctx.cache_salt
        return orjson.dumps(body)

    # -- replies --------------------------------------------------------------------------
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

    def _complete_reply(self, ctx: RequestContext, reply: UpstreamReply) -> Reply:
        ctx.status = reply.status
        self._settle(ctx)
        headers = self._gateway_headers(ctx)
        headers["content-type"] = reply.content_type
        headers["x-kvgate-cost-usd"] = f"{ctx.cost_usd:.9f}"
        return Reply(reply.status, headers, reply.body)

    def _stream_reply(self, ctx: RequestContext, relay: StreamRelay) -> Reply:
        ctx.status = 200
        headers = self._gateway_headers(ctx)
        headers["content-type"] = "text/event-stream; charset=utf-8"
        headers["cache-control"] = "no-cache"
        return Reply(200, headers, stream=self._relay(ctx, relay))

    async def _relay(self, ctx: RequestContext, relay: StreamRelay) -> AsyncIterator[bytes]:
        finished = False
        try:
            try:
                async for chunk in relay.events():
                    yield chunk
            except GatewayError as err:
                ctx.error_type = err.code or err.type
                yield sse_error_event(err.message, err.type, err.code or "upstream_error")
            else:
                finished = True
            self._settle(ctx)
            # Cost travels as an SSE comment: clients and SDKs ignore comments, tools can read it.
            yield b": x-kvgate-cost-usd " + f"{ctx.cost_usd:.9f}".encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:
            ctx.error_type = ctx.error_type or "client_disconnected"
            ctx.status = 499
            raise
        finally:
            relay.close()
            if not finished and ctx.error_type is None:
                ctx.error_type = "client_disconnected"

    # -- settle ---------------------------------------------------------------------------
    def _settle(self, ctx: RequestContext) -> None:
        ctx.timing.end = ctx.timing.end or time.perf_counter()


def today() -> datetime:
    """Now, in UTC (the clock normalization and spend days use)."""
    return datetime.now(UTC)
