"""Build the gateway's own Tracer/Meter providers, readers and exporters (never the process-global ones).

Owning the providers lets tests pass in-memory exporters and lets two apps live in one process. One
MeterProvider feeds every reader — Prometheus text on /metrics and, when configured, OTLP/HTTP — so both
show the same instruments from one source of truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from prometheus_client import CollectorRegistry

from app.config import TelemetryConfig

_EXPORT_TIMEOUT_S = 5.0


@dataclass(slots=True)
class Providers:
    """The providers plus the Prometheus registry that /metrics renders."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    prometheus_registry: CollectorRegistry
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
    resource = Resource.create({SERVICE_NAME: cfg.service_name})
    tracer_provider = TracerProvider(resource=resource)
    if span_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    readers: list[MetricReader] = list(metric_readers)
    registry = CollectorRegistry(auto_describe=False)
    readers.append(PrometheusMetricReader(registry=registry))
    otlp_reader: PeriodicExportingMetricReader | None = None
    if cfg.otlp_endpoint:
        tracer_provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=otlp_url(cfg.otlp_endpoint, "traces"), timeout=_EXPORT_TIMEOUT_S)
            )
        )
        otlp_reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=otlp_url(cfg.otlp_endpoint, "metrics"), timeout=_EXPORT_TIMEOUT_S),
            export_interval_millis=cfg.metric_export_interval_s * 1000.0,
        )
        readers.append(otlp_reader)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return Providers(tracer_provider, meter_provider, registry, otlp_reader)
