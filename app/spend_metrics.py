"""The spend ledger on /metrics: records buffered while the store is unreachable, and records dropped.

A dropped record is spend lost for good (the buffer was full during a long store outage): it must be visible
where an operator looks, not only in the log. Read from the ledger at each collection (off the request path).
"""

from __future__ import annotations

from opentelemetry.metrics import Meter, Observation

from app.spend import SpendLedger


def register_spend_metrics(meter: Meter, ledger: SpendLedger) -> None:
    """Observable instruments over the ledger's counters."""
    meter.create_observable_counter(
        "gateway.spend.dropped", [lambda o: [Observation(ledger.dropped)]], "{record}",
        "Spend records dropped because the ledger's buffer was full while the store was unreachable (spend lost)",
    )
    meter.create_observable_gauge(
        "gateway.spend.pending", [lambda o: [Observation(ledger.pending)]], "{record}",
        "Spend records buffered in this process, waiting for the store",
    )
