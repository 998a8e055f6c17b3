"""The settle stage's telemetry: a SERVER span per inbound request, a CLIENT span per upstream call, metrics.

One Telemetry object per app (created by the app factory). Spans in flight are kept by request id between
`request_started` and `settle`/`record_rejected`. Metrics go to a MetricStore (a dict update per metric,
see aggregate.py) that every OTel reader collects from. With no span consumer configured (OTLP off, no
exporter injected) no spans are built at all; an inbound traceparent is still passed on to vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.config import PoolConfig, TelemetryConfig
from app.context import RequestContext
from app.cost import IdleCostMeter, gpu_cost_per_s
from app.telemetry import spans as sp
from app.telemetry.aggregate import MetricStore
from app.telemetry.headers import overhead_s
from app.telemetry.instruments import Instruments
from app.telemetry.prometheus import render
from app.telemetry.setup import build_providers, merge_store

_log = logging.getLogger(__name__)

LIMIT_NAMES = frozenset({"rpm", "tpm", "concurrent", "budget"})
_UNKNOWN_TENANT = "unknown"
# Open requests are bounded by concurrency; the cap only matters if a caller forgets to settle.
_MAX_OPEN = 100_000
_TRACE_HEADERS = ("traceparent", "tracestate")


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
        self._tracing = self._providers.tracing
        self._tracer = self._providers.tracer_provider.get_tracer("kvgate")
        self._served_model = {name: pool.served_model for name, pool in pools.items()}
        self.idle_meters: dict[str, IdleCostMeter] = {}
        for name, pool in pools.items():
            rate = gpu_cost_per_s(pool.price)
            if rate is not None:
                self.idle_meters[name] = IdleCostMeter(rate, clock)
        self._pool_attrs = {name: {"pool": name} for name in self.idle_meters}
        self._store = MetricStore()
        self._inst = Instruments(self._store, self._observe_idle, self._observe_gpu)
        start_ns = time.time_ns()
        merge_store(self._providers, lambda: self._store.collect(start_ns, time.time_ns()))
        self._propagator = TraceContextTextMapPropagator()
        self._open: dict[str, _Open] = {}
        self._addresses: dict[str, tuple[str, int]] = {}
        # The Prometheus reader queues one snapshot per collect and renders all queued ones: two scrapes at
        # once could each render the other's snapshot too (duplicate samples) — serialize them.
        self._render_lock = threading.Lock()
        # With `serve --workers N`: merges the other workers' expositions into this one (app/telemetry/workers.py).
        self.gather: Callable[[bytes], bytes] | None = None
        self._closed = False

    @property
    def meter(self) -> Meter:
        """An OTel Meter whose instruments export alongside the gateway's (for low-rate, off-path metrics)."""
        return self._providers.meter_provider.get_meter("kvgate.extra")

    @property
    def tracer(self) -> Tracer | None:
        """The gateway's tracer for work off the request path (a pre-warm), None when tracing is off."""
        return self._tracer if self._tracing else None

    # ---- request lifecycle -------------------------------------------------------------------------

    def request_started(self, ctx: RequestContext) -> None:
        """Open the SERVER span, continuing the caller's trace when it sent a traceparent."""
        if not self._tracing:
            return
        try:
            parent: Context | None = None
            if "traceparent" in ctx.headers:
                parent = self._propagator.extract(ctx.headers)
            span = self._tracer.start_span(
                sp.server_span_name(ctx), context=parent, kind=SpanKind.SERVER,
                attributes=sp.server_start_attributes(ctx),
            )
            if len(self._open) >= _MAX_OPEN:
                self._evict_oldest()
            self._open[ctx.request_id] = _Open(span)
        except Exception:
            _log.warning("telemetry: request_started failed", exc_info=True)

    def upstream_started(self, ctx: RequestContext, headers: dict[str, str]) -> None:
        """Open a CLIENT span `{op} {model}` under the SERVER span; write traceparent into `headers`."""
        if not self._tracing:
            # No spans of ours: vLLM still joins the caller's trace, if there is one.
            for name in _TRACE_HEADERS:
                value = ctx.headers.get(name)
                if value is not None:
                    headers[name] = value
            return
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
            )
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
            with self._store.lock:
                self._inst.requests.add((tenant, None, None, str(status), ctx.surface.name), 1)
                if status == 429 and reason in LIMIT_NAMES:
                    self._inst.rate_limited.add((tenant, reason, "reject"), 1)
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
            with self._store.lock:
                self._inst.rate_limited.add((tenant, limit, action), 1)
        except Exception:
            _log.warning("telemetry: record_limited failed", exc_info=True)

    def queue_wait_zeros(self) -> Callable[[tuple[str, str, str]], None]:
        """The counter of 0 s queue waits, called with (pool, tenant, route class): the admission fast path counts
        every start below saturation through it, one call where `record_queue_wait(..., 0.0)` was two and a
        branch (about 0.5 % of the in-process request, docs/measurements/engine-facts.md, session 10). A dict
        increment on the event loop; the collector folds the counts in (`HistogramAgg.record_zero`)."""
        return self._inst.queue_wait.record_zero

    def record_queue_wait(self, pool: str, tenant: str, route_class: str, seconds: float) -> None:
        """An admitted request's wait in `pool`'s admission queue (0 when it started at once)."""
        try:
            if seconds == 0.0:  # the fast path below saturation: no lock per request
                self._inst.queue_wait.record_zero((pool, tenant, route_class))
                return
            with self._store.lock:
                self._inst.queue_wait.record((pool, tenant, route_class), seconds)
        except Exception:
            _log.warning("telemetry: record_queue_wait failed", exc_info=True)

    # ---- exposition and lifecycle ------------------------------------------------------------------

    def render_prometheus(self) -> tuple[bytes, str]:
        """The /metrics body and its content type (same metrics the OTLP exporter sends).

        Takes milliseconds with many series (prometheus_client formats line by line): call it from a worker
        thread (`await asyncio.to_thread(...)`) rather than on the event loop; it is thread-safe.
        """
        body, content_type = self.render_own()
        return (body if self.gather is None else self.gather(body)), content_type

    def render_own(self) -> tuple[bytes, str]:
        """This process's metrics only (what a worker hands the one answering /metrics)."""
        with self._render_lock:
            return render(self._providers.prometheus_registry)

    def force_flush(self, timeout_s: float = 5.0, *, metrics: bool = True) -> bool:
        """Export pending spans and (unless `metrics` is False) an OTLP metrics snapshot now (blocking)."""
        ok = self._providers.tracer_provider.force_flush(int(timeout_s * 1000))
        reader = self._providers.otlp_metric_reader
        if metrics and reader is not None:
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

    def _address(self, replica: str) -> tuple[str, int]:
        addr = self._addresses.get(replica)
        if addr is None:
            addr = sp.replica_address(replica)
            self._addresses[replica] = addr
        return addr

    def _evict_oldest(self) -> None:
        request_id = next(iter(self._open))
        _end_open(self._open.pop(request_id))

    def _observe_idle(self) -> list[tuple[dict[str, Any], float]]:
        return [(self._pool_attrs[p], m.idle_cost()) for p, m in self.idle_meters.items()]

    def _observe_gpu(self) -> list[tuple[dict[str, Any], float]]:
        return [(self._pool_attrs[p], m.gpu_cost()) for p, m in self.idle_meters.items()]

    def _record_metrics(self, ctx: RequestContext) -> None:
        inst = self._inst
        tenant = ctx.tenant.id if ctx.tenant is not None else _UNKNOWN_TENANT
        route = ctx.route
        pool = route.pool if route is not None else None
        rclass = ctx.route_class.route_class if ctx.route_class is not None else None
        timing = ctx.timing
        end = timing.end or time.perf_counter()
        err = sp.error_type(ctx)
        usage = ctx.usage
        report = ctx.normalize_report
        charge = 0.0
        with self._store.lock:
            inst.requests.add((tenant, pool, rclass, str(ctx.status), ctx.surface.name), 1)
            if timing.start:
                inst.overhead.record((pool, "true" if ctx.stream else "false"), overhead_s(timing, end))
            if report is not None:
                for rule, n in report.moved.items():
                    if n > 0:
                        inst.normalize_moved.add((rule, tenant), n)
            for outcome in ctx.migration_outcomes:
                inst.migrations.add((pool, outcome), 1)
            ticket = ctx.queue_ticket
            if ticket is not None:
                # What the fair share was charged in the end (settle corrected the prediction first).
                inst.queue_tokens.add((ticket.pool, tenant), ticket.charged_tokens)
            if route is not None and pool is not None:
                inst.route_decisions.add((pool, rclass, route.policy, route.reason), 1)
                uncached, cached, output = usage.uncached_tokens, usage.cached_tokens, usage.completion_tokens
                if uncached:
                    inst.tenant_tokens.add((tenant, pool, "uncached"), uncached)
                if cached:
                    inst.tenant_tokens.add((tenant, pool, "cached"), cached)
                if output:
                    inst.tenant_tokens.add((tenant, pool, "output"), output)
                if ctx.cost_usd > 0.0:
                    inst.tenant_cost.add((tenant, pool), ctx.cost_usd)
                    charge = ctx.cost_usd
                # A counter cannot go down: requests that cost more than the reference add nothing (the span
                # keeps the signed figure).
                if ctx.savings_usd > 0.0:
                    inst.tenant_savings.add((tenant, pool), ctx.savings_usd)
                if timing.upstream_start:
                    self._record_genai(ctx, pool, rclass, tenant, err, end)
        if charge:
            idle = self.idle_meters.get(pool or "")
            if idle is not None:
                idle.charge(charge)

    def _record_genai(
        self, ctx: RequestContext, pool: str, rclass: str | None, tenant: str, err: str | None, end: float
    ) -> None:
        """GenAI client/server histograms of one upstream call; the caller holds the store lock."""
        inst = self._inst
        timing = ctx.timing
        usage = ctx.usage
        op = ctx.operation
        model = self._served_model.get(pool, ctx.model)
        provider = sp.PROVIDER_NAME
        inst.operation_duration.record(
            (op, model, provider, err, pool, rclass), max(end - timing.upstream_start, 0.0)
        )
        output = usage.completion_tokens
        if usage.prompt_tokens or output:
            inst.token_usage.record(("input", op, model, provider, pool, tenant), usage.prompt_tokens)
            inst.token_usage.record(("output", op, model, provider, pool, tenant), output)
        # Token timings exist only where tokens were observed arriving one by one: successful streams.
        if ctx.stream and err is None and timing.first_token:
            key = (op, model, pool, rclass)
            inst.time_to_first_token.record(key, max(timing.first_token - timing.upstream_start, 0.0))
            if output > 1:
                inst.time_per_output_token.record(key, max(end - timing.first_token, 0.0) / (output - 1))

    def _end_spans(self, ctx: RequestContext, open_: _Open) -> None:
        err = sp.error_type(ctx)
        if open_.client is not None:
            route = ctx.route
            served = self._served_model.get(route.pool, ctx.model) if route is not None else ctx.model
            client = open_.client
            # Sampled-out spans (OTEL_TRACES_SAMPLER) skip the attribute work.
            if client.is_recording():
                client.set_attributes(sp.client_end_attributes(ctx, served))
                if err is not None:
                    client.set_status(Status(StatusCode.ERROR))
            client.end()
        server = open_.server
        if server is not None and server.is_recording():
            # The CLIENT span carries the full kvgate.* set; the SERVER span just what finds a request.
            attrs = sp.server_end_attributes(ctx)
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
