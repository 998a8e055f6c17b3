"""The upstream stage: attempts, failover with backoff, the replica lease, and the stream relay.

`Dispatcher.run` picks a replica (the pool's policy, excluding replicas already tried), sends the request
and, while nothing has reached the client, tries another replica on a connect error, a timeout or a 5xx.
Every attempt holds a `Lease` on its replica: in-flight counts and the circuit breaker see exactly one
start and one verdict per attempt, whichever way the attempt ends.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import orjson

from app.api.surfaces.base import StreamObserver
from app.config import GatewayConfig, ModelConfig
from app.context import RequestContext, RouteDecision
from app.errors import FailureKind, GatewayError, bad_request, upstream_unreachable
from app.routing.pick import pick
from app.routing.retry import backoff_s
from app.routing.state import ClusterState, ReplicaState
from app.upstream import Transport, UpstreamResponse, forward_headers, sse_events


class Lease:
    """One attempt's hold on a replica: `on_start` now, then exactly one of success, failure or release."""

    __slots__ = ("_open", "replica")

    def __init__(self, replica: ReplicaState) -> None:
        self.replica = replica
        self._open = True
        replica.on_start()

    def succeed(self) -> None:
        """The replica answered (any status that is not its fault)."""
        if self._open:
            self._open = False
            self.replica.on_success()

    def fail(self, kind: FailureKind) -> None:
        """The replica failed the attempt."""
        if self._open:
            self._open = False
            self.replica.on_failure(kind)

    def release(self) -> None:
        """The attempt ended with no verdict on the replica (the client left, the task was cancelled)."""
        if self._open:
            self._open = False
            self.replica.on_release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(slots=True)
class Complete:
    """A whole upstream answer (non-streaming, or an error status), its model name already public."""

    status: int
    body: bytes
    content_type: str


class StreamRelay:
    """An upstream SSE stream relayed event by event through the surface's observer; owns the lease."""

    def __init__(
        self, ctx: RequestContext, resp: UpstreamResponse, lease: Lease, observer: StreamObserver
    ) -> None:
        self.ctx = ctx
        self.observer = observer
        self._resp = resp
        self._lease = lease

    async def events(self) -> AsyncGenerator[bytes, None]:
        """Relayed bytes; a failure midway ends with the surface's error event. Close it with aclose()."""
        ctx, observer, replica = self.ctx, self.observer, self._lease.replica
        verdict: FailureKind | None = None
        clean = False
        try:
            try:
                async for batch in sse_events(self._resp.chunks()):
                    out = [kept for event in batch if (kept := observer.observe(event)) is not None]
                    if ctx.timing.first_token and not replica.ttft_ewma_s:
                        replica.on_first_token(ctx.timing.first_token - ctx.timing.upstream_start)
                    if out:
                        yield b"".join(out)
                if not observer.done:
                    raise upstream_unreachable("upstream closed the stream before its final event", "protocol")
            except GatewayError as err:
                verdict = err.failure or "protocol"
                ctx.error_type = err.code or err.type
                yield ctx.surface.stream_error(err)
            else:
                clean = True
        finally:
            ctx.timing.end = ctx.timing.end or time.perf_counter()
            ctx.timing.upstream_busy = ctx.timing.end - ctx.timing.upstream_start
            if observer.done:
                self._resp.release()
            else:
                self._resp.close()
            if verdict is not None:
                self._lease.fail(verdict)
            elif clean:
                self._lease.succeed()
            else:
                self._lease.release()
                ctx.error_type = ctx.error_type or "client_disconnected"


AttemptHook = Callable[[RequestContext, dict[str, str]], None]


class Dispatcher:
    """Runs the upstream stage for one request at a time; shared by all requests of a gateway."""

    def __init__(
        self,
        cfg: GatewayConfig,
        cluster: ClusterState,
        transport: Transport,
        *,
        on_attempt: AttemptHook = lambda ctx, headers: None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.transport = transport
        self._on_attempt = on_attempt
        self._rng = rng or random.Random()
        self._sleep = sleep

    async def run(self, ctx: RequestContext, model: ModelConfig, key: int) -> Complete | StreamRelay:
        """Send the request, failing over before the first byte; raises the last GatewayError when none answer."""
        assert ctx.route_class is not None
        retries = self.cfg.upstream.retries
        backoff = self.cfg.upstream.backoff
        tried: set[str] = set()
        last: GatewayError | None = None
        if ctx.pinned is not None:
            retries = 0  # the state lives on that one replica: nowhere else to fail over to
        for attempt in range(1, retries + 2):
            try:
                route = self._pinned(ctx) if ctx.pinned is not None else pick(
                    model=model, decision=ctx.route_class, key=key, cluster=self.cluster,
                    cfg=self.cfg.routing, exclude=frozenset(tried), body=ctx.body, blocks=ctx.blocks,
                )  # fmt: skip
            except GatewayError as err:
                raise (last or err) from None
            ctx.route = route
            served = self.cfg.pools[route.pool].served_model
            payload = self._payload(ctx, served, route)
            headers = forward_headers(ctx.request_id)
            for name in ctx.surface.forward:
                if name in ctx.headers:
                    headers[name] = ctx.headers[name]
            self._on_attempt(ctx, headers)
            ctx.upstream_called = True
            assert route.target is not None, "pick always names the replica state"
            lease = Lease(route.target)
            try:
                ctx.timing.upstream_start = time.perf_counter()
                resp = await self.transport.send(route.replica, ctx.path, payload, headers)
            except GatewayError as err:
                lease.fail(err.failure or "connect")
                tried.add(route.replica)
                last = err
                ctx.error_type = err.code
                if attempt <= retries:
                    await self._sleep(backoff_s(attempt, self._rng, base_s=backoff.base_s, cap_s=backoff.cap_s))
                continue
            except BaseException:
                lease.release()
                raise
            ctx.error_type = None
            if ctx.stream and resp.status == 200:
                return StreamRelay(ctx, resp, lease, ctx.surface.stream_observer(ctx, served))
            with lease:
                try:
                    body = await resp.body()
                except GatewayError as err:
                    lease.fail(err.failure or "protocol")
                    raise
                finally:
                    ctx.timing.end = time.perf_counter()
                    ctx.timing.upstream_busy = ctx.timing.end - ctx.timing.upstream_start
                resp.release()
                lease.succeed()
            return self._complete(ctx, resp, body, served)
        assert last is not None
        raise last

    def _pinned(self, ctx: RequestContext) -> RouteDecision:
        assert ctx.pinned is not None
        pool_name, url = ctx.pinned
        pool = self.cluster.pools.get(pool_name)
        target = next((r for r in pool.replicas if r.url == url), None) if pool is not None else None
        if target is None or not target.available():
            raise GatewayError(
                503, f"The replica {url} that holds this response's state is not available.",
                type="service_unavailable", code="response_replica_unavailable",
            )  # fmt: skip
        assert pool is not None
        return RouteDecision(pool=pool_name, replica=url, policy=pool.policy.name, reason="response_affinity",
                             target=target)  # fmt: skip

    @staticmethod
    def _payload(ctx: RequestContext, served: str, route: RouteDecision) -> bytes:
        body = ctx.surface.upstream_body(
            ctx.body, served_model=served, priority=route.priority, cache_salt=ctx.cache_salt
        )
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError:
            # orjson parses deeper documents than it writes (its writer stops at 255 levels).
            raise bad_request("The request body is nested too deeply.", code="invalid_json") from None

    @staticmethod
    def _complete(ctx: RequestContext, resp: UpstreamResponse, body: bytes, served: str) -> Complete:
        if resp.status == 200:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                doc = None
            if isinstance(doc, dict):
                ctx.surface.read_reply(doc, ctx)
            body = ctx.surface.public_body(body, served, ctx.model)
            ctx.timing.first_token = ctx.timing.end
        else:
            body = ctx.surface.upstream_error(resp.status, body)
        return Complete(resp.status, body, resp.content_type)
