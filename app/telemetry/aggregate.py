"""Cumulative counters and explicit-bucket histograms for the request path, snapshotted as OTel metric data.

Why not the SDK's synchronous instruments: each `Counter.add`/`Histogram.record` of opentelemetry-sdk 1.45
builds a Measurement, re-validates and re-hashes its attribute dict and consults the exemplar filter — about
20 µs per call here, and settle makes ~14 of them. These aggregators update a dict entry keyed by a tuple of
label values (well under 1 µs) and turn their state into the SDK's own data model (`Metric` with `Sum` /
`Histogram` points, cumulative temporality) when a reader collects, so every OTel reader — Prometheus, OTLP,
in-memory — exports exactly what the SDK instruments would have.

Writers hold `MetricStore.lock` around a batch of updates; collection takes the same lock, so a reader
thread never sees a half-recorded request.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)

# Like the SDK: past this many series per metric, new label sets fold into one overflow series.
CARDINALITY_LIMIT = 2000
_OVERFLOW_ATTRS: dict[str, Any] = {"otel.metric.overflow": True}
_OVERFLOW_KEY = ("\0overflow",)
_CUMULATIVE = AggregationTemporality.CUMULATIVE

Observe = Callable[[], Iterable[tuple[dict[str, Any], float]]]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """Name, unit, description, label names and (for histograms) bucket boundaries of one metric."""

    name: str
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


def _attributes(names: Sequence[str], key: tuple[Any, ...]) -> dict[str, Any]:
    if key == _OVERFLOW_KEY:
        return _OVERFLOW_ATTRS
    return {n: v for n, v in zip(names, key, strict=True) if v is not None}


class CounterAgg:
    """A monotone counter: one running float per label-value tuple (None values are left out of labels)."""

    __slots__ = ("_attrs", "_values", "names", "spec")

    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec
        self.names = spec.labels
        self._values: dict[tuple[Any, ...], float] = {}
        self._attrs: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add(self, key: tuple[Any, ...], amount: float) -> None:
        """Add `amount` (≥ 0) to the series `key`; the caller holds the store lock."""
        values = self._values
        current = values.get(key)
        if current is None:
            if len(values) >= CARDINALITY_LIMIT:
                key = _OVERFLOW_KEY
                current = values.get(key, 0.0)
            else:
                current = 0.0
            if key not in self._attrs:
                self._attrs[key] = _attributes(self.names, key)
        values[key] = current + amount

    def collect(self, start_ns: int, now_ns: int) -> Metric | None:
        """The cumulative Sum, or None before the first add."""
        if not self._values:
            return None
        points = [
            NumberDataPoint(self._attrs[k], start_ns, now_ns, v) for k, v in self._values.items()
        ]
        return Metric(self.spec.name, self.spec.description, self.spec.unit, Sum(points, _CUMULATIVE, True))


class _HistSeries:
    __slots__ = ("count", "counts", "max", "min", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.count = 0
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")


class HistogramAgg:
    """An explicit-bucket histogram per label-value tuple (bucket i holds bounds[i-1] < v ≤ bounds[i])."""

    __slots__ = ("_attrs", "_folded", "_series", "_zeros", "bounds", "names", "spec")

    def __init__(self, spec: MetricSpec) -> None:
        if spec.buckets is None:
            raise ValueError(f"{spec.name}: a histogram needs buckets")
        self.spec = spec
        self.names = spec.labels
        self.bounds = spec.buckets
        self._series: dict[tuple[Any, ...], _HistSeries] = {}
        self._attrs: dict[tuple[Any, ...], dict[str, Any]] = {}
        # Zeros counted without the lock (record_zero), folded into the series when a reader collects.
        self._zeros: dict[tuple[Any, ...], int] = {}
        self._folded: dict[tuple[Any, ...], int] = {}

    def _series_for(self, key: tuple[Any, ...]) -> _HistSeries:
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= CARDINALITY_LIMIT:
                key = _OVERFLOW_KEY
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _HistSeries(len(self.bounds) + 1)
                self._attrs[key] = _attributes(self.names, key)
        return series

    def record(self, key: tuple[Any, ...], value: float) -> None:
        """Count `value` in the series `key`; the caller holds the store lock."""
        series = self._series_for(key)
        series.counts[bisect_left(self.bounds, value)] += 1
        series.count += 1
        series.sum += value
        if value < series.min:
            series.min = value
        if value > series.max:
            series.max = value

    def record_zero(self, key: tuple[Any, ...]) -> None:
        """Count a 0 in the series `key`, without the store lock; call it from one thread only (the event loop).

        For what nearly every request records as 0 (its wait in an admission queue below saturation): the lock,
        the series lookup and the bisect per request were ~1 % of the request path's CPU
        (experiments/admission_micro.py). The collector folds the count in under the lock; the writer only ever
        increments, so a count read while it writes is folded at the next collection, never lost."""
        zeros = self._zeros
        zeros[key] = zeros.get(key, 0) + 1

    def _fold_zeros(self) -> None:
        if not self._zeros:
            return
        folded, zero_bucket = self._folded, bisect_left(self.bounds, 0.0)
        for key, n in list(self._zeros.items()):  # a C-level copy: a writer adding a key cannot break it
            delta = n - folded.get(key, 0)
            if delta <= 0:
                continue
            folded[key] = n
            series = self._series_for(key)
            series.counts[zero_bucket] += delta
            series.count += delta
            if series.min > 0.0:
                series.min = 0.0
            if series.max < 0.0:
                series.max = 0.0

    def collect(self, start_ns: int, now_ns: int) -> Metric | None:
        """The cumulative Histogram, or None before the first record; the caller holds the store lock."""
        self._fold_zeros()
        if not self._series:
            return None
        points = [
            HistogramDataPoint(
                self._attrs[k], start_ns, now_ns, s.count, s.sum, list(s.counts), self.bounds, s.min, s.max
            )
            for k, s in self._series.items()
        ]
        return Metric(self.spec.name, self.spec.description, self.spec.unit, Histogram(points, _CUMULATIVE))


class ObservedCounter:
    """A monotone counter whose values a callback reports at collection (like an OTel ObservableCounter)."""

    __slots__ = ("observe", "spec")

    def __init__(self, spec: MetricSpec, observe: Observe) -> None:
        self.spec = spec
        self.observe = observe

    def collect(self, start_ns: int, now_ns: int) -> Metric | None:
        """The reported values as a cumulative Sum, or None when there are none."""
        points = [NumberDataPoint(attrs, start_ns, now_ns, value) for attrs, value in self.observe()]
        if not points:
            return None
        return Metric(self.spec.name, self.spec.description, self.spec.unit, Sum(points, _CUMULATIVE, True))


class MetricStore:
    """Holds the aggregators and the lock writers and collectors share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._aggs: list[CounterAgg | HistogramAgg] = []
        self._observed: list[ObservedCounter] = []

    def counter(self, spec: MetricSpec) -> CounterAgg:
        """Register a counter."""
        agg = CounterAgg(spec)
        self._aggs.append(agg)
        return agg

    def histogram(self, spec: MetricSpec) -> HistogramAgg:
        """Register a histogram."""
        agg = HistogramAgg(spec)
        self._aggs.append(agg)
        return agg

    def observed_counter(self, spec: MetricSpec, observe: Observe) -> ObservedCounter:
        """Register a counter reported by a callback at collection time."""
        obs = ObservedCounter(spec, observe)
        self._observed.append(obs)
        return obs

    def collect(self, start_ns: int, now_ns: int) -> list[Metric]:
        """A consistent snapshot of every metric that has data."""
        with self.lock:
            metrics = [m for agg in self._aggs if (m := agg.collect(start_ns, now_ns)) is not None]
        # Callbacks take their own locks (the idle meters): run them outside the store lock.
        metrics.extend(m for obs in self._observed if (m := obs.collect(start_ns, now_ns)) is not None)
        return metrics
