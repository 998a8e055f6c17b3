"""In-band load reports on /metrics: per replica, how many replies refreshed its load between scrapes."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.routing.state import ClusterState


def register_load_report_metrics(meter: Meter, cluster: Callable[[], ClusterState]) -> None:
    """An observable counter read from the replica states at each collection (off the request path);
    `cluster` is called each time, so replicas discovery adds or removes are followed."""

    def callback(options: CallbackOptions) -> Iterable[Observation]:
        for r in cluster().replicas():
            attrs = {"pool": r.pool, "replica": r.url}
            yield Observation(r.load_reports, {**attrs, "outcome": "applied"})
            yield Observation(r.load_reports_unparsable, {**attrs, "outcome": "unparsable"})

    meter.create_observable_counter(
        "gateway.replica.load_reports", [callback], "{report}",
        "vLLM endpoint-load-metrics reply headers, per replica: applied to its load, or unparsable",
    )  # fmt: skip
