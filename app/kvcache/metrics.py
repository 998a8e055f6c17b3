"""The KV-event intake on /metrics: events, gaps, replays, lag and whether each replica's view is whole."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.kvcache.subscriber import KvEventsHub
from app.telemetry import instruments as ins


def register_kv_metrics(meter: Meter, hub: KvEventsHub) -> None:
    """Observable instruments read from the hub at each collection (off the request path)."""

    def per_replica(read: Callable[[str], float | None]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for url in hub.urls():
                value = read(url)
                if value is not None:
                    yield Observation(value, {"replica": url})

        return callback

    def stream_issues(options: CallbackOptions) -> Iterable[Observation]:
        for url in hub.urls():
            stats = hub.stats(url)
            for kind, value in (
                ("duplicate", stats.duplicates), ("decode_error", stats.decode_errors),
                ("skipped_event", stats.skipped_events), ("restart", stats.restarts),
                ("replay_failure", stats.replay_failures), ("unrecoverable", stats.unrecoverable),
            ):  # fmt: skip
                yield Observation(value, {"replica": url, "kind": kind})

    for spec, callback in (
        (ins.KV_EVENTS_RECEIVED, per_replica(lambda u: hub.stats(u).events)),
        (ins.KV_EVENTS_GAPS, per_replica(lambda u: hub.stats(u).gaps)),
        (ins.KV_EVENTS_REPLAYS, per_replica(lambda u: hub.stats(u).replays)),
        (ins.KV_EVENTS_LAG, per_replica(lambda u: hub.stats(u).lag_s)),
        (ins.KV_EVENTS_WHOLE, per_replica(lambda u: 1.0 if hub.is_whole(u) else 0.0)),
        (ins.KV_EVENTS_INDEX_BLOCKS, lambda o: [Observation(hub.index_size())]),
        (ins.KV_EVENTS_FALLBACKS, lambda o: [Observation(hub.fallbacks)]),
        (ins.KV_EVENTS_BATCHES, per_replica(lambda u: hub.stats(u).batches)),
        (ins.KV_EVENTS_MAX_LAG, per_replica(lambda u: hub.stats(u).max_lag_s)),
        (ins.KV_EVENTS_STREAM_ISSUES, stream_issues),
    ):
        ins.observe(meter, spec, callback)
