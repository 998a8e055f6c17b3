"""Each routing policy's parameters, as `pools.<p>.policy` takes them: a name or `{type: <name>, ...}`.

The models live with the rest of the schema, below every package that reads them (app/routing/registry.py
maps each `type` to its policy class); a new policy is its params model here, its module and one registry row.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class KvEventsParams(BaseModel):
    """`policy: {type: kv_events, block_size: 128, load_tokens: 512}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["kv_events"] = "kv_events"
    # vLLM's --block-size (16 on GPUs; vLLM-CPU uses 128).
    block_size: int = Field(16, ge=1)
    # Prefill-equivalent tokens one request waiting ahead in the engine's queue costs.
    load_tokens: int = Field(512, ge=0)


class PrefixAffinityParams(BaseModel):
    """`policy: {type: prefix_affinity, load_bound: c}`; without load_bound, `routing.load_bound` applies."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["prefix_affinity"] = "prefix_affinity"
    load_bound: float | None = Field(None, ge=1.0)
    # A home may always hold this many requests before the bound applies: at low load the bound (c x a mean
    # below one) would send a prefix's second request elsewhere, and each gateway replica, seeing only its
    # own in-flight requests, elsewhere differently. 0 keeps the pure bound.
    min_bound: int = Field(0, ge=0)
    spill: Literal["least_loaded", "ranked"] = "least_loaded"


class RoundRobinParams(BaseModel):
    """`policy: round_robin` (no parameters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["round_robin"] = "round_robin"


class LeastLoadParams(BaseModel):
    """`policy: least_load` (no parameters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["least_load"] = "least_load"


def policy_object(value: Any) -> Any:
    """A bare name (the old form) is that policy with its default parameters."""
    return {"type": value} if isinstance(value, str) else value


PolicySpec = Annotated[
    KvEventsParams | PrefixAffinityParams | RoundRobinParams | LeastLoadParams, Field(discriminator="type")
]


