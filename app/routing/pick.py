"""The pick stage: choose pool (home, spill-over, failover) and replica (the pool's policy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.config import ModelConfig, RoutingConfig
from app.context import ClassDecision, RouteDecision
from app.errors import upstream_unavailable
from app.routing.capability import serving_pools
from app.routing.priority import priority_for
from app.routing.session_key import SessionKey
from app.routing.sessions import route_session
from app.routing.spill import SpillTuning, cached_home_and_other, decide_spill, saturation
from app.routing.state import ClusterState, PoolState

if TYPE_CHECKING:
    from app.records import PromptBlocks


def _out_of_rotation(pool: PoolState, exclude: frozenset[str]) -> str:
    unhealthy = sum(1 for r in pool.replicas if not r.healthy)
    broken = sum(1 for r in pool.replicas if r.healthy and not r.breaker.allows())
    tried = sum(1 for r in pool.replicas if r.url in exclude)
    return f"{pool.name}: none in rotation ({unhealthy} unhealthy, {broken} breaker open, {tried} tried)"


def pick(
    *,
    model: ModelConfig,
    decision: ClassDecision,
    key: int,
    cluster: ClusterState,
    cfg: RoutingConfig,
    exclude: frozenset[str] = frozenset(),
    tuning: SpillTuning | None = None,
    body: Mapping[str, Any] | None = None,
    blocks: PromptBlocks | None = None,
    session: SessionKey | None = None,
) -> RouteDecision:
    """Route one request; `exclude` holds replica URLs already tried (a failover retry).

    With `body`, only pools that can serve its parameters are used (app/routing/capability.py). With `session`, a
    pool that routes sessions keeps it on its replica (app/routing/sessions.py).
    Raises GatewayError 503 when no replica that may take the request is in rotation, 400 when no pool
    of the model can serve the body's parameters.
    """
    route_class = decision.route_class
    if tuning is None:
        tuning = cfg.spill
    home, other = cached_home_and_other(model, route_class, cluster)
    reason: str | None = None
    detail = ""
    if body is not None:
        serving = serving_pools(model, cluster.pools, home, other, body)
        home, other, reason, detail = serving.home, serving.other, serving.reason, serving.detail
    may_leave = other is not None and cfg.allow_spill
    target = home
    candidates = home.candidates(exclude)
    if may_leave and other is not None:
        if candidates:
            # Spill-over moves work between the two roles; a second pool of the same role only fails over.
            why = saturation(home, candidates, tuning) if other.cfg.role != home.cfg.role else None
            other_candidates = other.candidates(exclude) if why is not None else []
            if why is not None and other_candidates:
                spill = decide_spill(route_class, why, other, other_candidates, cfg, tuning)
                if spill is not None:
                    target, candidates, reason, detail = other, other_candidates, spill.reason, spill.detail
        else:
            target, candidates = other, other.candidates(exclude)
            reason, detail = "failover", _out_of_rotation(home, exclude)
    if not candidates:
        raise upstream_unavailable(f"no healthy upstream replica for model {model.name!r}")
    stamp = cluster.peer_clock() if cluster.peer_clock is not None else None
    sessions = target.sessions if session is not None else None
    if sessions is not None and session is not None:
        sel = route_session(target.policy, sessions, candidates, key, blocks, session)
    else:
        sel = target.policy.select(candidates, key, blocks)
    if reason is None:
        reason = "failover" if exclude else sel.reason
    return RouteDecision(
        pool=target.name,
        replica=sel.chosen.url,
        policy=target.policy.name,
        reason=reason,
        runner_up=sel.runner_up.url if sel.runner_up is not None else None,
        spilled=target is not home,
        priority=priority_for(route_class, target.cfg),
        attempt=len(exclude) + 1,
        detail=detail,
        target=sel.chosen,
        cached_tokens=sel.cached_tokens,
        load_stamp=stamp,
        session=session.source if sessions is not None and session is not None else None,
    )
