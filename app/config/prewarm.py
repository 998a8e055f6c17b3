"""`routing.prewarm`: whether a joining replica is pre-warmed, with how many prefixes, how fast, for how long.

Self-contained (no import of app.config) so RoutingConfig can mount it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    # Each remembered key's latest whole request (its session's history so far), replayed instead of the bare
    # prefix: a key that moves to the joining replica takes its session's next turn there. A history longer than
    # history_max_chars (≈100k tokens by default) is not kept (the key keeps the last one that fit); all of them
    # together stay within history_budget_chars, the least recently updated forgotten first. 0 in either: off.
    history_max_chars: int = Field(400_000, ge=0)
    history_budget_chars: int = Field(16_000_000, ge=0)
    # Characters replayed to one joining replica at most (≈500k tokens, about what one 80 GB GPU's KV cache holds
    # for an 8B model): replays past it would evict the ones before them. A history that would pass it is replayed
    # as its bare prefix, a prefix that would is not sent (outcome `capped`).
    run_max_chars: int = Field(2_000_000, ge=1)

    @model_validator(mode="after")
    def _history_fits_its_budget(self) -> PrewarmConfig:
        if self.history_max_chars and self.history_budget_chars and self.history_max_chars > self.history_budget_chars:
            raise ValueError("history_max_chars must not exceed history_budget_chars (no history would fit)")
        return self

    @property
    def histories(self) -> bool:
        """Whether sessions' histories are remembered and replayed."""
        return self.history_max_chars > 0 and self.history_budget_chars > 0
