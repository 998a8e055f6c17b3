"""Spill-over between pools: when a class's home pool is saturated, may the other pool take the request?

Interactive → bulk when the interactive pool queues (or its projected TTFT is over its SLO) and bulk has
headroom; bulk → interactive ("borrow") only while the interactive pool is nearly idle, so bulk work never
takes capacity interactive traffic is about to need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.config import ModelConfig, RoutingConfig, SpillSettings
from app.context import RouteClass
from app.routing.state import ClusterState, PoolState, ReplicaState

# The home pool is saturated when even its shortest queue holds `waiting_threshold` waiting requests; the
# spill target has headroom when some replica queues nothing and is below `headroom_below_utilization`.
SpillTuning = SpillSettings
DEFAULT_TUNING = SpillSettings()


@dataclass(frozen=True, slots=True)
class Spill:
    """A decision to leave the home pool: the stable reason (a metric label) and a human explanation."""

    reason: str
    detail: str


def home_and_other(model: ModelConfig, route_class: RouteClass, cluster: ClusterState) -> tuple[
    PoolState, PoolState | None
]:
    """The class's home pool (first of the model's pools with that role, else the first) and the other:
    the first pool of the other role, else the next pool (a failover target only, see pick)."""
    pools = [cluster.pools[name] for name in model.pools]
    home = next((p for p in pools if p.cfg.role == route_class), pools[0])
    rest = [p for p in pools if p is not home]
    other = next((p for p in rest if p.cfg.role != home.cfg.role), rest[0] if rest else None)
    return home, other


def cached_home_and_other(model: ModelConfig, route_class: RouteClass, cluster: ClusterState) -> tuple[
    PoolState, PoolState | None
]:
    """home_and_other, memoized on the cluster (pools are fixed for a ClusterState's life)."""
    memo = cluster.memo
    k = (model.name, route_class)
    found = memo.get(k)
    if found is None:
        found = memo[k] = home_and_other(model, route_class, cluster)
    return found


def saturation(pool: PoolState, candidates: Sequence[ReplicaState], tuning: SpillTuning) -> str | None:
    """Why the pool counts as saturated (every replica queues, or even the best projected TTFT misses the
    SLO), or None when it is not."""
    threshold = tuning.waiting_threshold
    slo_ms = pool.cfg.ttft_slo_ms
    all_queue = all_slow = True
    # Runs on every request: stop at the first replica that is neither queueing nor slow.
    for r in candidates:
        if r.queued() < threshold:
            all_queue = False
        if r.ttft_ewma_s is None or r.projected_ttft_ms() <= slo_ms:
            all_slow = False
        if not (all_queue or all_slow):
            return None
    if all_queue:
        min_waiting = min(r.queued() for r in candidates)
        return f"{pool.name} queues: min waiting {min_waiting} >= {threshold}"
    best_ttft = min(r.projected_ttft_ms() for r in candidates)
    return f"{pool.name} projected TTFT {best_ttft:.0f} ms > SLO {slo_ms:.0f} ms"


def utilization(candidates: Sequence[ReplicaState]) -> float:
    """Mean utilization of the replicas in rotation (0-1)."""
    return sum(r.utilization() for r in candidates) / len(candidates)


def has_headroom(candidates: Sequence[ReplicaState], tuning: SpillTuning) -> bool:
    """Some replica queues nothing and has room left."""
    return any(r.queued() == 0 and r.utilization() < tuning.headroom_below_utilization for r in candidates)


def decide_spill(
    route_class: RouteClass,
    why: str,
    other: PoolState,
    other_candidates: Sequence[ReplicaState],
    cfg: RoutingConfig,
    tuning: SpillTuning = DEFAULT_TUNING,
) -> Spill | None:
    """Given the home pool is saturated (`why`, from saturation()), may `other` take the request?"""
    if route_class == "interactive":
        if has_headroom(other_candidates, tuning):
            return Spill("spill_interactive_to_bulk", f"{why}; {other.name} has headroom")
        return None
    util = utilization(other_candidates)
    if util < cfg.bulk_borrow_below_utilization and saturation(other, other_candidates, tuning) is None:
        return Spill(
            "borrow_idle_interactive",
            f"{why}; {other.name} utilization {util:.2f} < {cfg.bulk_borrow_below_utilization:.2f}",
        )
    return None
