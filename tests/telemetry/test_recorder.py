"""Telemetry hooks, checked in-process: span names/kinds/attributes, trace propagation, recorded metrics."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, Metric, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app.config import TelemetryConfig
from app.context import RequestContext
from app.cost import gpu_cost_per_s
from app.telemetry import Telemetry
from app.telemetry import instruments as ins
from app.telemetry import spans as sp
from app.telemetry.headers import overhead_s
from tests.telemetry.helpers import POOLS, SECRET_PROMPT, Harness, make_ctx, run_request


def _metrics(h: Harness) -> dict[str, Metric]:
    data = h.metrics.get_metrics_data()
    assert data is not None
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def _points(metric: Metric) -> list[Any]:
    return list(metric.data.data_points)


def _point(metric: Metric, **attrs: str) -> Any:
    matches = [p for p in _points(metric) if all(p.attributes.get(k) == v for k, v in attrs.items())]
    assert len(matches) == 1, (metric.name, attrs, [dict(p.attributes) for p in _points(metric)])
    return matches[0]


def _spans(h: Harness) -> dict[SpanKind, ReadableSpan]:
    finished = h.spans.get_finished_spans()
    by_kind = {s.kind: s for s in finished}
    assert len(by_kind) == len(finished)
    return by_kind


def _all_attribute_text(spans: Any) -> str:
    return " ".join(f"{k}={v}" for s in spans for k, v in (s.attributes or {}).items())


def test_server_and_client_spans_are_named_by_convention_and_nested(harness: Harness) -> None:
    ctx = make_ctx()
    run_request(harness.telemetry, ctx)
    spans = _spans(harness)
    server, client = spans[SpanKind.SERVER], spans[SpanKind.CLIENT]
    assert server.name == f"POST {ctx.path}"
    assert client.name == f"chat {POOLS['fast'].served_model}"
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    assert client.context.trace_id == server.context.trace_id


def test_client_span_carries_genai_and_kvgate_attributes(harness: Harness) -> None:
    ctx = make_ctx()
    run_request(harness.telemetry, ctx)
    attrs = _spans(harness)[SpanKind.CLIENT].attributes or {}
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.request.model"] == POOLS["fast"].served_model
    assert attrs["gen_ai.response.model"] == POOLS["fast"].served_model
    assert attrs["gen_ai.request.max_tokens"] == ctx.body["max_tokens"]
    assert attrs["gen_ai.request.temperature"] == ctx.body["temperature"]
    assert attrs["gen_ai.request.top_p"] == ctx.body["top_p"]
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.response.id"] == ctx.response_id
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == tuple(ctx.finish_reasons)
    assert attrs["gen_ai.usage.input_tokens"] == ctx.usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == ctx.usage.completion_tokens
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == ctx.usage.cached_tokens
    assert attrs["server.address"] == "127.0.0.1"
    assert attrs["server.port"] == 8001
    assert attrs["kvgate.tenant"] == "acme"
    assert attrs["kvgate.pool"] == "fast"
    assert attrs["kvgate.replica"] == POOLS["fast"].replicas[0]
    assert attrs["kvgate.class"] == "interactive"
    assert attrs["kvgate.route.reason"] == "only"
    assert attrs["kvgate.cost_usd"] == pytest.approx(ctx.cost_usd)
    assert attrs["kvgate.savings_usd"] == pytest.approx(ctx.savings_usd)
    assert attrs["kvgate.normalize.mode"] == "on"
    assert attrs["kvgate.normalize.moved"] == 3
    assert "error.type" not in attrs


def test_server_span_reports_status_cost_and_overhead(harness: Harness) -> None:
    ctx = make_ctx()
    run_request(harness.telemetry, ctx)
    server = _spans(harness)[SpanKind.SERVER]
    attrs = server.attributes or {}
    assert attrs["http.response.status_code"] == 200
    assert attrs["http.request.method"] == "POST"
    assert attrs["kvgate.cost_usd"] == pytest.approx(ctx.cost_usd)
    assert attrs["kvgate.overhead_ms"] == pytest.approx(overhead_s(ctx.timing) * 1000)
    assert server.status.status_code == StatusCode.UNSET


def test_upstream_error_marks_client_and_server_spans(harness: Harness) -> None:
    ctx = make_ctx(status=502, error_type="upstream_error")
    run_request(harness.telemetry, ctx)
    spans = _spans(harness)
    assert (spans[SpanKind.CLIENT].attributes or {})["error.type"] == "upstream_error"
    assert spans[SpanKind.CLIENT].status.status_code == StatusCode.ERROR
    assert spans[SpanKind.SERVER].status.status_code == StatusCode.ERROR


def test_traceparent_is_injected_for_the_client_span(harness: Harness) -> None:
    ctx = make_ctx()
    outgoing = run_request(harness.telemetry, ctx)
    client = _spans(harness)[SpanKind.CLIENT]
    version, trace_id, span_id, _flags = outgoing["traceparent"].split("-")
    assert version == "00"
    assert int(trace_id, 16) == client.context.trace_id
    assert int(span_id, 16) == client.context.span_id


def test_inbound_traceparent_is_continued(harness: Harness) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent_id = "00f067aa0ba902b7"
    ctx = make_ctx(headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    run_request(harness.telemetry, ctx)
    server = _spans(harness)[SpanKind.SERVER]
    assert server.context.trace_id == int(trace_id, 16)
    assert server.parent is not None and server.parent.span_id == int(parent_id, 16)


def test_no_prompt_text_in_spans_unless_tenant_opts_in(harness: Harness) -> None:
    run_request(harness.telemetry, make_ctx(capture_content=False))
    private = harness.spans.get_finished_spans()
    assert SECRET_PROMPT not in _all_attribute_text(private)
    assert all("gen_ai.input.messages" not in (s.attributes or {}) for s in private)
    harness.spans.clear()

    run_request(harness.telemetry, make_ctx(capture_content=True))
    client = _spans(harness)[SpanKind.CLIENT]
    assert SECRET_PROMPT in (client.attributes or {})["gen_ai.input.messages"]


def test_no_prompt_text_in_prometheus_output(harness: Harness) -> None:
    run_request(harness.telemetry, make_ctx(capture_content=True))
    body, _ = harness.telemetry.render_prometheus()
    assert SECRET_PROMPT.encode() not in body


def test_retry_ends_the_failed_attempt_span_and_opens_another(harness: Harness) -> None:
    ctx = make_ctx()
    tel = harness.telemetry
    tel.request_started(ctx)
    first: dict[str, str] = {}
    tel.upstream_started(ctx, first)
    ctx.route.attempt = 2  # type: ignore[union-attr]
    second: dict[str, str] = {}
    tel.upstream_started(ctx, second)
    tel.settle(ctx)
    clients = [s for s in harness.spans.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert len(clients) == 2
    assert clients[0].status.status_code == StatusCode.ERROR
    assert first["traceparent"] != second["traceparent"]
    assert (clients[1].attributes or {})["kvgate.route.attempt"] == 2


def test_cost_savings_and_tokens_counters_per_tenant_and_pool(harness: Harness) -> None:
    a, b = make_ctx(tenant="acme"), make_ctx(tenant="acme")
    c = make_ctx(tenant="globex", pool="bulk", stream=False)
    for ctx in (a, b, c):
        run_request(harness.telemetry, ctx)
    m = _metrics(harness)
    assert m[ins.TENANT_COST.name].unit == "usd"
    assert _point(m[ins.TENANT_COST.name], tenant="acme", pool="fast").value == pytest.approx(
        a.cost_usd + b.cost_usd
    )
    assert _point(m[ins.TENANT_COST.name], tenant="globex", pool="bulk").value == pytest.approx(c.cost_usd)
    assert _point(m[ins.TENANT_SAVINGS.name], tenant="acme", pool="fast").value == pytest.approx(
        a.savings_usd + b.savings_usd
    )
    tokens = m[ins.TENANT_TOKENS.name]
    assert _point(tokens, tenant="acme", pool="fast", type="uncached").value == 2 * a.usage.uncached_tokens
    assert _point(tokens, tenant="acme", pool="fast", type="cached").value == 2 * a.usage.cached_tokens
    assert _point(tokens, tenant="globex", pool="bulk", type="output").value == c.usage.completion_tokens
    requests = m[ins.REQUESTS.name]
    assert _point(requests, tenant="acme", pool="fast", **{"class": "interactive", "status": "200"}).value == 2


def test_negative_savings_do_not_decrease_the_savings_counter(harness: Harness) -> None:
    gain, loss = make_ctx(), make_ctx()
    loss.savings_usd = -1.0
    for ctx in (gain, loss):
        run_request(harness.telemetry, ctx)
    point = _point(_metrics(harness)[ins.TENANT_SAVINGS.name], tenant="acme")
    assert point.value == pytest.approx(gain.savings_usd)
    loss_span = [s for s in harness.spans.get_finished_spans() if s.kind == SpanKind.CLIENT][1]
    assert (loss_span.attributes or {})["kvgate.savings_usd"] == -1.0


def test_genai_histograms_use_convention_buckets_and_attributes(harness: Harness) -> None:
    ctx = make_ctx()
    run_request(harness.telemetry, ctx)
    m = _metrics(harness)
    model = POOLS["fast"].served_model
    usage = m["gen_ai.client.token.usage"]
    assert usage.unit == "{token}"
    inp = _point(usage, **{"gen_ai.token.type": "input", "kvgate.tenant": "acme"})
    assert isinstance(inp, HistogramDataPoint)
    assert tuple(inp.explicit_bounds) == ins.TOKEN_BUCKETS
    assert inp.sum == ctx.usage.prompt_tokens
    assert dict(inp.attributes) == {
        "gen_ai.token.type": "input", "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
        "gen_ai.provider.name": "vllm", "kvgate.pool": "fast", "kvgate.tenant": "acme",
    }
    out = _point(usage, **{"gen_ai.token.type": "output"})
    assert out.sum == ctx.usage.completion_tokens

    duration = _point(m["gen_ai.client.operation.duration"])
    assert tuple(duration.explicit_bounds) == ins.DURATION_BUCKETS
    assert duration.sum == pytest.approx(ctx.timing.end - ctx.timing.upstream_start)
    assert duration.attributes["kvgate.class"] == "interactive"
    assert "error.type" not in duration.attributes

    ttft = _point(m["gen_ai.server.time_to_first_token"])
    assert tuple(ttft.explicit_bounds) == ins.TTFT_BUCKETS
    assert ttft.sum == pytest.approx(ctx.timing.first_token - ctx.timing.upstream_start)
    tpot = _point(m["gen_ai.server.time_per_output_token"])
    assert tuple(tpot.explicit_bounds) == ins.TPOT_BUCKETS
    assert tpot.sum == pytest.approx(
        (ctx.timing.end - ctx.timing.first_token) / (ctx.usage.completion_tokens - 1)
    )


def test_operation_duration_carries_error_type_on_errors(harness: Harness) -> None:
    run_request(harness.telemetry, make_ctx(status=502, error_type="upstream_error"))
    point = _point(_metrics(harness)["gen_ai.client.operation.duration"])
    assert point.attributes["error.type"] == "upstream_error"


def test_non_streaming_requests_record_no_token_timings(harness: Harness) -> None:
    run_request(harness.telemetry, make_ctx(stream=False))
    m = _metrics(harness)
    assert "gen_ai.server.time_to_first_token" not in m or not _points(m["gen_ai.server.time_to_first_token"])


def test_overhead_histogram_excludes_upstream_time(harness: Harness) -> None:
    ctx = make_ctx()
    run_request(harness.telemetry, ctx)
    point = _point(_metrics(harness)[ins.OVERHEAD.name], pool="fast", stream="true")
    assert tuple(point.explicit_bounds) == ins.OVERHEAD_BUCKETS
    expected = (ctx.timing.end - ctx.timing.start) - ctx.timing.upstream_busy
    assert point.sum == pytest.approx(expected)


def test_route_and_normalize_counters(harness: Harness) -> None:
    ctx = make_ctx()
    run_request(harness.telemetry, ctx)
    m = _metrics(harness)
    route = _point(m[ins.ROUTE_DECISIONS.name])
    assert dict(route.attributes) == {"pool": "fast", "class": "interactive", "policy": "round_robin", "reason": "only"}
    assert ctx.normalize_report is not None
    for rule, n in ctx.normalize_report.moved.items():
        assert _point(m[ins.NORMALIZE_MOVED.name], rule=rule, tenant="acme").value == n


def test_rejected_request_counts_status_and_limit_and_ends_server_span(harness: Harness) -> None:
    ctx = make_ctx(tenant="spammer")
    tel = harness.telemetry
    tel.request_started(ctx)
    tel.record_rejected(ctx, 429, "tpm")
    degraded = make_ctx(tenant="spammer")
    tel.record_limited(degraded, "budget", "degrade")
    m = _metrics(harness)
    assert _point(m[ins.REQUESTS.name], tenant="spammer", status="429").value == 1
    assert _point(m[ins.RATE_LIMITED.name], limit="tpm", action="reject").value == 1
    assert _point(m[ins.RATE_LIMITED.name], limit="budget", action="degrade").value == 1
    server = _spans(harness)[SpanKind.SERVER]
    assert (server.attributes or {})["http.response.status_code"] == 429
    assert (server.attributes or {})["kvgate.rejected_reason"] == "tpm"


def test_idle_and_gpu_cost_follow_the_clock_and_charges(harness: Harness) -> None:
    rate = gpu_cost_per_s(POOLS["fast"].price)
    assert rate is not None
    harness.clock.t += 3600
    ctx = make_ctx()
    run_request(harness.telemetry, ctx)
    m = _metrics(harness)
    idle = _point(m[ins.POOL_IDLE_COST.name], pool="fast")
    gpu = _point(m[ins.POOL_GPU_COST.name], pool="fast")
    assert isinstance(idle, NumberDataPoint)
    assert gpu.value == pytest.approx(3600 * rate)
    assert idle.value == pytest.approx(3600 * rate - ctx.cost_usd)
    # The bulk pool has explicit token prices and no GPU price: no idle series for it.
    assert all(p.attributes["pool"] != "bulk" for p in _points(m[ins.POOL_IDLE_COST.name]))


def test_settle_never_raises_into_the_request(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    ctx = make_ctx()
    harness.telemetry.request_started(ctx)
    broken: Any = ctx
    broken.usage = None  # a pipeline bug must not turn into a failed request
    with caplog.at_level(logging.WARNING, logger="app.telemetry.recorder"):
        harness.telemetry.settle(broken)
    assert any("settle" in r.getMessage() for r in caplog.records)


def test_settle_without_spans_still_records_metrics(harness: Harness) -> None:
    ctx: RequestContext = make_ctx()
    harness.telemetry.settle(ctx)
    assert harness.spans.get_finished_spans() == ()
    assert _point(_metrics(harness)[ins.REQUESTS.name], tenant="acme").value == 1


def test_span_attribute_keys_are_namespaced() -> None:
    keys = [v for k, v in vars(sp).items() if k.isupper() and isinstance(v, str) and "." in v]
    assert keys
    assert all(k.split(".")[0] in {"gen_ai", "kvgate", "server", "error", "http", "url"} for k in keys)


def test_without_a_span_consumer_no_spans_but_inbound_trace_is_passed_on() -> None:
    reader = InMemoryMetricReader()
    tel = Telemetry(TelemetryConfig(), POOLS, metric_readers=[reader])
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = run_request(tel, make_ctx(headers={"traceparent": parent, "tracestate": "k=v"}))
    assert traced == {"traceparent": parent, "tracestate": "k=v"}
    assert run_request(tel, make_ctx()) == {}
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert ins.REQUESTS.name in names


def test_sampled_out_requests_export_no_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(), POOLS, span_exporter=exporter)
    run_request(tel, make_ctx())
    assert exporter.get_finished_spans() == ()
