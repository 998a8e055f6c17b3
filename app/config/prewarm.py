"""`routing.prewarm`: whether a joining replica is pre-warmed, with how many prefixes, how fast, for how long.

Part of the schema (RoutingConfig mounts it).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from app.config.types import StrictModel


class PrewarmConfig(StrictModel):
    """Pre-warm settings; the prefixes' text is kept in the gateway's memory (never in logs, spans or the store)."""

    enabled: bool = Field(True, description="A replica that becomes healthy replays its share of the top prefixes.")
    prefixes: int = Field(32, ge=1, description=(
        "Most prefixes replayed to one joining replica (those it becomes the rendezvous home for, most seen "
        "first)."))
    per_tenant: int = Field(16, ge=1, description="Stable prefixes remembered per (pool, tenant).")
    tenants: int = Field(256, ge=1, description="Tenants remembered (the least recently seen go first).")
    max_prefix_chars: int = Field(65_536, ge=1, description=(
        "A prefix longer than this (system + tools + first user message, in characters) is not kept."))
    concurrency: int = Field(4, ge=1, description="Replays in flight at once on the joining replica.")
    budget_s: float = Field(10.0, gt=0, description="Wall time the replays may take before the replica joins anyway.")
    history_max_chars: int = Field(400_000, ge=0, description=(
        "Each remembered key's latest whole request (its session's history so far) is replayed instead of the bare "
        "prefix: a key that moves to the joining replica takes its session's next turn there. A history longer "
        "than this (≈100k tokens) is not kept (the key keeps the last one that fit). 0: histories off."))
    history_budget_chars: int = Field(16_000_000, ge=0, description=(
        "All kept histories together stay within this, the least recently updated forgotten first. 0: histories "
        "off."))
    run_max_chars: int = Field(2_000_000, ge=1, description=(
        "Characters replayed to one joining replica at most (≈500k tokens, about what one 80 GB GPU's KV cache "
        "holds for an 8B model): replays past it would evict the ones before them. A history that would pass it "
        "is replayed as its bare prefix, a prefix that would is not sent (outcome `capped`)."))

    @model_validator(mode="after")
    def _history_fits_its_budget(self) -> PrewarmConfig:
        if self.history_max_chars and self.history_budget_chars and self.history_max_chars > self.history_budget_chars:
            raise ValueError("history_max_chars must not exceed history_budget_chars (no history would fit)")
        return self

    @property
    def histories(self) -> bool:
        """Whether sessions' histories are remembered and replayed."""
        return self.history_max_chars > 0 and self.history_budget_chars > 0
