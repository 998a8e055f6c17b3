"""The KV-event intake on /metrics: events, gaps, replays, lag and whether each replica's view is whole."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from app.kvcache.subscriber import KvEventsHub


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
        "gateway.kv_events.received", [per_replica(lambda u: hub.stats(u).events)], "{event}",
        "KV-cache events applied to the index, per replica",
    )  # fmt: skip
    meter.create_observable_counter(
        "gateway.kv_events.gaps", [per_replica(lambda u: hub.stats(u).gaps)], "{gap}",
        "Sequence gaps seen in a replica's event stream",
    )  # fmt: skip
    meter.create_observable_counter(
        "gateway.kv_events.replays", [per_replica(lambda u: hub.stats(u).replays)], "{replay}",
        "Catch-ups from a replica's replay endpoint",
    )  # fmt: skip
    meter.create_observable_gauge(
        "gateway.kv_events.lag", [per_replica(lambda u: hub.stats(u).lag_s)], "s",
        "Age of the newest event batch when it arrived",
    )  # fmt: skip
    meter.create_observable_gauge(
        "gateway.kv_events.whole", [per_replica(lambda u: 1.0 if hub.is_whole(u) else 0.0)], "1",
        "1 while a replica's event view is complete (else kv_events falls back for it)",
    )  # fmt: skip
    meter.create_observable_gauge(
        "gateway.kv_events.index_blocks", [lambda o: [Observation(hub.index_size())]], "{block}",
        "Blocks in the gateway's KV index",
    )  # fmt: skip
    meter.create_observable_counter(
        "gateway.kv_events.fallbacks", [lambda o: [Observation(hub.fallbacks)]], "{pick}",
        "kv_events picks that fell back to prefix affinity",
    )  # fmt: skip
