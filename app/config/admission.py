"""Admission settings for one pool: when the fair queue engages and how it shares a saturated pool.

Part of the schema (PoolConfig mounts it at `pools.<p>.admission`).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from app.config.types import OnExceed, RouteClassName, StrictModel

RouteClass = RouteClassName


class ClassDeadlines(StrictModel):
    """Longest wait in the queue per latency class before the request is refused (seconds)."""

    interactive: float = Field(2.0, gt=0, description="Longest queue wait of an interactive request.")
    bulk: float = Field(30.0, gt=0, description="Longest queue wait of a bulk request.")

    def for_class(self, route_class: RouteClass) -> float:
        """The deadline of `route_class`."""
        return self.interactive if route_class == "interactive" else self.bulk


class AdmissionConfig(StrictModel):
    """Saturation thresholds, queue bounds, deadlines and tenant weights of one pool's admission queue."""

    enabled: bool | None = Field(
        None,
        description="Fair admission in front of this pool. Unset (the default): on while the pool serves more "
        "than one tenant (a request of each within tenant_window_s), a pass-through otherwise; true: always "
        "on; false: off. It only ever holds requests while the pool is saturated.",
    )
    tenant_window_s: float = Field(
        60.0, gt=0, description="With enabled unset: how long a tenant counts as served after its last request."
    )
    max_waiting_per_replica: int = Field(4, ge=1, description=(
        "A replica is saturated when this many requests wait in its engine queue (vllm:num_requests_waiting, "
        "moved by the gateway's own sends since the scrape). A request that merely arrived between two engine "
        "steps shows up there for one step, so 1 would engage on noise below saturation."))
    kv_usage_threshold: float = Field(0.95, gt=0, le=1, description=(
        "... or when its KV cache is this full (vllm:kv_cache_usage_perc counts blocks held by running requests)."))
    max_in_flight_tokens: int | None = Field(None, ge=1, description=(
        "Optional hard cap on the predicted tokens (uncached prompt + output) the gateway has in flight on the "
        "pool."))
    reserve_per_replica: int = Field(0, ge=0, description=(
        "While saturated, engine slots are kept free for tenants under their fair share of the slots, so a light "
        "tenant's request starts at once instead of waiting for a running one to finish. The reserve follows "
        "demand (app.admission.pace): enough that such a request finds a free slot but for `reserve_miss` of the "
        "time, from their arrival rate vs the pool's release rate, between this and `reserve_max_per_replica` "
        "per replica. A kept slot costs its share of the batch (3 of 64 sequences, ~5% of tokens/s at most) only "
        "while someone needs it."))
    reserve_max_per_replica: int = Field(4, ge=0, description="Upper bound of the reserve per replica.")
    reserve_miss: float = Field(0.005, gt=0, lt=1, description=(
        "Fraction of time an under-share request may find no reserved slot (sizes the reserve)."))
    reserve_max_fraction: float = Field(
        0.1, gt=0, le=1,
        description="The reserve never exceeds this fraction of the pool's slots, rounded down: a kept slot costs "
        "1/slots of the tokens/s while nobody takes it (on 4 slots 25%), so a pool of fewer than 10 slots keeps "
        "none — a tenant under its share takes the next free slot there, before any tenant above its share "
        "(share_window_s); on 64, reserve_max_per_replica decides.",
    )
    pace_over_share: float = Field(1.5, ge=0, description=(
        "While capped, requests of tenants over their share start at most this many times as fast as slots free "
        "up, evenly spaced (0: off): the engine then never gets a burst of their prefills in one step."))
    over_share_prefills_per_replica: int = Field(1, ge=0, description=(
        "... and, while max_waiting_per_replica of them per replica wait in the gateway, at most this many of "
        "them per replica may be started and not yet have streamed a first token (0: no limit): an engine step "
        "then holds no more of their prefills than that, however long its steps are (app.admission.prefill)."))
    first_token_hold_s: float = Field(1.0, gt=0, description=(
        "A start stops counting against over_share_prefills_per_replica after this long without a first token."))
    deadline_s: ClassDeadlines = Field(ClassDeadlines(), description=(
        "Longest wait in the queue per latency class before the request is refused."))
    max_queue_len: int = Field(1024, ge=1, description=(
        "Requests waiting in the gateway for this pool, all tenants together. When full, the tenant with the "
        "longest queue loses its newest request to a tenant with a shorter one (so a flood cannot lock others "
        "out)."))
    tenant_weights: dict[str, float] = Field({}, description=(
        "Tenant id → weight: fair share is proportional to weight."))
    default_weight: float = Field(1.0, gt=0, description="The weight of tenants not in tenant_weights.")
    share_window_s: float = Field(30.0, gt=0, description=(
        "While saturated, a tenant that got less than its weighted share of the pool over about this long "
        "(tokens started, decaying exponentially) starts before the tenants above theirs: one whose demand is "
        "just under its share is not queued behind a flood at every burst (app.admission.recent)."))
    on_exceed: OnExceed = Field("reject", description=(
        "A refused request: `reject` (429 + Retry-After), or `degrade` (serve it on the bulk pool)."))

    @field_validator("tenant_weights")
    @classmethod
    def _positive_weights(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(t for t, w in v.items() if not w > 0)
        if bad:
            raise ValueError(f"tenant weights must be > 0 (not for {', '.join(bad)})")
        return v

    def weight(self, tenant: str) -> float:
        """The fair-share weight of `tenant`."""
        return self.tenant_weights.get(tenant, self.default_weight)
