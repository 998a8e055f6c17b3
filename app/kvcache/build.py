"""Builds the KV-event parts from the config: the event sources and the hub that indexes them (app/gateway.py
calls these once; the block hashers are app/kvcache/hashers.py's, at the block size the replicas publish)."""

from __future__ import annotations

from app.config import GatewayConfig
from app.kvcache.subscriber import EventSource, KvEventsHub


def event_sources(cfg: GatewayConfig) -> list[EventSource]:
    """One per replica that declared its KV-event endpoint (or whose pool's discovery names it)."""
    return [
        EventSource(url, ev.endpoint, ev.replay, ev.topic)
        for pool in cfg.pools.values()
        for url, ev in pool.replica_events.items()
    ]


def kv_hub(cfg: GatewayConfig) -> KvEventsHub | None:
    """The KV-event hub, when some replica publishes events or some pool discovers replicas that do."""
    sources = event_sources(cfg)
    discovered = any(p.discovery is not None and p.discovery.kv_events is not None for p in cfg.pools.values())
    return KvEventsHub(sources) if sources or discovered else None
