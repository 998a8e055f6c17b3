"""Per-replica observations on /metrics, read from the replica states at each collection (off the request path):
in-band load reports, how many replicas of each pool are in each routing state, whether each speculates (as it
publishes) and where the config contradicts what replicas publish."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.routing.engine_read import Disagreements
from app.routing.state import REPLICA_STATUSES, ClusterState
from app.telemetry import instruments as ins


def register_replica_metrics(
    meter: Meter, cluster: Callable[[], ClusterState], disagreements: Disagreements | None = None
) -> None:
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

    def speculative(options: CallbackOptions) -> Iterable[Observation]:
        for r in cluster().replicas():
            if r.engine.speculative is not None:
                yield Observation(int(r.engine.speculative), {"pool": r.pool, "replica": r.url})

    ins.observe(meter, ins.ENGINE_SPECULATIVE, speculative)
    if disagreements is not None:
        ins.observe(meter, ins.ENGINE_CONFIG_MISMATCHES, lambda o: [
            Observation(n, {"pool": pool, "key": key}) for (pool, key), n in disagreements.counts().items()
        ])  # fmt: skip
