"""The routing policies, registered in one table: name → (its config model, its class).

`pools.<p>.policy` is a name or `{type: <name>, ...its parameters}` (a discriminated union of the models
below). A new policy is one module with a params model and a class, plus one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, Field

from app.routing.least_load import LeastLoad, LeastLoadParams
from app.routing.policy import Policy
from app.routing.prefix_affinity import PrefixAffinity, PrefixAffinityParams
from app.routing.round_robin import RoundRobin, RoundRobinParams


class PolicyDefaults(NamedTuple):
    """Gateway-wide values a policy falls back to when its own parameters leave them out."""

    load_bound: float = 1.25


class Entry(NamedTuple):
    """One registered policy."""

    params: type[BaseModel]
    build: Callable[[Any, PolicyDefaults], Policy]


POLICIES: dict[str, Entry] = {
    "prefix_affinity": Entry(
        PrefixAffinityParams, lambda p, d: PrefixAffinity(p.load_bound if p.load_bound is not None else d.load_bound)
    ),
    "round_robin": Entry(RoundRobinParams, lambda p, d: RoundRobin()),
    "least_load": Entry(LeastLoadParams, lambda p, d: LeastLoad()),
}


def policy_object(value: Any) -> Any:
    """A bare name (the old form) is that policy with its default parameters."""
    return {"type": value} if isinstance(value, str) else value


PolicySpec = Annotated[PrefixAffinityParams | RoundRobinParams | LeastLoadParams, Field(discriminator="type")]


def build_policy(spec: BaseModel, defaults: PolicyDefaults) -> Policy:
    """A fresh policy instance for one pool (each pool owns its own: round robin keeps a cursor)."""
    name = spec.type  # type: ignore[attr-defined]
    return POLICIES[name].build(spec, defaults)
