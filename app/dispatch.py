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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import orjson

from app.admission.step import fair_priority
from app.attribution import Attribution
from app.config import GatewayConfig, ModelConfig
from app.context import RequestContext, RouteDecision
from app.errors import GatewayError, UpstreamStatusError, bad_request, upstream_timeout
from app.failure_budget import FailureBudget
from app.kvcache.replies import assistant_message
from app.relay import Continued, StreamRelay
from app.routing.hang import HangWatch
from app.routing.lease import Lease
from app.routing.load_report import LOAD_REPORT_PATHS, REQUEST_HEADER, parse_load_report
from app.routing.pick import pick
from app.routing.retry import backoff_s
from app.routing.session_key import SessionKey, session_key
from app.routing.state import ClusterState, ReplicaState
from app.surfaces.migration import Delivered, Migration
from app.upstream import Transport, UpstreamResponse, forward_headers


@dataclass(slots=True)
class Complete:
    """A whole upstream answer (non-streaming, or an error status), its model name already public."""

    status: int
    body: bytes
    content_type: str


AttemptHook = Callable[[RequestContext, dict[str, str]], None]
_NONE_TRIED: frozenset[str] = frozenset()  # a first attempt excludes nothing: no new set per request


class Dispatcher:
    """Runs the upstream stage for one request at a time; shared by all requests of a gateway."""

    def __init__(
        self,
        cfg: GatewayConfig,
        cluster: ClusterState,
        transport: Transport,
        *,
        on_attempt: AttemptHook = lambda ctx, headers: None,
        on_pick: Callable[[RequestContext], None] = lambda ctx: None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.transport = transport
        self._on_attempt = on_attempt
        self._on_pick = on_pick
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._clock = clock  # the scraper's clock: in-band reports and scrapes are ordered on it
        self.failures = FailureBudget(cfg.upstream.failure_budget, clock)
        self._hangs = HangWatch(cfg.upstream.idle_timeout_s)
        # Per pool: the load-report format to ask for, None where the pool turned it off.
        self._ask_load = {
            name: pool.load_report.format if pool.load_report.enabled else None for name, pool in cfg.pools.items()
        }

    def _session(self, ctx: RequestContext) -> SessionKey | None:
        """The request's session (app/routing/session_key.py), salted as its routing key is."""
        settings = self.cfg.routing.sessions
        if not settings.enabled:
            return None
        salt = ctx.cache_salt or (ctx.tenant.id if ctx.tenant is not None else "")
        return session_key(ctx.headers, ctx.body, ctx.prompt, salt, history=settings.history)

    async def run(self, ctx: RequestContext, model: ModelConfig, key: int) -> Complete | StreamRelay:
        """Send the request, failing over before the first byte; raises the last GatewayError when none answer."""
        retries = self.cfg.upstream.retries
        if ctx.pinned is not None:
            retries = 0  # the state lives on that one replica: nowhere else to fail over to
        self.failures.check(ctx.tenant_id, ctx.client)
        blame = Attribution()
        try:
            return await self._attempts(ctx, model, key, retries, blame)
        except UpstreamStatusError:
            self.failures.charge(ctx.tenant_id, ctx.client)  # no replica served it: the caller pays one
            raise
        finally:
            blame.abandon()

    async def _attempts(
        self, ctx: RequestContext, model: ModelConfig, key: int, retries: int, blame: Attribution
    ) -> Complete | StreamRelay:
        assert ctx.route_class is not None
        backoff = self.cfg.upstream.backoff
        tried: set[str] = set()
        last: GatewayError | None = None
        # A stream's bytes come steadily: silence this long is a hung replica. A whole body comes at the end.
        idle_s = self.cfg.upstream.idle_timeout_s if ctx.stream else None
        session = self._session(ctx) if ctx.pinned is None else None
        for attempt in range(1, retries + 2):
            try:
                route = self._pinned(ctx) if ctx.pinned is not None else pick(
                    model=model, decision=ctx.route_class, key=key, cluster=self.cluster,
                    cfg=self.cfg.routing, exclude=frozenset(tried) if tried else _NONE_TRIED, body=ctx.body,
                    blocks=ctx.blocks,
                    session=session,
                    tenant=ctx.tenant_id, prompt_tokens=ctx.estimated_input_tokens,
                )
            except GatewayError as err:
                blame.exhausted()
                raise (last or err) from None
            ctx.route = route
            self._on_pick(ctx)  # cost before the call: the route's predicted cache hit is known from here on
            route.priority = fair_priority(route.priority, ctx.queue_ticket)
            served = self.cfg.pools[route.pool].served_model
            payload = self._payload(ctx, served, route)
            headers = forward_headers(ctx.request_id)
            for name in ctx.surface.forward:
                if name in ctx.headers:
                    headers[name] = ctx.headers[name]
            ask = self._ask_load.get(route.pool)
            if ask is not None and ctx.path in LOAD_REPORT_PATHS:
                headers[REQUEST_HEADER] = ask
            self._on_attempt(ctx, headers)
            ctx.upstream_called = True
            assert route.target is not None, "pick always names the replica state"
            # pick and _pinned set a ReplicaState (annotated, not cast(): that is a call on every attempt)
            replica: ReplicaState = route.target  # type: ignore[assignment]
            lease = Lease(replica)
            try:
                ctx.timing.upstream_start = time.perf_counter()
                if idle_s is not None:  # a stream: its silence is bounded by idle_s (no hang watch, no extra frame)
                    resp = await self.transport.send(replica.url, ctx.path, payload, headers, idle_s=idle_s)
                else:
                    resp = await self._send_whole(replica, ctx.path, payload, headers)
            except GatewayError as err:
                tried.add(route.replica)
                last = err
                ctx.error_type = err.code
                if blame.failed(lease, err):  # the same 5xx twice: this body fails everywhere
                    assert isinstance(err, UpstreamStatusError)
                    self.failures.charge(ctx.tenant_id, ctx.client)
                    return self._repeated(ctx, err)
                if attempt <= retries:
                    await self._sleep(backoff_s(attempt, self._rng, base_s=backoff.base_s, cap_s=backoff.cap_s))
                continue
            except BaseException:
                lease.release()
                raise
            ctx.error_type = None
            blame.answered(resp.status)
            # A stream the engine answered in JSON (a path that never streams) is relayed whole, not waited on.
            if ctx.stream and resp.status == 200 and not resp.content_type.startswith("application/json"):
                self._note_load(replica, resp)  # vLLM 0.32 sends none on streams; a later one may
                return StreamRelay(
                    ctx, resp, lease, ctx.surface.stream_observer(ctx, served),
                    migrate=self._migrate, migration=ctx.surface.migration,
                    max_migrations=self.cfg.upstream.max_migrations,
                )
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
            self._note_load(replica, resp)
            return self._complete(ctx, resp, body, served)
        blame.exhausted()
        assert last is not None
        raise last

    async def _send_whole(
        self, replica: ReplicaState, path: str, payload: bytes, headers: dict[str, str]
    ) -> UpstreamResponse:
        """The transport's send of a whole-body request, its wait bounded by the replica's health
        (app/routing/hang.py): a hung replica's attempt ends as a timeout, and is retried."""
        task = self._hangs.enter(replica)
        try:
            resp = await self.transport.send(replica.url, path, payload, headers)
        except asyncio.CancelledError:
            if not self._hangs.leave(task) or task is None:
                raise
            task.uncancel()
            raise upstream_timeout(f"upstream {replica.url} stopped answering its probes during the request") from None
        except BaseException:
            self._hangs.leave(task)
            raise
        self._hangs.leave(task)
        return resp

    def _repeated(self, ctx: RequestContext, err: UpstreamStatusError) -> Complete:
        """The answer to a body two replicas failed the same way: the engine's status and error, in the API's
        envelope (it would fail the same way on every other replica)."""
        ctx.error_type = "upstream_repeated_failure"
        ctx.timing.end = time.perf_counter()
        body = ctx.surface.upstream_error(err.upstream_status, err.upstream_body)
        return Complete(err.upstream_status, body, "application/json")

    async def _migrate(self, ctx: RequestContext, migration: Migration, got: Delivered) -> Continued | None:
        """Continue a cut stream on another replica (the surface's migration); None when none takes it."""
        assert ctx.route is not None and ctx.route_class is not None
        model = self.cfg.model(ctx.model)
        assert model is not None
        ctx.migration_failed.add(ctx.route.replica)
        try:
            route = pick(
                model=model, decision=ctx.route_class, key=0, cluster=self.cluster, cfg=self.cfg.routing,
                exclude=frozenset(ctx.migration_failed), body=ctx.body,
            )
        except GatewayError:
            ctx.migration_outcomes.append("no_replica")
            return None
        assert route.target is not None
        served = self.cfg.pools[route.pool].served_model
        sent = await self._count_tokens(route.replica, served, got.resume_text()) or got.chunks
        resend = migration.continuation(ctx, got, sent, served, route.priority)
        lease = Lease(cast(ReplicaState, route.target))  # pick set a ReplicaState
        try:
            payload = orjson.dumps(resend.body)
            resp = await self.transport.send(route.replica, resend.path, payload, forward_headers(ctx.request_id),
                                             idle_s=self.cfg.upstream.idle_timeout_s)
        except GatewayError as err:
            lease.fail(err.failure or "connect")
            ctx.migration_outcomes.append("failed")
            return None
        except BaseException:
            lease.release()
            raise
        if resp.status != 200:
            with lease:
                await resp.body()
                resp.release()
                lease.succeed()
            ctx.migration_outcomes.append("refused")
            return None
        ctx.migrations += 1
        ctx.migration_outcomes.append("migrated")
        route.reason, route.attempt = "migration", (ctx.route.attempt + 1)
        route.detail = f"continued from {ctx.route.replica} after {sent} tokens"
        ctx.route = route
        got.id = got.id or ctx.response_id
        return Continued(resp, lease, ctx.surface.stream_observer(ctx, served), migration.splice(got, sent))

    async def _count_tokens(self, replica: str, served: str, text: str) -> int | None:
        # The continuation's output cap and the usage split need the delivered text in tokens: the replica's
        # own tokenizer says (vLLM's /tokenize); chunks are a lower bound when it cannot answer.
        if not text:
            return 0
        payload = orjson.dumps({"model": served, "prompt": text, "add_special_tokens": False})
        try:
            resp = await self.transport.send(replica, "/tokenize", payload, forward_headers(""))
            raw = await resp.body()
            resp.release()
        except GatewayError:
            return None
        doc = orjson.loads(raw) if raw.startswith(b"{") else None
        count = doc.get("count") if isinstance(doc, dict) else None
        return count if isinstance(count, int) and resp.status == 200 else None

    def _note_load(self, replica: ReplicaState, resp: UpstreamResponse) -> None:
        """Feed the reply's in-band load report into the replica's state (after its lease ended: vLLM's report
        no longer counts the request either)."""
        raw = resp.load_report
        if raw is None:
            return
        report = parse_load_report(raw)
        if report is None:
            replica.load_reports_unparsable += 1
        else:
            replica.apply_load_report(report, self._clock())

    def _pinned(self, ctx: RequestContext) -> RouteDecision:
        assert ctx.pinned is not None
        pool_name, url = ctx.pinned
        pool = self.cluster.pools.get(pool_name)
        target = next((r for r in pool.replicas if r.url == url), None) if pool is not None else None
        if target is None or not target.available():
            raise GatewayError(
                503, f"The replica {url} that holds this response's state is not available.",
                type="service_unavailable", code="response_replica_unavailable",
            )
        assert pool is not None
        return RouteDecision(pool=pool_name, replica=url, policy=pool.policy.name, reason="response_affinity",
                             target=target)

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
                if ctx.blocks is not None:  # hashed for kv_events: its reply is learned once sent
                    ctx.reply = partial(assistant_message, doc)
            body = ctx.surface.public_body(body, served, ctx.model)
            ctx.timing.first_token = ctx.timing.end
            return Complete(resp.status, body, resp.content_type)
        # Error bodies leave in the surface's JSON envelope, whatever the upstream's own type was.
        return Complete(resp.status, ctx.surface.upstream_error(resp.status, body), "application/json")
