"""Builds the KV-event parts from the config: the event sources, the hub that indexes them, and per model the
exact block hasher of its first kv_events pool that names a tokenizer (app/gateway.py calls these once)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.config import GatewayConfig
from app.config.policies import KvEventsParams
from app.kvcache.subscriber import EventSource, KvEventsHub

if TYPE_CHECKING:
    from app.kvcache.tokens import RequestBlocks


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


def block_hashers(cfg: GatewayConfig) -> dict[str, RequestBlocks]:
    """Per model: the hasher of its first kv_events pool that names a tokenizer folder."""
    from app.kvcache.tokens import RequestBlocks  # needs the `kv` extra (tokenizers, jinja2)

    by_folder: dict[tuple[str, int], RequestBlocks] = {}
    out: dict[str, RequestBlocks] = {}
    for model in cfg.models:
        for name in model.pools:
            pool = cfg.pools[name]
            policy = pool.effective_policy()
            if isinstance(policy, KvEventsParams) and pool.tokenizer is not None:
                k = (pool.tokenizer, policy.block_size)
                if k not in by_folder:
                    by_folder[k] = RequestBlocks(pool.tokenizer, policy.block_size)
                out[model.name] = by_folder[k]
                break
    return out
