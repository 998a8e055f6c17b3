"""Fixture: a Telemetry with in-memory span and metric sinks and a fake clock for the idle meters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.config import TelemetryConfig
from app.telemetry import Telemetry
from tests.telemetry.helpers import POOLS, FakeClock, Harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    spans = InMemorySpanExporter()
    metrics = InMemoryMetricReader()
    clock = FakeClock()
    telemetry = Telemetry(TelemetryConfig(), POOLS, span_exporter=spans, metric_readers=[metrics], clock=clock)
    yield Harness(telemetry, spans, metrics, clock)
    asyncio.run(telemetry.shutdown())
