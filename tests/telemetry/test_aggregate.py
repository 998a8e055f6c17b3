"""The request-path aggregators agree with the OTel SDK's own instruments and stay bounded."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader, Sum

from app.telemetry.aggregate import CARDINALITY_LIMIT, MetricSpec, MetricStore
from app.telemetry.instruments import TTFT_BUCKETS

SPEC_H = MetricSpec("h", "s", "test histogram", ("pool", "class"), TTFT_BUCKETS)
SPEC_C = MetricSpec("c", "{request}", "test counter", ("tenant", "pool"))


def _sdk_histogram_point(values: list[float]) -> object:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    hist = meter.create_histogram("h", unit="s", explicit_bucket_boundaries_advisory=list(TTFT_BUCKETS))
    for v in values:
        hist.record(v, {"pool": "p"})
    data = reader.get_metrics_data()
    assert data is not None
    return data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]


def test_histogram_matches_the_sdk_bucket_for_bucket() -> None:
    rng = random.Random(7)
    # Values on the boundaries too: bucket i holds (bounds[i-1], bounds[i]].
    values = [rng.uniform(0, 12) for _ in range(300)] + list(TTFT_BUCKETS) + [0.0]
    store = MetricStore()
    hist = store.histogram(SPEC_H)
    with store.lock:
        for v in values:
            hist.record(("p", None), v)
    (metric,) = store.collect(1, 2)
    assert isinstance(metric.data, Histogram)
    ours = metric.data.data_points[0]
    sdk = _sdk_histogram_point(values)
    assert list(ours.bucket_counts) == list(sdk.bucket_counts)  # type: ignore[attr-defined]
    assert ours.count == sdk.count  # type: ignore[attr-defined]
    assert ours.sum == pytest.approx(sdk.sum)  # type: ignore[attr-defined]
    assert (ours.min, ours.max) == (sdk.min, sdk.max)  # type: ignore[attr-defined]
    assert dict(ours.attributes) == {"pool": "p"}


def test_counter_sums_per_label_set_and_omits_none_labels() -> None:
    store = MetricStore()
    counter = store.counter(SPEC_C)
    with store.lock:
        counter.add(("a", "fast"), 2)
        counter.add(("a", "fast"), 3.5)
        counter.add(("b", None), 1)
    (metric,) = store.collect(1, 2)
    assert isinstance(metric.data, Sum)
    assert metric.data.is_monotonic
    values = {tuple(sorted(p.attributes.items())): p.value for p in metric.data.data_points}
    assert values == {(("pool", "fast"), ("tenant", "a")): 5.5, (("tenant", "b"),): 1}


def test_series_past_the_cardinality_limit_fold_into_one_overflow_series() -> None:
    store = MetricStore()
    counter = store.counter(SPEC_C)
    with store.lock:
        for i in range(CARDINALITY_LIMIT + 50):
            counter.add((f"t{i}", "p"), 1)
    (metric,) = store.collect(1, 2)
    points = list(metric.data.data_points)
    assert len(points) == CARDINALITY_LIMIT + 1
    overflow = [p for p in points if p.attributes.get("otel.metric.overflow")]
    assert len(overflow) == 1 and overflow[0].value == 50


def test_metrics_without_data_are_left_out_and_observed_values_reported() -> None:
    store = MetricStore()
    store.counter(SPEC_C)
    store.histogram(SPEC_H)
    store.observed_counter(MetricSpec("o", "usd", "observed", ("pool",)), lambda: [({"pool": "p"}, 1.25)])
    metrics = store.collect(1, 2)
    assert [m.name for m in metrics] == ["o"]
    assert metrics[0].data.data_points[0].value == 1.25


def test_zeros_counted_without_the_lock_collect_exactly_as_recorded_zeros() -> None:
    values = [0.0, 0.3, 0.0, 2.5, 0.0, 0.0, 0.01]
    recorded, counted = MetricStore(), MetricStore()
    hist_r, hist_c = recorded.histogram(SPEC_H), counted.histogram(SPEC_H)
    with recorded.lock:
        for v in values:
            hist_r.record(("p", "interactive"), v)
    for i, v in enumerate(values):
        if v == 0.0:
            hist_c.record_zero(("p", "interactive"))
        else:
            with counted.lock:
                hist_c.record(("p", "interactive"), v)
        if i == 3:  # a collection in between: what it folded is not folded again
            counted.collect(1, 2)
    (want,), (got,) = recorded.collect(1, 2), counted.collect(1, 2)
    assert isinstance(want.data, Histogram) and isinstance(got.data, Histogram)
    a, b = want.data.data_points[0], got.data.data_points[0]
    assert (b.count, b.sum, list(b.bucket_counts), b.min, b.max) == (a.count, a.sum, list(a.bucket_counts), a.min,
                                                                      a.max)
    (again,) = counted.collect(1, 2)
    assert isinstance(again.data, Histogram) and again.data.data_points[0].count == len(values)


def test_a_series_of_zeros_alone_is_collected() -> None:
    store = MetricStore()
    hist = store.histogram(SPEC_H)
    for _ in range(5):
        hist.record_zero(("p", None))
    (metric,) = store.collect(1, 2)
    assert isinstance(metric.data, Histogram)
    point = metric.data.data_points[0]
    assert (point.count, point.sum, point.min, point.max, point.bucket_counts[0]) == (5, 0.0, 0.0, 0.0, 5)
