"""The configuration's schema: every key an operator can set, with its default (pydantic models).

Loading (YAML file, environment overrides, every problem with its key path) is in app/config.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.config.admission import AdmissionConfig
from app.config.discovery import DiscoveryConfig
from app.config.load_report import LoadReportSettings
from app.config.peer_load import PeerLoadSettings
from app.config.policies import KvEventsParams, PolicySpec, PrefixAffinityParams, RoundRobinParams, policy_object
from app.config.prewarm import PrewarmConfig

RouteClassName = Literal["interactive", "bulk"]
NormalizeMode = Literal["off", "observe", "on"]

# What vLLM's speculative-decoding path refuses ("not yet supported with speculative decoding").
SPECULATIVE_UNSUPPORTED = ("min_p", "logit_bias")

URL_RE = re.compile(r"^https?://[^\s/:]+(:\d{1,5})?(/[^\s]*)?$")


def _check_url(url: str) -> str:
    if not URL_RE.match(url):
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
    # Slow clients: a request's headers must arrive within header_timeout_s of its first byte (or of the
    # connection), its body within body_timeout_s of the headers; a stalled socket is closed and counted.
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    # Open connections one client address may hold at once; one more is answered 503 and closed.
    max_connections_per_client: int = Field(256, ge=1)
    # An idle keep-alive connection is closed after this long.
    keepalive_timeout_s: float = Field(5.0, gt=0)
    # On SIGTERM: /ready turns 503 and the listener stays open drain_notice_s more (load balancers see the
    # readiness change), then stops accepting; open requests get up to drain_s (from the signal) to finish.
    drain_s: float = Field(30.0, ge=0)
    drain_notice_s: float = Field(1.0, ge=0)
    # Processes serving this port (SO_REUSEPORT); more than one needs a shared store (store.url).
    workers: int = Field(1, ge=1, le=64)


class StoreConfig(_Strict):
    url: str | None = None
    # What happens to requests while Redis is unreachable: "open" serves them (limits unenforced,
    # spend kept in memory and flushed later); "closed" rejects them with 503.
    fail_mode: Literal["open", "closed"] = "open"
    key_prefix: str = "kvgate:"
    # Every Redis call is bounded by this (a slow store must not hold requests up), then the store is
    # treated as down for `cooldown_s` before the next try.
    socket_timeout_s: float = Field(0.25, gt=0)
    cooldown_s: float = Field(0.5, ge=0)
    max_connections: int = Field(512, ge=1)

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
    # Derived prices charge a cached input token this fraction of an uncached one (no prefill; hosted APIs ~0.1x).
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


class ReplicaEvents(_Strict):
    """Where a replica publishes vLLM's KV-cache events (`--kv-events-config`)."""

    endpoint: str = Field(pattern=r"^(tcp|ipc)://\S+$")  # tcp://host:port: connect; tcp://*:port: bind a collector
    replay: str | None = Field(None, pattern=r"^(tcp|ipc)://\S+$")
    topic: str = "kv"


def _split_replicas(data: Any) -> Any:
    # A replica is a URL, or {url, kv_events, kv_replay?, kv_topic?}: the URLs stay the list every part of the
    # gateway reads; the event endpoints go beside them, keyed by URL.
    if not isinstance(data, dict) or not isinstance(data.get("replicas"), list):
        return data
    urls: list[Any] = []
    events: dict[str, Any] = dict(data.get("replica_events") or {})
    for i, r in enumerate(data["replicas"]):
        if not isinstance(r, dict):
            urls.append(r)
            continue
        extra = set(r) - {"url", "kv_events", "kv_replay", "kv_topic"}
        if extra or not isinstance(r.get("url"), str):
            raise ValueError(f"replicas[{i}]: a URL or {{url, kv_events, kv_replay, kv_topic}}")
        url = _check_url(r["url"])
        urls.append(url)
        if r.get("kv_events") is not None:
            events[url] = {"endpoint": r["kv_events"], "replay": r.get("kv_replay"), "topic": r.get("kv_topic", "kv")}
    return {**data, "replicas": urls, "replica_events": events}


class PoolConfig(_Strict):
    role: RouteClassName
    served_model: str = Field(min_length=1)
    # Static replica URLs, or empty with `discovery` (the replicas are then found at run time).
    replicas: list[ReplicaUrl] = Field(default_factory=list)
    discovery: DiscoveryConfig | None = None
    # Filled from replicas given as objects (see _split_replicas): URL → its KV-event endpoints.
    replica_events: dict[str, ReplicaEvents] = Field(default_factory=dict)
    # An HF-like folder (tokenizer.json, tokenizer_config.json with the chat template) for exact block hashes.
    tokenizer: str | None = None
    # vLLM's --max-num-seqs: requests beyond it queue in the engine, whatever the last scrape said.
    max_num_seqs: int | None = Field(None, ge=1)
    policy: PolicySpec | None = None
    price: PriceConfig
    # vLLM started with --scheduling-policy priority: the gateway then sends `priority` per class.
    priority_scheduling: bool = False
    ttft_slo_ms: float = Field(500, gt=0)
    # vLLM started with a --speculative-config (draft or ngram): it refuses some sampling parameters.
    speculative: bool = False
    # Top-level request fields this pool cannot serve; a request that sets one goes to a pool of its
    # model that can (app/routing/capability.py). Default: SPECULATIVE_UNSUPPORTED on a speculative pool.
    unsupported_params: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list
    )
    # The fair admission queue in front of this pool (app/admission): engages only while the pool is saturated.
    admission: AdmissionConfig = AdmissionConfig()
    load_report: LoadReportSettings = LoadReportSettings()  # vLLM's in-band load header (ORCA)

    _policy_object = field_validator("policy", mode="before")(classmethod(lambda cls, v: policy_object(v)))

    @model_validator(mode="before")
    @classmethod
    def _replica_objects(cls, data: Any) -> Any:
        return _split_replicas(data)

    @model_validator(mode="after")
    def _replicas_or_discovery(self) -> PoolConfig:
        if self.discovery is None and not self.replicas:
            raise ValueError("a pool needs replicas (a list of URLs) or discovery")
        if self.discovery is not None and self.replicas:
            raise ValueError("give replicas or discovery, not both")
        return self

    @model_validator(mode="after")
    def _speculative_default(self) -> PoolConfig:
        if self.speculative and "unsupported_params" not in self.model_fields_set:
            return self.model_copy(update={"unsupported_params": list(SPECULATIVE_UNSUPPORTED)})
        return self

    def effective_policy(self) -> BaseModel:
        """The policy in force: explicit; else kv_events when every replica publishes events or discovery says
        where they do (and a tokenizer is given); prefix affinity when there is a choice (or discovery), round
        robin for one replica."""
        if self.policy is not None:
            return self.policy
        if self.tokenizer is not None and (
            (self.discovery is not None and self.discovery.kv_events is not None)
            or (self.replicas and all(u in self.replica_events for u in self.replicas))
        ):
            return KvEventsParams()
        # A discovered pool's size changes at run time: its policy must not flip with it.
        return PrefixAffinityParams() if len(self.replicas) > 1 or self.discovery else RoundRobinParams()


class LimitsConfig(_Strict):
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    concurrent: int | None = Field(None, ge=1)
    monthly_budget_usd: float | None = Field(None, ge=0)
    tpm_cached_weight: float = Field(1.0, ge=0, le=1)  # what a cached prompt token counts in tpm (app/call_estimate.py)
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
    # How long a key → tenant lookup is trusted before the store is asked again (a revoke through
    # another gateway replica takes effect here within this).
    key_cache_ttl_s: float = Field(5.0, ge=0)
    # With required: false, these keys mean "anonymous" (SDKs insist on sending one; vLLM's docs use
    # EMPTY). Any other key must name a tenant (401 otherwise), so a typo'd key is never billed anonymously.
    anonymous_keys: list[str] = Field(default_factory=lambda: ["EMPTY"])


class TelemetryConfig(_Strict):
    otlp_endpoint: str | None = None
    service_name: str = "kvgate"
    metric_export_interval_s: float = Field(15, gt=0)


class BackoffConfig(_Strict):
    """Between failover attempts: uniform in [0, min(cap_s, base_s * 2^(n-1))] (full jitter)."""

    base_s: float = Field(0.05, ge=0)
    cap_s: float = Field(1.0, ge=0)


class UpstreamConfig(_Strict):
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(300.0, gt=0)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_connections_per_replica: int = Field(512, ge=1)
    retries: int = Field(2, ge=0, le=5)
    keepalive_timeout_s: float = Field(30.0, gt=0)
    backoff: BackoffConfig = BackoffConfig()
    # A chat stream whose replica fails midway continues on another replica this many times (0: never).
    max_migrations: int = Field(1, ge=0, le=3)


class BreakerSettings(_Strict):
    """Per-replica circuit breaker: open after `failures` in a row, cool down `open_s` (doubling to `max_open_s`)."""

    failures: int = Field(5, ge=1)
    open_s: float = Field(2.0, gt=0)
    max_open_s: float = Field(30.0, gt=0)


class SpillSettings(_Strict):
    """When the home pool counts as saturated, and when the other pool has room."""

    waiting_threshold: int = Field(1, ge=1)
    headroom_below_utilization: float = Field(0.8, ge=0, le=1)


class RoutingConfig(_Strict):
    bulk_max_tokens_threshold: int = Field(2048, ge=1)
    probe_interval_s: float = Field(1.5, gt=0)
    # A probe gets two intervals, clamped to these: a busy engine answers /health late, and late is not dead.
    probe_timeout_min_s: float = Field(1.0, gt=0)
    probe_timeout_max_s: float = Field(5.0, gt=0)
    healthy_after: int = Field(2, ge=1)
    unhealthy_after: int = Field(2, ge=1)
    # prefix_affinity's bound when its own `policy: {type: prefix_affinity, load_bound: …}` gives none.
    load_bound: float = Field(1.25, ge=1.0)
    allow_spill: bool = True
    bulk_borrow_below_utilization: float = Field(0.3, ge=0, le=1)
    breaker: BreakerSettings = BreakerSettings()
    spill: SpillSettings = SpillSettings()
    peer_load: PeerLoadSettings = PeerLoadSettings()
    # How long a response id → replica mapping is kept (vLLM's stored responses live in its process).
    response_ttl_s: float = Field(3600.0, gt=0)
    prewarm: PrewarmConfig = PrewarmConfig()  # app/prewarm: a joining replica replays the top prefixes first


class NormalizeConfig(_Strict):
    # Secret mixed into per-tenant cache_salt; override with KVGATE_NORMALIZE__SALT_SECRET in production.
    salt_secret: str = "kvgate-dev-secret"
    memory_per_tenant: int = Field(256, ge=8)
    # Learned volatility (template fingerprints only) kept in the store, so a new replica starts warm.
    share_learning: bool = True
    shared_refresh_s: float = Field(5.0, gt=0)


class GatewayConfig(BaseSettings):
    """The whole configuration: YAML file, then `KVGATE_<KEY>__<SUBKEY>` environment overrides."""

    model_config = SettingsConfigDict(
        env_prefix="KVGATE_", env_nested_delimiter="__", env_parse_none_str="null",
        case_sensitive=False, extra="forbid", frozen=True,
    )  # fmt: skip

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
    _models: dict[str, ModelConfig] = PrivateAttr(default_factory=dict)

    def model(self, name: str) -> ModelConfig | None:
        """The public model called `name`, if configured."""
        return self._models.get(name)

    def model_post_init(self, context: Any, /) -> None:
        """Index models by name once: the api stage looks one up per request."""
        self._models = {m.name: m for m in self.models}

    @model_validator(mode="after")
    def _workers_share_a_store(self) -> GatewayConfig:
        problem = workers_problem(self.listen.workers, self.store.url)
        if problem is not None:
            raise ValueError(f"listen.workers: {problem}")
        return self


def workers_problem(workers: int, store_url: str | None) -> str | None:
    """Why `workers` processes cannot run on this store (None when they can)."""
    if workers > 1 and store_url is None:
        return (f"{workers} worker processes need a shared store: with the in-memory store (store.url: null) "
                "each process would count limits and spend on its own; set store.url to a redis:// URL "
                "or run one worker")  # fmt: skip
    return None


