"""`routing.prewarm`: whether a joining replica is pre-warmed, with how many prefixes, how fast, for how long.

Self-contained (no import of app.config) so RoutingConfig can mount it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PrewarmConfig(BaseModel):
    """Pre-warm settings; the prefixes' text is kept in the gateway's memory (never in logs, spans or the store)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # Most prefixes replayed to one joining replica (those it becomes the rendezvous home for, most seen first).
    prefixes: int = Field(32, ge=1)
    # Stable prefixes remembered per (pool, tenant), and tenants remembered (the least recently seen go first).
    per_tenant: int = Field(16, ge=1)
    tenants: int = Field(256, ge=1)
    # A prefix longer than this (system + tools + first user message, in characters) is not kept.
    max_prefix_chars: int = Field(65_536, ge=1)
    # Replays in flight at once on the joining replica, and the wall time it may spend before it joins anyway.
    concurrency: int = Field(4, ge=1)
    budget_s: float = Field(10.0, gt=0)
