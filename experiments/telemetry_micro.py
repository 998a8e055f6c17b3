"""Per-request cost of the settle stage's telemetry and cost arithmetic, against a no-op baseline, side by side.

Each variant drives the same pre-built request contexts through the three hooks the pipeline calls
(request_started, upstream_started, settle) and through the cost arithmetic. Columns (medians over runs):
CPU µs per request of the calling thread (what the request path pays), of the whole process including the
exporter threads (what throughput pays; each run ends with a flush so queued exports are counted), CPU µs
of settle() alone, and the net request-path CPU as a share of the 300 µs budget for
auth+limits+cost+telemetry. CPU time rather than wall time, so a busy machine skews the table less.

Variants: a no-op Telemetry stand-in (loop and call overhead); the default (OTLP off: metrics only, no spans
built); spans into a null exporter (span building cost alone); OTLP/HTTP to a loopback sink (batch span
processor + periodic metric reader, protobuf encoding and HTTP included in the process column).

    .venv/bin/python experiments/telemetry_micro.py [--requests 1000] [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from app.config import PoolConfig, PriceConfig, ReferencePrice, TelemetryConfig
from app.context import ClassDecision, NormalizeReport, RequestContext, RouteDecision, Tenant, Timing, Usage
from app.cost import pool_prices, reference_prices, request_cost, request_savings
from app.telemetry import Telemetry

BUDGET_US = 300.0
POOLS = {
    "fast": PoolConfig(
        role="interactive", served_model="m-fast", replicas=["http://127.0.0.1:8001"],
        price=PriceConfig(gpu_hour_usd=2.5, capacity_tokens_per_s=1500),
    ),
    "bulk": PoolConfig(
        role="bulk", served_model="m-bulk", replicas=["http://127.0.0.1:8002"],
        price=PriceConfig(gpu_hour_usd=2.5, capacity_tokens_per_s=6000),
    ),
}
PRICES = {name: pool_prices(p.price) for name, p in POOLS.items()}
REFERENCE = reference_prices(ReferencePrice())


class NoopTelemetry:
    """Same hooks, no work: measures the loop and call overhead the real variants also pay."""

    def request_started(self, ctx: RequestContext) -> None:
        """Do nothing."""

    def upstream_started(self, ctx: RequestContext, headers: dict[str, str]) -> None:
        """Do nothing."""

    def settle(self, ctx: RequestContext) -> None:
        """Do nothing."""


def make_contexts(n: int, start_id: int) -> list[RequestContext]:
    """n settled-looking contexts over 10 tenants and 2 pools, half streaming."""
    out = []
    for i in range(n):
        pool = "fast" if i % 3 else "bulk"
        stream = bool(i % 2)
        out.append(
            RequestContext(
                request_id=f"r{start_id + i}", operation="chat", path="/v1/chat/completions",
                body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
                      "temperature": 0.7},
                model="m", stream=stream, client_wants_usage=True, headers={},
                timing=Timing(start=1.0, upstream_start=1.0003, first_byte=1.02, first_token=1.03, end=1.4,
                              upstream_busy=0.3995),
                tenant=Tenant(id=f"tenant-{i % 10}"),
                normalize_report=NormalizeReport(mode="on", moved={"iso_timestamp": 1}, applied=True),
                route_class=ClassDecision("interactive" if pool == "fast" else "bulk", "default"),
                route=RouteDecision(pool=pool, replica=POOLS[pool].replicas[0], policy="round_robin",
                                    reason="only"),
                usage=Usage(900 + i % 50, 40 + i % 7, 640, reported=True), status=200,
                response_id=f"chatcmpl-{i}", finish_reasons=["stop"],
            )
        )
    return out


class NullSpanExporter(SpanExporter):
    """Accepts spans and drops them: isolates the cost of building spans."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop the batch."""
        return SpanExportResult.SUCCESS


@contextmanager
def otlp_sink() -> Iterator[str]:
    """A loopback HTTP server that accepts and discards OTLP export requests."""

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_once(tel: Any, ctxs: list[RequestContext]) -> tuple[float, float, float]:
    """(thread CPU µs per request, process CPU µs per request, thread CPU µs per settle)."""
    p0, t0 = time.process_time(), time.thread_time()
    for ctx in ctxs:
        tel.request_started(ctx)
        tel.upstream_started(ctx, {})
    t1 = time.thread_time()
    for ctx in ctxs:
        assert ctx.route is not None
        prices = PRICES[ctx.route.pool]
        ctx.cost_usd = request_cost(ctx.usage, prices)
        ctx.savings_usd = request_savings(ctx.usage, prices, REFERENCE)
        tel.settle(ctx)
    t2 = time.thread_time()
    if isinstance(tel, Telemetry):
        # Spans only: the metric export runs on its own timer, once per interval, not per request.
        tel.force_flush(metrics=False)
    p2 = time.process_time()
    n = len(ctxs)
    return (t2 - t0) / n * 1e6, (p2 - p0) / n * 1e6, (t2 - t1) / n * 1e6


def measure(make: Callable[[], Any], requests: int, runs: int) -> tuple[float, float, float, float]:
    """Median CPU µs (thread, process, settle) per request over `runs`, plus ms per /metrics render."""
    tel = make()
    run_once(tel, make_contexts(500, 10**9))  # warm caches and series
    rows = [run_once(tel, make_contexts(requests, r * requests)) for r in range(runs)]
    render_ms = float("nan")
    if isinstance(tel, Telemetry):
        t0 = time.perf_counter()
        tel.render_prometheus()
        render_ms = (time.perf_counter() - t0) * 1e3
        asyncio.run(tel.shutdown())
    thread, process, settle = (statistics.median(col) for col in zip(*rows, strict=True))
    return thread, process, settle, render_ms


def main() -> None:
    """Run every variant and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Below the batch span processor's queue (2048 spans) so no span is dropped within a run.
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with otlp_sink() as endpoint:
        variants: dict[str, Callable[[], Any]] = {
            "no-op baseline": NoopTelemetry,
            "default (otlp off)": lambda: Telemetry(TelemetryConfig(), POOLS),
            "+ spans, null exporter": lambda: Telemetry(TelemetryConfig(), POOLS, span_exporter=NullSpanExporter()),
            "+ otlp/http export": lambda: Telemetry(
                TelemetryConfig(otlp_endpoint=endpoint), POOLS
            ),
        }
        rows = [(name, *measure(make, args.requests, args.runs)) for name, make in variants.items()]
    base = rows[0][1]
    print(f"{args.requests} requests x {args.runs} runs, median CPU µs; budget {BUDGET_US:.0f} µs "
          "for auth+limits+cost+telemetry")
    print(f"{'variant':<24} {'thread µs':>10} {'x base':>7} {'process µs':>11} {'settle µs':>10} "
          f"{'net % budget':>13} {'ms/scrape':>10}")
    for name, thread, process, settle, render_ms in rows:
        print(
            f"{name:<24} {thread:>10.1f} {thread / base:>7.1f} {process:>11.1f} {settle:>10.1f} "
            f"{(thread - base) / BUDGET_US * 100:>12.1f}% {render_ms:>10.2f}"
        )


if __name__ == "__main__":
    main()
