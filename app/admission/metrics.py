"""The admission queues on /metrics: requests waiting per tenant, slots in flight, the cap, saturation, refusals.

Read from the queues at each collection (off the request path). The wait histogram and the admitted tokens
per tenant (its fair share) are in the instruments table, recorded per request. A tenant the queue has
served shows 0 waiting rather than disappearing, so a series of queue lengths drops to zero instead of ending.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.admission.queue import AdmissionQueue

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def register_queue_metrics(meter: Meter, queues: Mapping[str, AdmissionQueue]) -> None:
    """Observable instruments over every pool's admission queue."""

    def length(options: CallbackOptions) -> Iterable[Observation]:
        for pool, q in queues.items():
            waiting = q.queue_lengths()
            for tenant in set(waiting) | set(q.served_tokens):
                yield Observation(waiting.get(tenant, 0), {"pool": pool, "tenant": tenant})

    def rejected(options: CallbackOptions) -> Iterable[Observation]:
        for pool, q in queues.items():
            for (tenant, reason), n in q.rejected.items():
                yield Observation(n, {"pool": pool, "tenant": tenant, "reason": reason})

    def per_pool(read: Callable[[AdmissionQueue], float | None]) -> Callback:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for pool, q in queues.items():
                value = read(q)
                if value is not None:
                    yield Observation(value, {"pool": pool})

        return callback

    meter.create_observable_gauge(
        "gateway.queue.length", [length], "{request}", "Requests waiting in the pool's admission queue, per tenant"
    )
    meter.create_observable_counter(
        "gateway.queue.rejected", [rejected], "{request}",
        "Requests the admission queue refused (queue_full, deadline), per tenant",
    )  # fmt: skip
    meter.create_observable_gauge(
        "gateway.queue.in_flight", [per_pool(lambda q: q.in_flight)], "{request}",
        "Requests holding an admission slot of the pool",
    )  # fmt: skip
    meter.create_observable_gauge(
        "gateway.queue.limit", [per_pool(lambda q: q.limit)], "{request}",
        "The pool's in-flight cap while saturated (absent: no cap, the fast path)",
    )  # fmt: skip
    meter.create_observable_gauge(
        "gateway.queue.reserve", [per_pool(lambda q: q.reserve if q.limit is not None else None)], "{request}",
        "Slots of the cap kept for tenants under their fair share (sized from their arrivals; absent: no cap)",
    )  # fmt: skip
    meter.create_observable_gauge(
        # No unit "1": the collector would name it gateway_queue_saturated_ratio, the SDK's exporter not.
        "gateway.queue.saturated", [per_pool(lambda q: 1.0 if q.saturation.saturated else 0.0)], "",
        "1 while the pool counts as saturated (the queue engages)",
    )  # fmt: skip
