"""OTLP/HTTP export through a real receive path: protobuf requests decoded by a loopback server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import TelemetryConfig
from app.telemetry import Telemetry
from app.telemetry import instruments as ins
from tests.telemetry.helpers import POOLS, SECRET_PROMPT, FakeClock, make_ctx, run_request
from tests.telemetry.otlp_receiver import Received, otlp_receiver


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = (
            [v.string_value for v in value.array_value.values] if kind == "array_value" else getattr(value, kind)
        )
    return out


@pytest.fixture(scope="module")
def exported() -> Iterator[tuple[Received, list[Any]]]:
    """Settle a few requests with OTLP on, flush, shut down; yields what the receiver decoded."""
    with otlp_receiver() as (endpoint, received):
        # A long interval: the export under test is the explicit flush, not a timer firing.
        cfg = TelemetryConfig(otlp_endpoint=endpoint, service_name="kvgate-test", metric_export_interval_s=600)
        telemetry = Telemetry(cfg, POOLS, clock=FakeClock())
        migrated = make_ctx()
        migrated.migrations, migrated.migration_outcomes = 1, ["migrated"]
        ctxs = [make_ctx(), make_ctx(tenant="globex", pool="bulk", stream=False), migrated]
        for ctx in ctxs:
            run_request(telemetry, ctx)
        assert telemetry.force_flush(timeout_s=10)
        # Prometheus and OTLP read one MeterProvider: a flush must not double what /metrics shows.
        text = telemetry.render_prometheus()[0].decode()
        series = [ln.rsplit(" ", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert len(series) == len(set(series))
        asyncio.run(telemetry.shutdown())
        yield received, ctxs


def test_spans_arrive_over_otlp_http_with_convention_names(exported: tuple[Received, list[Any]]) -> None:
    received, ctxs = exported
    assert "application/x-protobuf" in received.content_types
    spans = received.spans()
    names = sorted(s.name for s in spans)
    assert names == sorted(
        [f"chat {POOLS['fast'].served_model}"] * 2 + [f"chat {POOLS['bulk'].served_model}"]
        + [f"POST {ctxs[0].path}"] * 3
    )
    client = next(s for s in spans if s.name == f"chat {POOLS['bulk'].served_model}")
    attrs = _attrs(client)
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.usage.input_tokens"] == ctxs[1].usage.prompt_tokens
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == ctxs[1].usage.cached_tokens
    assert attrs["gen_ai.response.finish_reasons"] == ctxs[1].finish_reasons
    assert attrs["kvgate.tenant"] == "globex"
    assert attrs["kvgate.pool"] == "bulk"
    assert attrs["kvgate.cost_usd"] == pytest.approx(ctxs[1].cost_usd)
    assert all(SECRET_PROMPT not in str(_attrs(s)) for s in spans)
    resource = received.traces[0].resource_spans[0].resource
    assert any(kv.key == "service.name" and kv.value.string_value == "kvgate-test" for kv in resource.attributes)


def test_metrics_arrive_over_otlp_http_with_listed_names_and_units(exported: tuple[Received, list[Any]]) -> None:
    received, ctxs = exported
    names = received.metric_names()
    # Every instrument that saw data (no rate limiting happened here).
    for spec in ins.ALL_METRICS:
        if spec is not ins.RATE_LIMITED and spec not in ins.QUEUE_METRICS:  # no admission queue here
            assert spec.name in names, spec.name
    cost = received.metrics_named(ins.TENANT_COST.name)[-1]
    assert cost.unit == "usd"
    assert cost.sum.is_monotonic
    by_tenant = {
        next(kv.value.string_value for kv in p.attributes if kv.key == "tenant"): p.as_double
        for p in cost.sum.data_points
    }
    assert by_tenant["globex"] == pytest.approx(ctxs[1].cost_usd)
    usage = received.metrics_named("gen_ai.client.token.usage")[-1]
    assert tuple(usage.histogram.data_points[0].explicit_bounds) == ins.TOKEN_BUCKETS
