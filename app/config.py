"""The gateway's configuration: YAML file + `KVGATE_*` environment overrides, validated up front."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

RouteClassName = Literal["interactive", "bulk"]
NormalizeMode = Literal["off", "observe", "on"]
PolicyName = Literal["prefix_affinity", "round_robin", "least_load"]

_URL_RE = re.compile(r"^https?://[^\s/:]+(:\d{1,5})?(/[^\s]*)?$")
EMBEDDED_CONFIG = Path(__file__).resolve().parent / "defaults" / "local.yaml"  # config/local.yaml links here


def _check_url(url: str) -> str:
    if not _URL_RE.match(url):
        raise ValueError("not a URL")
    return url.rstrip("/")


ReplicaUrl = Annotated[str, AfterValidator(_check_url)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _yaml_bool_to_mode(value: Any) -> Any:
    # YAML 1.1 reads a bare `on`/`off` as a boolean; the config documents them as words.
    if value is True:
        return "on"
    if value is False:
        return "off"
    return value


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


class StoreConfig(_Strict):
    url: str | None = None
    # What happens to requests while Redis is unreachable: "open" serves them (limits unenforced,
    # spend kept in memory and flushed later); "closed" rejects them with 503.
    fail_mode: Literal["open", "closed"] = "open"
    key_prefix: str = "kvgate:"

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(redis|rediss|unix)://", v):
            raise ValueError("not a redis:// URL")
        return v


class ModelConfig(_Strict):
    name: str = Field(min_length=1)
    pools: list[str] = Field(min_length=1)
    # Where moved volatile lines go: a trailing system message (templates that allow one), or a
    # delimited block appended to the last user turn.
    tail_placement: Literal["system", "user"] = "system"
    # The chat template inserts today's date itself (Llama 3): pin chat_template_kwargs.date_string.
    template_inserts_date: bool = False
    # Canonical tool order: sorted by name (stable across clients), or as the client sent them.
    tool_order: Literal["name", "client"] = "name"


class PriceConfig(_Strict):
    """A pool's price: explicit $/M tokens, or derived from GPU $/h and measured capacity."""

    gpu_hour_usd: float | None = Field(None, ge=0)
    gpus: int = Field(1, ge=1)
    capacity_tokens_per_s: float | None = Field(None, gt=0)
    input_per_m: float | None = Field(None, ge=0)
    cached_input_per_m: float | None = Field(None, ge=0)
    output_per_m: float | None = Field(None, ge=0)
    # With derived prices a cached input token is charged this fraction of an uncached one: its
    # prefill is skipped, only its KV memory is held (hosted APIs price it at ~0.1x too).
    cached_ratio: float = Field(0.1, ge=0, le=1)

    @model_validator(mode="after")
    def _complete(self) -> PriceConfig:
        explicit = (self.input_per_m, self.output_per_m)
        if any(v is None for v in explicit) and (
            self.gpu_hour_usd is None or self.capacity_tokens_per_s is None
        ):
            raise ValueError(
                "give input_per_m and output_per_m, or gpu_hour_usd and capacity_tokens_per_s"
            )
        return self


class PoolConfig(_Strict):
    role: RouteClassName
    served_model: str = Field(min_length=1)
    replicas: list[ReplicaUrl] = Field(min_length=1)
    policy: PolicyName | None = None
    price: PriceConfig
    # vLLM started with --scheduling-policy priority: the gateway then sends `priority` per class.
    priority_scheduling: bool = False
    ttft_slo_ms: float = Field(500, gt=0)


    def effective_policy(self) -> PolicyName:
        """The routing policy in force: explicit, else prefix affinity when there is a choice."""
        if self.policy is not None:
            return self.policy
        return "prefix_affinity" if len(self.replicas) > 1 else "round_robin"


class LimitsConfig(_Strict):
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    concurrent: int | None = Field(None, ge=1)
    monthly_budget_usd: float | None = Field(None, ge=0)
    # reject: 429; degrade: serve as bulk with a capped max_tokens instead, and say so in a header.
    on_exceed: Literal["reject", "degrade"] = "reject"
    degrade_max_tokens: int = Field(256, ge=1)


class ReferencePrice(_Strict):
    input_per_m: float = Field(3.00, ge=0)
    cached_input_per_m: float = Field(0.30, ge=0)
    output_per_m: float = Field(15.00, ge=0)


class TenantConfig(_Strict):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # Plaintext (dev only) or "sha256:<64 hex>"; plaintext is hashed on load and never kept.
    api_keys: list[str] = Field(default_factory=list)
    default_class: RouteClassName | None = None
    normalize: NormalizeMode = "off"
    normalize_rules: list[str] | None = None
    limits: LimitsConfig = LimitsConfig()
    reference_price: ReferencePrice = ReferencePrice()
    # Opt-ins that widen what leaves the gateway: prompt text in spans, a cache shared across tenants.
    capture_content: bool = False
    shared_cache: bool = False

    _normalize_word = field_validator("normalize", mode="before")(
        classmethod(lambda cls, v: _yaml_bool_to_mode(v))
    )


class AuthConfig(_Strict):
    required: bool = True
    admin_keys: list[str] = Field(default_factory=list)


class TelemetryConfig(_Strict):
    otlp_endpoint: str | None = None
    service_name: str = "kvgate"
    metric_export_interval_s: float = Field(15, gt=0)


class UpstreamConfig(_Strict):
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(300.0, gt=0)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_connections_per_replica: int = Field(512, ge=1)
    retries: int = Field(2, ge=0, le=5)


class RoutingConfig(_Strict):
    bulk_max_tokens_threshold: int = Field(2048, ge=1)
    probe_interval_s: float = Field(1.5, gt=0)
    healthy_after: int = Field(2, ge=1)
    unhealthy_after: int = Field(2, ge=1)
    load_bound: float = Field(1.25, ge=1.0)
    allow_spill: bool = True
    bulk_borrow_below_utilization: float = Field(0.3, ge=0, le=1)


class NormalizeConfig(_Strict):
    # Secret mixed into per-tenant cache_salt; override with KVGATE_NORMALIZE__SALT_SECRET in production.
    salt_secret: str = "kvgate-dev-secret"
    memory_per_tenant: int = Field(256, ge=8)


class GatewayConfig(_Strict):
    """The whole configuration, as loaded from YAML and the environment."""

    listen: Listen = Listen()
    store: StoreConfig = StoreConfig()
    models: list[ModelConfig] = Field(min_length=1)
    pools: dict[str, PoolConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(default_factory=list)
    auth: AuthConfig = AuthConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    routing: RoutingConfig = RoutingConfig()
    normalize: NormalizeConfig = NormalizeConfig()

    def model(self, name: str) -> ModelConfig | None:
        """The public model called `name`, if configured."""
        for m in self.models:
            if m.name == name:
                return m
        return None


@dataclass(frozen=True, slots=True)
class Problem:
    """One configuration problem, located by its key path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """The configuration cannot be used; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def _loc_to_path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


def _problems_from_validation(err: ValidationError) -> list[Problem]:
    return [Problem(_loc_to_path(e["loc"]), e["msg"].removeprefix("Value error, ")) for e in err.errors()]


def _semantic_problems(cfg: GatewayConfig) -> list[Problem]:
    from app.normalize.rules import RULES as known_rules  # the normalize package imports this module

    problems: list[Problem] = []
    seen_models: set[str] = set()
    for i, m in enumerate(cfg.models):
        if m.name in seen_models:
            problems.append(Problem(f"models[{i}].name", f"duplicate model {m.name!r}"))
        seen_models.add(m.name)
        for j, pool in enumerate(m.pools):
            if pool not in cfg.pools:
                problems.append(Problem(f"models[{i}].pools[{j}]", f"unknown pool {pool!r}"))
    seen_tenants: set[str] = set()
    seen_keys: set[str] = set()
    for i, t in enumerate(cfg.tenants):
        if t.id in seen_tenants:
            problems.append(Problem(f"tenants[{i}].id", f"duplicate tenant {t.id!r}"))
        seen_tenants.add(t.id)
        for j, key in enumerate(t.api_keys):
            if key in seen_keys:
                problems.append(Problem(f"tenants[{i}].api_keys[{j}]", "key already used by another tenant"))
            seen_keys.add(key)
            if key.startswith("sha256:") and not re.fullmatch(r"sha256:[0-9a-f]{64}", key):
                problems.append(Problem(f"tenants[{i}].api_keys[{j}]", "sha256: needs 64 lowercase hex digits"))
        for j, rule in enumerate(t.normalize_rules or ()):
            if rule not in known_rules:
                known = ", ".join(known_rules)
                problems.append(Problem(f"tenants[{i}].normalize_rules[{j}]", f"unknown rule {rule!r}; known: {known}"))
    if cfg.telemetry.otlp_endpoint is not None and not _URL_RE.match(cfg.telemetry.otlp_endpoint):
        problems.append(Problem("telemetry.otlp_endpoint", "not a URL"))
    return problems


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """`KVGATE_A__B=v` → {"a": {"b": v}}; values are parsed as YAML scalars/flow collections."""
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith("KVGATE_") or key in {"KVGATE_CACHE", "KVGATE_CONFIG"}:
            continue
        parts = [p.lower() for p in key[len("KVGATE_") :].split("__") if p]
        if not parts or parts[0] not in GatewayConfig.model_fields:
            continue
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(value) if value else None
    return out


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), dict):
            merged[k] = _deep_merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def parse_config(raw: Mapping[str, Any], env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate a raw config mapping (plus `KVGATE_*` overrides) or raise ConfigError with every problem."""
    data = _deep_merge(dict(raw), _env_overrides(os.environ if env is None else env))
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_problems_from_validation(err)) from None
    problems = _semantic_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Load a YAML config file (default: the embedded `config/local.yaml`) and validate it."""
    environ = os.environ if env is None else env
    chosen = Path(path or environ.get("KVGATE_CONFIG") or EMBEDDED_CONFIG)
    try:
        text = chosen.read_text()
    except OSError as err:
        raise ConfigError([Problem("", f"cannot read {chosen}: {err.strerror}")]) from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError([Problem("", f"{chosen}: invalid YAML: {err}")]) from None
    if not isinstance(raw, dict):
        raise ConfigError([Problem("", f"{chosen}: top level must be a mapping")])
    return parse_config(raw, environ)
