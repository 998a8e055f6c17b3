"""Build the gateway's own Tracer/Meter providers, readers and exporters (never the process-global ones).

Owning the providers lets tests pass in-memory exporters and lets two apps live in one process. One
MeterProvider holds every reader — Prometheus text on /metrics and, when configured, OTLP/HTTP — and each
reader's collection also carries the request-path metrics of the MetricStore (see `merge_store`), so all
readers show the same metrics from one source of truth.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Metric,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry

from app.config import TelemetryConfig

_EXPORT_TIMEOUT_S = 5.0
# The store aggregates cumulatively; pin the OTLP exporter to that whatever the environment prefers.
_CUMULATIVE: dict[type, AggregationTemporality] = {
    Counter: AggregationTemporality.CUMULATIVE,
    Histogram: AggregationTemporality.CUMULATIVE,
    ObservableCounter: AggregationTemporality.CUMULATIVE,
}
SCOPE = InstrumentationScope("kvgate")


@dataclass(slots=True)
class Providers:
    """The providers plus the Prometheus registry that /metrics renders."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    prometheus_registry: CollectorRegistry
    resource: Resource
    # False when no span processor is attached: nobody would see a span, so none are built.
    tracing: bool
    readers: list[MetricReader] = field(default_factory=list)
    # Kept apart so a flush exports OTLP without queueing an extra snapshot in the Prometheus reader
    # (it renders every queued snapshot on the next scrape, which would duplicate samples).
    otlp_metric_reader: PeriodicExportingMetricReader | None = None


def otlp_url(endpoint: str, signal: str) -> str:
    """`{endpoint}/v1/{signal}`: the HTTP exporter uses an explicit endpoint verbatim."""
    return f"{endpoint.rstrip('/')}/v1/{signal}"


def build_providers(
    cfg: TelemetryConfig,
    *,
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] = (),
) -> Providers:
    """Providers with a Prometheus reader always, OTLP/HTTP exporters when `cfg.otlp_endpoint` is set.

    An injected span exporter gets a SimpleSpanProcessor (tests read spans synchronously); OTLP spans go
    through a BatchSpanProcessor so the request path never waits on the network.
    """
    # Each gateway replica is its own instance: without it a collector merges replicas' cumulative series.
    resource = Resource.create(
        {SERVICE_NAME: cfg.service_name, "service.instance.id": f"{socket.gethostname()}-{os.getpid()}"}
    )
    tracer_provider = TracerProvider(resource=resource)
    tracing = span_exporter is not None or bool(cfg.otlp_endpoint)
    if span_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    readers: list[MetricReader] = list(metric_readers)
    registry = CollectorRegistry(auto_describe=False)
    # No otel_scope_* labels: three more labels on every line would make a scrape ~30% larger and slower.
    readers.append(PrometheusMetricReader(registry=registry, scope_info_enabled=False))
    otlp_reader: PeriodicExportingMetricReader | None = None
    if cfg.otlp_endpoint:
        tracer_provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=otlp_url(cfg.otlp_endpoint, "traces"), timeout=_EXPORT_TIMEOUT_S)
            )
        )
        otlp_reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(
                endpoint=otlp_url(cfg.otlp_endpoint, "metrics"),
                timeout=_EXPORT_TIMEOUT_S,
                preferred_temporality=_CUMULATIVE,
            ),
            export_interval_millis=cfg.metric_export_interval_s * 1000.0,
        )
        readers.append(otlp_reader)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return Providers(
        tracer_provider=tracer_provider, meter_provider=meter_provider, prometheus_registry=registry,
        resource=resource, tracing=tracing, readers=readers, otlp_metric_reader=otlp_reader,
    )


def merge_store(providers: Providers, produce: Callable[[], list[Metric]]) -> None:
    """Make every reader's collection carry `produce()`'s metrics next to the MeterProvider's own.

    A reader collects through the callback its MeterProvider set at registration; wrapping it is the one
    place this module relies on SDK internals (`MetricReader._collect`/`_set_collect_callback`, stable
    through the 1.x line). The wrapped callback runs in whichever thread collects (scrape, export timer).
    """
    for reader in providers.readers:
        # The SDK annotates these callbacks narrower than it calls them (reader, timeout_millis=...).
        sdk_collect: Any = reader._collect
        merged: Any = _merged_collect(sdk_collect, produce, providers.resource)
        reader._set_collect_callback(merged)


def _merged_collect(
    sdk_collect: Callable[..., MetricsData | None] | None, produce: Callable[[], list[Metric]], resource: Resource
) -> Callable[..., MetricsData | None]:
    def collect(reader: MetricReader, timeout_millis: float = 10_000, **kwargs: Any) -> MetricsData | None:
        data = sdk_collect(reader, timeout_millis=timeout_millis) if sdk_collect is not None else None
        own = produce()
        if not own:
            return data
        scope_metrics = ScopeMetrics(SCOPE, own, "")
        if data is None or not data.resource_metrics:
            return MetricsData([ResourceMetrics(resource, [scope_metrics], "")])
        first, *rest = data.resource_metrics
        merged = ResourceMetrics(first.resource, [*first.scope_metrics, scope_metrics], first.schema_url)
        return MetricsData([merged, *rest])

    return collect
