"""Policy name (as configured) → a policy instance for one pool."""

from __future__ import annotations

from app.config import PolicyName, RoutingConfig
from app.routing.least_load import LeastLoad
from app.routing.policy import Policy
from app.routing.prefix_affinity import PrefixAffinity
from app.routing.round_robin import RoundRobin


def make_policy(name: PolicyName, cfg: RoutingConfig) -> Policy:
    """A fresh policy instance (each pool owns its own: round robin keeps a cursor)."""
    if name == "prefix_affinity":
        return PrefixAffinity(cfg.load_bound)
    if name == "least_load":
        return LeastLoad()
    if name == "round_robin":
        return RoundRobin()
    raise ValueError(f"unknown routing policy {name!r}")
