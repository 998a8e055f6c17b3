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

    meter.create_observable_counter(
        ins.KV_EVENTS_RECEIVED.name, [per_replica(lambda u: hub.stats(u).events)], ins.KV_EVENTS_RECEIVED.unit,
        ins.KV_EVENTS_RECEIVED.description,
    )  # fmt: skip
    meter.create_observable_counter(
        ins.KV_EVENTS_GAPS.name, [per_replica(lambda u: hub.stats(u).gaps)], ins.KV_EVENTS_GAPS.unit,
        ins.KV_EVENTS_GAPS.description,
    )  # fmt: skip
    meter.create_observable_counter(
        ins.KV_EVENTS_REPLAYS.name, [per_replica(lambda u: hub.stats(u).replays)], ins.KV_EVENTS_REPLAYS.unit,
        ins.KV_EVENTS_REPLAYS.description,
    )  # fmt: skip
    meter.create_observable_gauge(
        ins.KV_EVENTS_LAG.name, [per_replica(lambda u: hub.stats(u).lag_s)], ins.KV_EVENTS_LAG.unit,
        ins.KV_EVENTS_LAG.description,
    )  # fmt: skip
    meter.create_observable_gauge(
        ins.KV_EVENTS_WHOLE.name, [per_replica(lambda u: 1.0 if hub.is_whole(u) else 0.0)], ins.KV_EVENTS_WHOLE.unit,
        ins.KV_EVENTS_WHOLE.description,
    )  # fmt: skip
    meter.create_observable_gauge(
        ins.KV_EVENTS_INDEX_BLOCKS.name, [lambda o: [Observation(hub.index_size())]], ins.KV_EVENTS_INDEX_BLOCKS.unit,
        ins.KV_EVENTS_INDEX_BLOCKS.description,
    )  # fmt: skip
    meter.create_observable_counter(
        ins.KV_EVENTS_FALLBACKS.name, [lambda o: [Observation(hub.fallbacks)]], ins.KV_EVENTS_FALLBACKS.unit,
        ins.KV_EVENTS_FALLBACKS.description,
    )  # fmt: skip
