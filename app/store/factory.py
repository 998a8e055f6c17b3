"""Pick the Store the config asks for."""

from __future__ import annotations

from app.config import StoreConfig
from app.store.base import Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore


def create_store(cfg: StoreConfig) -> Store:
    """Redis when `store.url` is set (shared by replicas), else in-memory (one replica only)."""
    if cfg.url is None:
        return MemoryStore()
    return RedisStore(
        cfg.url, cfg.key_prefix, socket_timeout_s=cfg.socket_timeout_s, cooldown_s=cfg.cooldown_s,
        max_connections=cfg.max_connections,
    )
