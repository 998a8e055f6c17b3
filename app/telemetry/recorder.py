"""The settle stage's telemetry: a SERVER span per inbound request, a CLIENT span per upstream call, metrics.

One Telemetry object per app (created by the app factory). Spans in flight are kept by request id between
`request_started` and `settle`/`record_rejected`. Attribute dicts for metrics are built once per distinct
label set and reused, so a settled request allocates little beyond its two spans.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.config import PoolConfig, TelemetryConfig
from app.context import RequestContext
from app.cost import IdleCostMeter, gpu_cost_per_s
from app.telemetry import spans as sp
from app.telemetry.headers import overhead_s
from app.telemetry.instruments import Instruments
from app.telemetry.prometheus import render
from app.telemetry.setup import build_providers

_log = logging.getLogger(__name__)

LIMIT_NAMES = frozenset({"rpm", "tpm", "concurrent", "budget"})
_UNKNOWN_TENANT = "unknown"
# Bounds on per-process bookkeeping: label sets are few in practice, open requests bounded by concurrency;
# the caps only matter if a caller forgets to settle or label values run wild.
_MAX_BOUND_ATTRS = 50_000
_MAX_OPEN = 100_000

_REQ_KEYS = ("tenant", "pool", "class", "status")
_REJ_KEYS = ("tenant", "status")
_ROUTE_KEYS = ("pool", "class", "policy", "reason")
_TENANT_POOL_KEYS = ("tenant", "pool")
_TOKENS_KEYS = ("tenant", "pool", "type")
_LIMITED_KEYS = ("tenant", "limit", "action")
_MOVED_KEYS = ("rule", "tenant")
_OVERHEAD_KEYS = ("pool", "stream")
_TOKEN_USAGE_KEYS = (sp.TOKEN_TYPE, sp.OPERATION_NAME, sp.REQUEST_MODEL, sp.PROVIDER, sp.KV_POOL, sp.KV_TENANT)
_DURATION_KEYS = (sp.OPERATION_NAME, sp.REQUEST_MODEL, sp.PROVIDER, sp.KV_POOL, sp.KV_CLASS, sp.ERROR_TYPE)
_SERVER_TIME_KEYS = (sp.OPERATION_NAME, sp.REQUEST_MODEL, sp.KV_POOL, sp.KV_CLASS)


class _Open:
    """The spans of one request still in flight."""

    __slots__ = ("client", "server")

    def __init__(self, server: Span | None) -> None:
        self.server = server
        self.client: Span | None = None


class Telemetry:
    """Spans and metrics for every request; Prometheus text for /metrics; OTLP/HTTP export when configured."""

    def __init__(
        self,
        cfg: TelemetryConfig,
        pools: Mapping[str, PoolConfig],
        *,
        span_exporter: SpanExporter | None = None,
        metric_readers: Sequence[MetricReader] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._providers = build_providers(cfg, span_exporter=span_exporter, metric_readers=metric_readers)
        self._tracer = self._providers.tracer_provider.get_tracer("kvgate")
        self._served_model = {name: pool.served_model for name, pool in pools.items()}
        self.idle_meters: dict[str, IdleCostMeter] = {}
        for name, pool in pools.items():
            rate = gpu_cost_per_s(pool.price)
            if rate is not None:
                self.idle_meters[name] = IdleCostMeter(rate, clock)
        self._pool_attrs = {name: {"pool": name} for name in self.idle_meters}
        meter = self._providers.meter_provider.get_meter("kvgate")
        self._inst = Instruments(meter, self._observe_idle, self._observe_gpu)
        self._propagator = TraceContextTextMapPropagator()
        self._open: dict[str, _Open] = {}
        self._bound: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._addresses: dict[str, tuple[str, int]] = {}
        self._closed = False

    # ---- request lifecycle -------------------------------------------------------------------------

    def request_started(self, ctx: RequestContext) -> None:
        """Open the SERVER span, continuing the caller's trace when it sent a traceparent."""
        try:
            parent: Context | None = None
            if "traceparent" in ctx.headers:
                parent = self._propagator.extract(ctx.headers)
            span = self._tracer.start_span(
                sp.server_span_name(ctx), context=parent, kind=SpanKind.SERVER,
                attributes=sp.server_start_attributes(ctx),
            )  # fmt: skip
            if len(self._open) >= _MAX_OPEN:
                self._evict_oldest()
            self._open[ctx.request_id] = _Open(span)
        except Exception:
            _log.warning("telemetry: request_started failed", exc_info=True)

    def upstream_started(self, ctx: RequestContext, headers: dict[str, str]) -> None:
        """Open a CLIENT span `{op} {model}` under the SERVER span; write traceparent into `headers`."""
        try:
            open_ = self._open.get(ctx.request_id)
            if open_ is None:
                open_ = _Open(None)
                self._open[ctx.request_id] = open_
            if open_.client is not None:
                # A retry: the previous attempt failed; close its span as such.
                _end_error(open_.client, ctx.error_type or "retry")
            route = ctx.route
            served = self._served_model.get(route.pool, ctx.model) if route else ctx.model
            address = self._address(route.replica) if route else ("", 0)
            attrs = sp.client_start_attributes(ctx, served, address)
            if ctx.tenant is not None and ctx.tenant.capture_content:
                attrs[sp.INPUT_MESSAGES] = sp.input_messages(ctx)
            parent = set_span_in_context(open_.server) if open_.server is not None else None
            if parent is None and "traceparent" in ctx.headers:
                parent = self._propagator.extract(ctx.headers)
            span = self._tracer.start_span(
                sp.client_span_name(ctx.operation, served), context=parent, kind=SpanKind.CLIENT,
                attributes=attrs,
            )  # fmt: skip
            open_.client = span
            self._propagator.inject(headers, context=set_span_in_context(span))
        except Exception:
            _log.warning("telemetry: upstream_started failed", exc_info=True)

    def settle(self, ctx: RequestContext) -> None:
        """End the request's spans with every attribute and record its metrics; never raises."""
        open_ = self._open.pop(ctx.request_id, None)
        try:
            self._record_metrics(ctx)
        except Exception:
            _log.warning("telemetry: settle metrics failed", exc_info=True)
        if open_ is None:
            return
        try:
            self._end_spans(ctx, open_)
        except Exception:
            _log.warning("telemetry: settle spans failed", exc_info=True)

    def record_rejected(self, ctx: RequestContext, status: int, reason: str) -> None:
        """A request answered by the gateway before any upstream call (4xx, 429, 503 no upstream)."""
        open_ = self._open.pop(ctx.request_id, None)
        try:
            tenant = ctx.tenant.id if ctx.tenant is not None else _UNKNOWN_TENANT
            self._inst.requests.add(1, self._bind(("rej", tenant, str(status)), _REJ_KEYS))
            if status == 429 and reason in LIMIT_NAMES:
                self.record_limited(ctx, reason, "reject")
            if open_ is not None and open_.server is not None:
                span = open_.server
                span.set_attribute(sp.HTTP_STATUS, status)
                span.set_attribute(sp.KV_REJECTED, reason)
                if ctx.tenant is not None:
                    span.set_attribute(sp.KV_TENANT, ctx.tenant.id)
                if status >= 500:
                    span.set_attribute(sp.ERROR_TYPE, str(status))
                    span.set_status(Status(StatusCode.ERROR))
                span.end()
            if open_ is not None and open_.client is not None:
                _end_error(open_.client, reason)
        except Exception:
            _log.warning("telemetry: record_rejected failed", exc_info=True)

    def record_limited(self, ctx: RequestContext, limit: str, action: str) -> None:
        """A request over a limit (`rpm|tpm|concurrent|budget`), rejected or degraded (`reject|degrade`)."""
        try:
            tenant = ctx.tenant.id if ctx.tenant is not None else _UNKNOWN_TENANT
            self._inst.rate_limited.add(1, self._bind(("lim", tenant, limit, action), _LIMITED_KEYS))
        except Exception:
            _log.warning("telemetry: record_limited failed", exc_info=True)

    # ---- exposition and lifecycle ------------------------------------------------------------------

    def render_prometheus(self) -> tuple[bytes, str]:
        """The /metrics body and its content type (same instruments the OTLP exporter sends)."""
        return render(self._providers.prometheus_registry)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export pending spans and an OTLP metrics snapshot now (blocking; tests and shutdown)."""
        ok = self._providers.tracer_provider.force_flush(int(timeout_s * 1000))
        reader = self._providers.otlp_metric_reader
        if reader is not None:
            ok = reader.force_flush(timeout_s * 1000) and ok
        return ok

    async def shutdown(self) -> None:
        """Flush and stop exporters (off the event loop: OTLP export blocks on the network)."""
        if self._closed:
            return
        self._closed = True
        for open_ in self._open.values():
            _end_open(open_)
        self._open.clear()
        await asyncio.to_thread(self._shutdown_sync)

    def _shutdown_sync(self) -> None:
        self._providers.tracer_provider.shutdown()
        self._providers.meter_provider.shutdown()

    # ---- internals ---------------------------------------------------------------------------------

    def _bind(self, key: tuple[Any, ...], names: tuple[str, ...]) -> dict[str, Any]:
        """The attribute dict for a label set (key[0] tags the metric), built once; None values omitted."""
        attrs = self._bound.get(key)
        if attrs is None:
            if len(self._bound) >= _MAX_BOUND_ATTRS:
                self._bound.clear()
            attrs = {n: v for n, v in zip(names, key[1:], strict=True) if v is not None}
            self._bound[key] = attrs
        return attrs

    def _address(self, replica: str) -> tuple[str, int]:
        addr = self._addresses.get(replica)
        if addr is None:
            addr = sp.replica_address(replica)
            self._addresses[replica] = addr
        return addr

    def _evict_oldest(self) -> None:
        request_id = next(iter(self._open))
        _end_open(self._open.pop(request_id))

    def _observe_idle(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(m.idle_cost(), self._pool_attrs[p]) for p, m in self.idle_meters.items()]

    def _observe_gpu(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(m.gpu_cost(), self._pool_attrs[p]) for p, m in self.idle_meters.items()]

    def _record_metrics(self, ctx: RequestContext) -> None:
        inst = self._inst
        bind = self._bind
        tenant = ctx.tenant.id if ctx.tenant is not None else _UNKNOWN_TENANT
        route = ctx.route
        pool = route.pool if route is not None else None
        rclass = ctx.route_class.route_class if ctx.route_class is not None else None
        timing = ctx.timing
        end = timing.end or time.perf_counter()
        err = sp.error_type(ctx)

        inst.requests.add(1, bind(("req", tenant, pool, rclass, str(ctx.status)), _REQ_KEYS))
        if timing.start:
            inst.overhead.record(
                overhead_s(timing, end), bind(("ovh", pool, "true" if ctx.stream else "false"), _OVERHEAD_KEYS)
            )
        report = ctx.normalize_report
        if report is not None:
            for rule, n in report.moved.items():
                if n > 0:
                    inst.normalize_moved.add(n, bind(("mov", rule, tenant), _MOVED_KEYS))
        if route is None or pool is None:
            return

        inst.route_decisions.add(1, bind(("rte", pool, rclass, route.policy, route.reason), _ROUTE_KEYS))
        usage = ctx.usage
        uncached, cached, output = usage.uncached_tokens, usage.cached_tokens, usage.completion_tokens
        if uncached:
            inst.tenant_tokens.add(uncached, bind(("tok", tenant, pool, "uncached"), _TOKENS_KEYS))
        if cached:
            inst.tenant_tokens.add(cached, bind(("tok", tenant, pool, "cached"), _TOKENS_KEYS))
        if output:
            inst.tenant_tokens.add(output, bind(("tok", tenant, pool, "output"), _TOKENS_KEYS))
        tenant_pool = bind(("tp", tenant, pool), _TENANT_POOL_KEYS)
        if ctx.cost_usd > 0.0:
            inst.tenant_cost.add(ctx.cost_usd, tenant_pool)
            idle = self.idle_meters.get(pool)
            if idle is not None:
                idle.charge(ctx.cost_usd)
        # A counter cannot go down: requests that cost more than the reference add nothing (the span keeps
        # the signed figure).
        if ctx.savings_usd > 0.0:
            inst.tenant_savings.add(ctx.savings_usd, tenant_pool)

        if not timing.upstream_start:
            return
        op = ctx.operation
        model = self._served_model.get(pool, ctx.model)
        provider = sp.PROVIDER_NAME
        inst.operation_duration.record(
            max(end - timing.upstream_start, 0.0),
            bind(("dur", op, model, provider, pool, rclass, err), _DURATION_KEYS),
        )
        if usage.prompt_tokens or usage.completion_tokens:
            inst.token_usage.record(
                usage.prompt_tokens, bind(("tu", "input", op, model, provider, pool, tenant), _TOKEN_USAGE_KEYS)
            )
            inst.token_usage.record(
                output, bind(("tu", "output", op, model, provider, pool, tenant), _TOKEN_USAGE_KEYS)
            )
        # Token timings exist only where tokens were observed arriving one by one: successful streams.
        if ctx.stream and err is None and timing.first_token:
            server_attrs = bind(("srv", op, model, pool, rclass), _SERVER_TIME_KEYS)
            inst.time_to_first_token.record(max(timing.first_token - timing.upstream_start, 0.0), server_attrs)
            if output > 1:
                inst.time_per_output_token.record(max(end - timing.first_token, 0.0) / (output - 1), server_attrs)

    def _end_spans(self, ctx: RequestContext, open_: _Open) -> None:
        err = sp.error_type(ctx)
        if open_.client is not None:
            route = ctx.route
            served = self._served_model.get(route.pool, ctx.model) if route is not None else ctx.model
            client = open_.client
            client.set_attributes(sp.client_end_attributes(ctx, served))
            if err is not None:
                client.set_status(Status(StatusCode.ERROR))
            client.end()
        server = open_.server
        if server is not None:
            attrs = sp.gateway_attributes(ctx)
            attrs[sp.HTTP_STATUS] = ctx.status
            if ctx.timing.start:
                attrs[sp.KV_OVERHEAD_MS] = overhead_s(ctx.timing) * 1000.0
            # HTTP server spans are errors on 5xx only; a 4xx is the client's mistake.
            if ctx.status >= 500:
                attrs[sp.ERROR_TYPE] = err or str(ctx.status)
                server.set_status(Status(StatusCode.ERROR))
            server.set_attributes(attrs)
            server.end()


def _end_error(span: Span, error: str) -> None:
    span.set_attribute(sp.ERROR_TYPE, error)
    span.set_status(Status(StatusCode.ERROR))
    span.end()


def _end_open(open_: _Open) -> None:
    if open_.client is not None:
        _end_error(open_.client, "abandoned")
    if open_.server is not None:
        _end_error(open_.server, "abandoned")
