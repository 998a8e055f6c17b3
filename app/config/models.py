"""The configuration's schema: every key an operator can set, with its default (pydantic models).

Loading (YAML file, environment overrides, every problem with its key path) is in app/config/loader.py.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.config.admission import AdmissionConfig
from app.config.discovery import DiscoveryConfig
from app.config.env import YamlEnvSource
from app.config.listen import Listen
from app.config.load_report import LoadReportSettings
from app.config.peer_load import PeerLoadSettings
from app.config.policies import KvEventsParams, PolicySpec, PrefixAffinityParams, RoundRobinParams, policy_object
from app.config.prewarm import PrewarmConfig
from app.config.sessions import SessionSettings
from app.config.tenants import AuthConfig, TenantConfig
from app.config.tpot import TpotSettings
from app.config.types import RouteClassName, StrictModel
from app.config.upstream import UpstreamConfig

# What vLLM's speculative-decoding path refuses ("not yet supported with speculative decoding").
SPECULATIVE_UNSUPPORTED = ("min_p", "logit_bias")

URL_RE = re.compile(r"^https?://[^\s/:]+(:\d{1,5})?(/[^\s]*)?$")


def _check_url(url: str) -> str:
    if not URL_RE.match(url):
        raise ValueError("not a URL")
    return url.rstrip("/")


ReplicaUrl = Annotated[str, AfterValidator(_check_url)]


class StoreConfig(StrictModel):
    """Where limits, spend, keys and shared learning live: Redis, or this process's memory."""

    url: str | None = Field(None, description=(
        "`redis://`, `rediss://` or `unix://` URL of the shared store; null: in memory (one process only)."))
    fail_mode: Literal["open", "closed"] = Field("open", description=(
        "While Redis is unreachable: `open` serves requests (limits unenforced, spend kept in memory and "
        "flushed later); `closed` rejects them with 503."))
    key_prefix: str = Field("kvgate:", description="Prefix of every key the gateway writes in the store.")
    socket_timeout_s: float = Field(0.25, gt=0, description=(
        "Bound on every Redis call (a slow store must not hold requests up); past it the store counts as down."))
    cooldown_s: float = Field(0.5, ge=0, description="After a failed call, the store is treated as down this long.")
    max_connections: int = Field(512, ge=1, description="Redis connection pool size of one process.")

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(redis|rediss|unix)://", v):
            raise ValueError("not a redis:// URL")
        return v


class ModelConfig(StrictModel):
    """A public model name clients ask for, and the pools that serve it."""

    name: str = Field(min_length=1, description="The `model` clients send.")
    pools: list[str] = Field(min_length=1, description=(
        "Pools serving this model (names under `pools`); the request's latency class picks among their roles."))
    tail_placement: Literal["system", "user"] = Field("system", description=(
        "Where moved volatile lines go: a trailing system message (templates that allow one), or a delimited "
        "block appended to the last user turn."))
    template_inserts_date: bool = Field(False, description=(
        "The chat template inserts today's date itself (Llama 3): pin `chat_template_kwargs.date_string`."))
    tool_order: Literal["name", "client"] = Field("name", description=(
        "Canonical tool order: sorted by name (stable across clients), or as the client sent them."))


class PriceConfig(StrictModel):
    """A pool's price: explicit $/M tokens, or derived from GPU $/h and measured capacity."""

    gpu_hour_usd: float | None = Field(None, ge=0, description="Price of one GPU hour (derived prices).")
    gpus: int = Field(1, ge=1, description="GPUs one replica uses (derived prices).")
    capacity_tokens_per_s: float | None = Field(None, gt=0, description=(
        "Measured tokens/s one replica serves (derived prices; `kvgate bench` reports it)."))
    input_per_m: float | None = Field(None, ge=0, description="Explicit $ per million uncached input tokens.")
    cached_input_per_m: float | None = Field(None, ge=0, description=(
        "$ per million cached input tokens; null: `cached_ratio` x the input price."))
    output_per_m: float | None = Field(None, ge=0, description="Explicit $ per million output tokens.")
    cached_ratio: float = Field(0.1, ge=0, le=1, description=(
        "Derived prices charge a cached input token this fraction of an uncached one (no prefill; hosted APIs "
        "~0.1x)."))

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


class ReplicaEvents(StrictModel):
    """Where a replica publishes vLLM's KV-cache events (`--kv-events-config`)."""

    endpoint: str = Field(pattern=r"^(tcp|ipc)://\S+$", description=(
        "ZMQ endpoint of the event stream: `tcp://host:port` connects; `tcp://*:port` binds a collector."))
    replay: str | None = Field(None, pattern=r"^(tcp|ipc)://\S+$", description=(
        "ZMQ endpoint of vLLM's replay socket (missed events are asked for again after a gap)."))
    topic: str = Field("kv", description="ZMQ topic of the events.")


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


class PoolConfig(StrictModel):
    """A set of vLLM replicas serving one model in one latency role, with its routing policy and price."""

    role: RouteClassName = Field(description="The latency class this pool serves first.")
    served_model: str = Field(min_length=1, description="The model name vLLM serves (`--served-model-name`).")
    replicas: list[ReplicaUrl] = Field(default_factory=list, description=(
        "Static replica URLs, each a URL or `{url, kv_events, kv_replay, kv_topic}` (its KV-event endpoints); "
        "empty with `discovery` (the replicas are then found at run time)."))
    discovery: DiscoveryConfig | None = Field(None, description=(
        "Find the replicas at run time (DNS or EndpointSlices) instead of `replicas`."))
    replica_events: dict[str, ReplicaEvents] = Field(default_factory=dict, description=(
        "URL → its KV-event endpoints; filled from replicas given as objects."))
    tokenizer: str | None = Field(None, description=(
        "An HF-like folder (tokenizer.json, tokenizer_config.json with the chat template) for exact block hashes."))
    max_num_seqs: int | None = Field(None, ge=1, description=(
        "Override of the replicas' `--max-num-seqs` (requests beyond it queue in the engine, whatever the last "
        "scrape said). Null: what a replica publishes (vllm:cache_config_info max_num_seqs, which vLLM 0.32 does "
        "not publish: then unknown, and the admission queue learns it from full scrapes)."))
    policy: PolicySpec | None = Field(None, description=(
        "Routing policy: a name or `{type: <name>, ...parameters}` (below); null: `kv_events` where every replica "
        "declares its events and a `tokenizer` is named, else `prefix_affinity` (round robin for one replica)."))
    price: PriceConfig = Field(description="What the pool's tokens cost (per-tenant spend and the cost metric).")
    priority_scheduling: bool = Field(False, description=(
        "vLLM runs with `--scheduling-policy priority`: the gateway then sends `priority` per class."))
    ttft_slo_ms: float = Field(500, gt=0, description=(
        "Time-to-first-token objective: when even the best replica's projected TTFT is above it, the pool counts "
        "as saturated (spill)."))
    speculative: bool = Field(False, description=(
        "Override: vLLM runs with a `--speculative-config` (it then refuses min_p and logit_bias, unless "
        "unsupported_params says otherwise). Unset: each replica's /metrics says (vllm:spec_decode_* series), "
        "and a speculating replica's pool refuses min_p and logit_bias; a contradiction is logged once."))
    unsupported_params: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list, description=(
            "Top-level request fields this pool cannot serve, beyond what its engines' publishing implies; a "
            "request that sets one goes to a pool of its model that can. With speculative set, exactly this list "
            "(default: `min_p`, `logit_bias` on a speculative pool)."))
    admission: AdmissionConfig = Field(AdmissionConfig(), description=(
        "The fair admission queue in front of this pool: on by default while it serves more than one tenant; "
        "engages only while the pool is saturated."))
    load_report: LoadReportSettings = Field(LoadReportSettings(), description="vLLM's in-band load header (ORCA).")

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


class TelemetryConfig(StrictModel):
    """OpenTelemetry export."""

    otlp_endpoint: str | None = Field(None, description=(
        "OTLP/HTTP collector URL for traces and metrics; null: no export (Prometheus text at /metrics only)."))
    service_name: str = Field("kvgate", description="OTel `service.name`.")
    metric_export_interval_s: float = Field(15, gt=0, description="Interval of the OTLP metric export.")


class BreakerSettings(StrictModel):
    """Per-replica circuit breaker: open after `failures` in a row, cool down `open_s` (doubling to `max_open_s`)."""

    failures: int = Field(5, ge=1, description="Consecutive failures that open the breaker.")
    open_s: float = Field(2.0, gt=0, description="First cool-down.")
    max_open_s: float = Field(30.0, gt=0, description="Longest cool-down (it doubles while the replica keeps failing).")


class SpillSettings(StrictModel):
    """When the home pool counts as saturated, and when the other pool has room."""

    waiting_threshold: int = Field(1, ge=1, description=(
        "The home pool is saturated when every replica has at least this many requests queued."))
    headroom_below_utilization: float = Field(0.8, ge=0, le=1, description=(
        "A saturated interactive request may spill to the other pool when one of its replicas queues nothing and is "
        "below this utilization."))


def _load_bound_moved(data: Any) -> Any:
    if isinstance(data, dict) and "load_bound" in data:
        raise ValueError("load_bound: moved to pools.<p>.policy.load_bound (`policy: {type: prefix_affinity, "
                         "load_bound: …}`)")
    return data


class RoutingConfig(StrictModel):
    """Health probes, classification, spill between pools and the routing-wide services."""

    bulk_max_tokens_threshold: int = Field(2048, ge=1, description=(
        "A request asking for more output tokens than this is classified bulk."))
    probe_interval_s: float = Field(1.5, gt=0, description="Health probe and metrics scrape interval per replica.")
    probe_timeout_min_s: float = Field(1.0, gt=0, description=(
        "A probe gets two intervals, clamped to these: a busy engine answers /health late, and late is not dead."))
    probe_timeout_max_s: float = Field(5.0, gt=0, description="Upper clamp of the probe timeout.")
    healthy_after: int = Field(2, ge=1, description="Passing probes in a row before a replica takes traffic.")
    unhealthy_after: int = Field(2, ge=1, description="Failing probes in a row before a replica is taken out.")
    allow_spill: bool = Field(True, description=(
        "A request whose home pool is saturated may go to its model's other pool."))
    bulk_borrow_below_utilization: float = Field(0.3, ge=0, le=1, description=(
        "A bulk request whose pool is saturated may borrow the interactive pool while that pool's mean "
        "utilization is below this (and it is not saturated)."))
    breaker: BreakerSettings = Field(BreakerSettings(), description="Per-replica circuit breaker.")
    spill: SpillSettings = Field(SpillSettings(), description="When to spill to the other pool.")
    peer_load: PeerLoadSettings = Field(PeerLoadSettings(), description=(
        "Gateway processes sharing a store judge bounded load on one snapshot of all their requests."))
    sessions: SessionSettings = Field(SessionSettings(), description=(
        "A coding session stays on the replica that holds its history; new sessions balance the load "
        "(prefix_affinity and kv_events pools)."))
    response_ttl_s: float = Field(3600.0, gt=0, description=(
        "How long a response id → replica mapping is kept (vLLM's stored responses live in its process)."))
    prewarm: PrewarmConfig = Field(PrewarmConfig(), description=(
        "A joining replica replays the top prefixes before it takes traffic."))
    tpot: TpotSettings = Field(TpotSettings(), description="Interactive requests' pool by predicted TPOT.")

    @model_validator(mode="before")
    @classmethod
    def _no_load_bound(cls, data: Any) -> Any:
        return _load_bound_moved(data)


class NormalizeConfig(StrictModel):
    """Gateway-wide prompt normalization settings (each tenant opts in with `tenants[].normalize`)."""

    salt_secret: str = Field("kvgate-dev-secret", description=(
        "Secret mixed into each tenant's cache_salt; set `KVGATE_NORMALIZE__SALT_SECRET` in production."))
    memory_per_tenant: int = Field(256, ge=8, description=(
        "Span templates (hashes only) remembered per tenant, the least recently seen forgotten first."))
    share_learning: bool = Field(True, description=(
        "Learned volatility (template fingerprints only) kept in the store, so a new replica starts warm."))
    shared_refresh_s: float = Field(5.0, gt=0, description="How often the shared learning is read back.")


class GatewayConfig(BaseSettings):
    """The whole configuration: the YAML file's values, overridden by `KVGATE_<KEY>__<SUBKEY>` variables.

    Built by pydantic-settings from two sources (settings_customise_sources): the process environment
    (app/config/env.py: values of lists and objects as YAML or JSON) over the init values, which app/config.py
    fills from the YAML file. So a variable wins over the file, key by key (pydantic-settings' deep merge).
    """

    # An empty variable counts as unset (compose's `${VAR:-}`); `null` sets a key to none.
    model_config = SettingsConfigDict(
        env_prefix="KVGATE_", env_nested_delimiter="__", env_parse_none_str="null", env_ignore_empty=True,
        case_sensitive=False, extra="forbid", frozen=True,
    )

    listen: Listen = Field(Listen(), description="The listening socket and connection handling.")
    store: StoreConfig = Field(StoreConfig(), description="The shared store (Redis) or in-memory.")
    models: list[ModelConfig] = Field(min_length=1, description="The public models and the pools serving each.")
    pools: dict[str, PoolConfig] = Field(min_length=1, description="Pools of vLLM replicas, by name.")
    tenants: list[TenantConfig] = Field(default_factory=list, description="Who may call, and their limits.")
    auth: AuthConfig = Field(AuthConfig(), description="API keys.")
    telemetry: TelemetryConfig = Field(TelemetryConfig(), description="OpenTelemetry export.")
    upstream: UpstreamConfig = Field(UpstreamConfig(), description="Connections to the replicas.")
    routing: RoutingConfig = Field(RoutingConfig(), description="Health, classification, spill, routing services.")
    normalize: NormalizeConfig = Field(NormalizeConfig(), description="Prompt normalization, gateway-wide.")
    def model(self, name: str) -> ModelConfig | None:
        """The public model called `name`, if configured."""
        return self.models_by_name.get(name)

    @cached_property
    def models_by_name(self) -> dict[str, ModelConfig]:
        """The models indexed by name, built on first use: the path looks one up twice per request. A cached
        property lives in the instance's __dict__; a pydantic PrivateAttr is read through the model's
        __getattr__ (1.32 µs per `model()` call against 0.1 µs, 2026-12-03)."""
        return {m.name: m for m in self.models}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment over the file (the init values); no .env file, no secrets directory."""
        return YamlEnvSource(settings_cls), init_settings

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
                "or run one worker")
    return None


