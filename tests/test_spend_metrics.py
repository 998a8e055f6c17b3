"""The spend ledger on /metrics: dropped records (spend lost) and records buffered, read at collection time."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from app.spend import SpendLedger
from app.spend_metrics import register_spend_metrics
from app.store.base import SpendRecord
from app.store.memory import MemoryStore


def values(ledger: SpendLedger) -> dict[str, float]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    register_spend_metrics(provider.get_meter("test"), ledger)
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = m.data.data_points[0].value  # type: ignore[union-attr]
    return out


def record(i: int) -> SpendRecord:
    return SpendRecord(f"r{i}", "acme", "2026-12-02", "main", 1)


def test_records_dropped_by_a_full_buffer_and_those_waiting_are_exported() -> None:
    ledger = SpendLedger(MemoryStore(), max_pending=2)
    assert values(ledger) == {"gateway.spend.dropped": 0, "gateway.spend.pending": 0}
    for i in range(5):
        ledger.buffer(record(i))
    assert values(ledger) == {"gateway.spend.dropped": 3, "gateway.spend.pending": 2}
