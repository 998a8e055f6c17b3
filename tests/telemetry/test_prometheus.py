"""/metrics text: every listed metric appears under its fixed Prometheus name, labels underscored."""

from __future__ import annotations

import re
import threading

from prometheus_client.parser import text_string_to_metric_families

from app.telemetry import instruments as ins
from tests.telemetry.helpers import Harness, make_ctx, run_request


def _settle_a_mix(h: Harness) -> None:
    migrated = make_ctx()
    migrated.migrations, migrated.migration_outcomes = 1, ["migrated"]
    for ctx in (make_ctx(), make_ctx(tenant="globex", pool="bulk", stream=False), make_ctx(status=502,
                error_type="upstream_error"), migrated):
        run_request(h.telemetry, ctx)
    rejected = make_ctx(tenant="spammer")
    h.telemetry.request_started(rejected)
    h.telemetry.record_rejected(rejected, 429, "rpm")


def _sample_names(body: bytes) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def test_every_listed_metric_renders_under_its_prometheus_name(harness: Harness) -> None:
    _settle_a_mix(harness)
    body, content_type = harness.telemetry.render_prometheus()
    assert content_type.startswith("text/plain")
    names = _sample_names(body)
    for spec in ins.ALL_METRICS:
        if spec in ins.QUEUE_METRICS:  # need an admission queue: tests/admission/test_gateway_integration.py
            continue
        prom = ins.PROMETHEUS_NAMES[spec.name]
        if spec.buckets is not None:
            assert {f"{prom}_bucket", f"{prom}_sum", f"{prom}_count"} <= names, prom
        else:
            assert prom in names, prom


def test_prometheus_names_follow_the_otel_translation_rules() -> None:
    # Dots to underscores, `s` to `_seconds`, other units appended, `{...}` dropped, `_total` on counters.
    for spec in ins.ALL_METRICS:
        base = spec.name.replace(".", "_")
        unit = {"s": "seconds", "usd": "usd"}.get(spec.unit, "")
        expected = f"{base}_{unit}" if unit else base
        if spec.buckets is None:
            expected += "_total"
        assert ins.PROMETHEUS_NAMES[spec.name] == expected


def test_attribute_dots_render_as_underscored_labels(harness: Harness) -> None:
    _settle_a_mix(harness)
    text = harness.telemetry.render_prometheus()[0].decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("gen_ai_client_token_usage_count{"))
    for label in ("gen_ai_token_type", "gen_ai_operation_name", "gen_ai_request_model", "kvgate_pool"):
        assert re.search(rf'\b{label}="', line), label


def test_rendering_twice_does_not_duplicate_samples(harness: Harness) -> None:
    _settle_a_mix(harness)
    harness.telemetry.render_prometheus()
    text = harness.telemetry.render_prometheus()[0].decode()
    series = [ln.rsplit(" ", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(series) == len(set(series))


def test_concurrent_scrapes_never_duplicate_samples(harness: Harness) -> None:
    _settle_a_mix(harness)
    bodies: list[bytes] = []

    def scrape() -> None:
        for _ in range(5):
            bodies.append(harness.telemetry.render_prometheus()[0])

    threads = [threading.Thread(target=scrape) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(bodies) == 20
    for body in bodies:
        series = [ln.rsplit(" ", 1)[0] for ln in body.decode().splitlines() if ln and not ln.startswith("#")]
        assert len(series) == len(set(series))
        assert ins.PROMETHEUS_NAMES[ins.REQUESTS.name].encode() in body


def test_sdk_instruments_from_the_meter_export_next_to_the_gateway_metrics(harness: Harness) -> None:
    _settle_a_mix(harness)
    harness.telemetry.meter.create_counter("gateway.scraper.polls", unit="{poll}").add(3, {"pool": "fast"})
    names = _sample_names(harness.telemetry.render_prometheus()[0])
    assert "gateway_scraper_polls_total" in names
    assert ins.PROMETHEUS_NAMES[ins.TENANT_COST.name] in names
