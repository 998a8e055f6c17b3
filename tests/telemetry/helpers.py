"""Builders for telemetry tests: pools, a Telemetry harness with in-memory sinks, settled contexts."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.config import PoolConfig, PriceConfig
from app.context import (
    ClassDecision,
    NormalizeReport,
    RequestContext,
    RouteDecision,
    Tenant,
    Timing,
    Usage,
)
from app.cost import pool_prices, request_cost
from app.surfaces import CHAT
from app.telemetry import Telemetry

SECRET_PROMPT = "the-launch-code-is-7391"

POOLS = {
    "fast": PoolConfig(
        role="interactive",
        served_model="smollm2-fast",
        replicas=["http://127.0.0.1:8001"],
        price=PriceConfig(gpu_hour_usd=2.5, gpus=1, capacity_tokens_per_s=1500),
    ),
    "bulk": PoolConfig(
        role="bulk",
        served_model="smollm2-bulk",
        replicas=["http://127.0.0.1:8002"],
        price=PriceConfig(input_per_m=0.2, output_per_m=0.8),
    ),
}


class FakeClock:
    """A settable monotonic clock for the idle meters."""

    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Harness:
    """A Telemetry wired to in-memory span and metric sinks."""

    telemetry: Telemetry
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    clock: FakeClock


_ids = itertools.count()


def make_ctx(
    *,
    tenant: str = "acme",
    pool: str = "fast",
    stream: bool = True,
    capture_content: bool = False,
    status: int = 200,
    error_type: str | None = None,
    prompt_tokens: int = 1200,
    cached_tokens: int = 800,
    completion_tokens: int = 40,
    headers: dict[str, str] | None = None,
) -> RequestContext:
    """A context as the pipeline leaves it just before settle (timings in perf_counter seconds)."""
    ctx = RequestContext(
        request_id=f"req-{next(_ids)}",
        surface=CHAT,
        path="/v1/chat/completions",
        body={
            "model": "smollm2",
            "messages": [
                {"role": "system", "content": f"You are helpful. {SECRET_PROMPT}"},
                {"role": "user", "content": "hello"},
            ],
            "max_tokens": 64,
            "temperature": 0.2,
            "top_p": 0.9,
            "stream": stream,
        },
        model="smollm2",
        stream=stream,
        client_wants_usage=True,
        headers=headers or {},
        timing=Timing(
            start=10.0, upstream_start=10.0004, first_token=10.06, end=10.5, upstream_busy=0.4995
        ),
        tenant=Tenant(id=tenant, capture_content=capture_content),
        normalize_report=NormalizeReport(mode="on", moved={"iso_timestamp": 2, "uuid": 1}, applied=True),
        route_class=ClassDecision("interactive" if pool == "fast" else "bulk", "tenant_default"),
        route=RouteDecision(pool=pool, replica=POOLS[pool].replicas[0], policy="round_robin", reason="only"),
        usage=Usage(prompt_tokens, completion_tokens, cached_tokens, reported=True),
        status=status,
        error_type=error_type,
        response_id="chatcmpl-123",
        finish_reasons=["stop"],
    )
    ctx.cost_usd = request_cost(ctx.usage, pool_prices(POOLS[pool].price))
    ctx.savings_usd = 0.01 - ctx.cost_usd
    return ctx


def run_request(telemetry: Telemetry, ctx: RequestContext) -> dict[str, str]:
    """Drive one request through the telemetry hooks; returns the outgoing upstream headers."""
    outgoing: dict[str, str] = {}
    telemetry.request_started(ctx)
    telemetry.upstream_started(ctx, outgoing)
    telemetry.settle(ctx)
    return outgoing
