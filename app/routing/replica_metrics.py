"""Per-replica observations on /metrics, read from the replica states at each collection (off the request path):
in-band load reports, and how many replicas of each pool are in each routing state."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.routing.state import REPLICA_STATUSES, ClusterState
from app.telemetry import instruments as ins


def register_replica_metrics(meter: Meter, cluster: Callable[[], ClusterState]) -> None:
    """Load reports per replica and replicas per (pool, state); `cluster` is called each time, so replicas
    discovery adds or removes are followed."""

    def load_reports(options: CallbackOptions) -> Iterable[Observation]:
        for r in cluster().replicas():
            attrs = {"pool": r.pool, "replica": r.url}
            yield Observation(r.load_reports, {**attrs, "outcome": "applied"})
            yield Observation(r.load_reports_unparsable, {**attrs, "outcome": "unparsable"})

    def states(options: CallbackOptions) -> Iterable[Observation]:
        for name, pool in cluster().pools.items():
            counts = dict.fromkeys(REPLICA_STATUSES, 0)  # every state, zeros too: a panel shows what went to 0
            for r in pool.replicas:
                counts[r.status()] += 1
            for state, n in counts.items():
                yield Observation(n, {"pool": name, "state": state})

    meter.create_observable_counter(
        "gateway.replica.load_reports", [load_reports], "{report}",
        "vLLM endpoint-load-metrics reply headers, per replica: applied to its load, or unparsable",
    )  # fmt: skip
    ins.observe(meter, ins.REPLICAS, states)
