"""The configuration's tenants and keys: `tenants[]` (limits, reference price, opt-ins) and `auth`.

Part of the schema in app/config/models.py (GatewayConfig mounts these).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from app.config.types import NormalizeMode, OnExceed, RouteClassName, StrictModel


def _yaml_bool_to_mode(value: Any) -> Any:
    # YAML 1.1 reads a bare `on`/`off` as a boolean; the config documents them as words.
    if value is True:
        return "on"
    if value is False:
        return "off"
    return value


class LimitsConfig(StrictModel):
    """A tenant's limits (null: none)."""

    rpm: int | None = Field(None, ge=1, description="Requests per minute.")
    tpm: int | None = Field(None, ge=1, description="Tokens per minute (prompt + output, estimated then settled).")
    concurrent: int | None = Field(None, ge=1, description="Requests in flight at once.")
    monthly_budget_usd: float | None = Field(None, ge=0, description="Spend per calendar month (UTC) in $.")
    tpm_cached_weight: float = Field(1.0, ge=0, le=1, description="What a cached prompt token counts in `tpm`.")
    on_exceed: OnExceed = Field("reject", description=(
        "Over a limit: `reject` (429), or `degrade`: serve as bulk with a capped max_tokens instead, and say so "
        "in a header."))
    degrade_max_tokens: int = Field(256, ge=1, description="The output cap of a degraded request.")


class ReferencePrice(StrictModel):
    """A hosted API's price the tenant's spend is compared with (the savings metric)."""

    input_per_m: float = Field(3.00, ge=0, description="$ per million input tokens.")
    cached_input_per_m: float = Field(0.30, ge=0, description="$ per million cached input tokens.")
    output_per_m: float = Field(15.00, ge=0, description="$ per million output tokens.")


class TenantConfig(StrictModel):
    """Who pays: an id, its API keys, and what the gateway may do to its requests."""

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="The tenant's id (metrics, spend, logs).")
    api_keys: list[str] = Field(default_factory=list, description=(
        "Plaintext (dev only) or `sha256:<64 hex>`; plaintext is hashed on load and never kept."))
    default_class: RouteClassName | None = Field(None, description=(
        "Latency class of requests that name none (header, service_tier); null: classified from their shape."))
    normalize: NormalizeMode = Field("off", description=(
        "Prompt normalization: `off`, `observe` (report only), or `on` (move volatile spans out of the prefix)."))
    normalize_rules: list[str] | None = Field(None, description="The normalization rules applied; null: all.")
    limits: LimitsConfig = Field(LimitsConfig(), description="Rate, token, concurrency and budget limits.")
    reference_price: ReferencePrice = Field(ReferencePrice(), description="Hosted price spend is compared with.")
    capture_content: bool = Field(False, description="Opt-in: prompt text in spans (widens what leaves the gateway).")
    shared_cache: bool = Field(False, description=(
        "Opt-in: send no per-tenant cache_salt, so its prefixes share the KV cache with other tenants'."))

    _normalize_word = field_validator("normalize", mode="before")(
        classmethod(lambda cls, v: _yaml_bool_to_mode(v))
    )


class AuthConfig(StrictModel):
    """API keys: whether one is needed, the admin keys, and how long a lookup is trusted."""

    required: bool = Field(True, description="Every request needs a tenant's API key.")
    admin_keys: list[str] = Field(default_factory=list, description="Keys of the admin API (`/admin/*`).")
    key_cache_ttl_s: float = Field(5.0, ge=0, description=(
        "How long a key → tenant lookup is trusted before the store is asked again (a revoke through another "
        "gateway replica takes effect here within this)."))
    anonymous_keys: list[str] = Field(default_factory=lambda: ["EMPTY"], description=(
        "With `required: false`, these keys mean anonymous (SDKs insist on sending one; vLLM's docs use EMPTY). "
        "Any other key must name a tenant (401 otherwise), so a typo'd key is never billed anonymously."))


