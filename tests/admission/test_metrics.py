"""The admission queues' gauges, read from the queues at collection time."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from app.admission.metrics import register_queue_metrics
from app.admission.queue import AdmissionQueue
from app.config.admission import AdmissionConfig


def gauges(queue: AdmissionQueue) -> dict[str, list[float]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_queue_metrics(provider.get_meter("test"), {"bulk": queue})
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, list[float]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = [p.value for p in m.data.data_points]  # type: ignore[union-attr]
    return out


def test_the_reserve_is_shown_while_the_pool_is_capped_and_absent_otherwise() -> None:
    q = AdmissionQueue(AdmissionConfig(enabled=True))
    assert gauges(q).get("gateway.queue.reserve", []) == []
    q.limit, q.reserve = 60, 3
    assert gauges(q)["gateway.queue.reserve"] == [3]
