"""Shared state for limits, spend and API keys: the Store protocol and its two implementations."""

from app.store.base import (
    AdmitResult,
    DayUsage,
    LimitSpec,
    PoolUsage,
    Release,
    SpendRecord,
    Store,
    StoreUnavailable,
)
from app.store.factory import create_store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore

__all__ = [
    "AdmitResult",
    "DayUsage",
    "LimitSpec",
    "MemoryStore",
    "PoolUsage",
    "RedisStore",
    "Release",
    "SpendRecord",
    "Store",
    "StoreUnavailable",
    "create_store",
]
