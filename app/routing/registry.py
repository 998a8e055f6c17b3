"""The routing policies, registered in one table: name → (its config model, its class).

`pools.<p>.policy` is a name or `{type: <name>, ...its parameters}` (a discriminated union of the models
below). A new policy is one module with a params model and a class, plus one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel

from app.config.policies import KvEventsParams, LeastLoadParams, PrefixAffinityParams, RoundRobinParams
from app.routing.kv_events import BlockView, KvEvents
from app.routing.least_load import LeastLoad
from app.routing.policy import Policy
from app.routing.prefix_affinity import PrefixAffinity
from app.routing.round_robin import RoundRobin


class PolicyDefaults(NamedTuple):
    """Shared runtime parts a policy may need beyond its own parameters."""

    kv_hub: BlockView | None = None  # the KV-event index, when any pool publishes events


class Entry(NamedTuple):
    """One registered policy."""

    params: type[BaseModel]
    build: Callable[[Any, PolicyDefaults], Policy]


def _prefix_affinity(p: PrefixAffinityParams, d: PolicyDefaults) -> PrefixAffinity:
    return PrefixAffinity(p.load_bound, p.min_bound, p.spill)


def _kv_events(p: KvEventsParams, d: PolicyDefaults) -> Policy:
    fallback = PrefixAffinity(p.load_bound)
    # Without an event index (no replica declared kv_events) there is nothing to score: prefix affinity.
    return KvEvents(p, d.kv_hub, fallback) if d.kv_hub is not None else fallback


POLICIES: dict[str, Entry] = {
    "kv_events": Entry(KvEventsParams, _kv_events),
    "prefix_affinity": Entry(PrefixAffinityParams, _prefix_affinity),
    "round_robin": Entry(RoundRobinParams, lambda p, d: RoundRobin()),
    "least_load": Entry(LeastLoadParams, lambda p, d: LeastLoad()),
}


def build_policy(spec: BaseModel, defaults: PolicyDefaults) -> Policy:
    """A fresh policy instance for one pool (each pool owns its own: round robin keeps a cursor)."""
    name = spec.type  # type: ignore[attr-defined]
    return POLICIES[name].build(spec, defaults)
