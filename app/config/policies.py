"""Each routing policy's parameters, as `pools.<p>.policy` takes them: a name or `{type: <name>, ...}`.

The models live with the rest of the schema, below every package that reads them (app/routing/registry.py
maps each `type` to its policy class); a new policy is its params model here, its module and one registry row.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from app.config.types import StrictModel

DEFAULT_LOAD_BOUND = 1.25


class KvEventsParams(StrictModel):
    """`policy: {type: kv_events, load_tokens: 512}` (block size and hash algorithm: what the replicas publish)."""

    type: Literal["kv_events"] = Field("kv_events", description="The policy's name.")
    block_size: int | None = Field(None, ge=1, description=(
        "Override of vLLM's KV block size in tokens (16 on GPUs, 128 on vLLM-CPU). Unset: read per replica from "
        "its BlockStored events and /metrics vllm:cache_config_info; a value that disagrees with them is logged "
        "once and counted (gateway_engine_config_mismatches_total)."))
    hash_algo: Literal["sha256", "sha256_cbor"] | None = Field(None, description=(
        "Override of vLLM's --prefix-caching-hash-algo. Unset: read from /metrics vllm:cache_config_info "
        "(prefix_caching_hash_algo), sha256_cbor while no replica has said."))
    load_tokens: int = Field(512, ge=0, description=(
        "Prefill-equivalent tokens one request waiting ahead in the engine's queue costs."))
    load_bound: float = Field(DEFAULT_LOAD_BOUND, ge=1.0, description=(
        "The bound of the prefix-affinity pick used while a replica's event stream is not whole."))


class PrefixAffinityParams(StrictModel):
    """`policy: {type: prefix_affinity, load_bound: c, min_bound: 0, spill: least_loaded}`."""

    type: Literal["prefix_affinity"] = Field("prefix_affinity", description="The policy's name.")
    load_bound: float = Field(DEFAULT_LOAD_BOUND, ge=1.0, description=(
        "c: a home takes a request only while its load after it stays within ceil(c x mean load)."))
    min_bound: int = Field(0, ge=0, description=(
        "A home may always hold this many requests before the bound applies: at low load the bound (c x a mean "
        "below one) would send a prefix's second request elsewhere, and each gateway replica, seeing only its own "
        "in-flight requests, elsewhere differently. 0 keeps the pure bound."))
    spill: Literal["least_loaded", "ranked"] = Field("least_loaded", description=(
        "Where a request over the bound goes: the least-loaded replica, or `ranked`: the next replica in the "
        "prefix's rendezvous order within the bound (a hot prefix then overflows onto the same second replica)."))


class RoundRobinParams(StrictModel):
    """`policy: round_robin` (no parameters)."""

    type: Literal["round_robin"] = Field("round_robin", description="The policy's name.")


class LeastLoadParams(StrictModel):
    """`policy: least_load` (no parameters)."""

    type: Literal["least_load"] = Field("least_load", description="The policy's name.")


def policy_object(value: Any) -> Any:
    """A bare name (the old form) is that policy with its default parameters."""
    return {"type": value} if isinstance(value, str) else value


PolicySpec = Annotated[
    KvEventsParams | PrefixAffinityParams | RoundRobinParams | LeastLoadParams, Field(discriminator="type")
]


