"""The record one request carries down the pipeline: each stage reads what earlier stages wrote."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.config.tenants import LimitsConfig, ReferencePrice
from app.config.types import NormalizeMode, RouteClassName
from app.prompt import PromptView
from app.records import CallEstimate, Operation, PickedReplica, RoutePrediction, Timing, TokenPrices, Usage
from app.store.base import LimitReason, LimitSpec

if TYPE_CHECKING:
    from app.queue_ticket import Ticket
    from app.records import PromptBlocks
    from app.surfaces.base import Surface

RouteClass = RouteClassName

# What a tenant built without config gets: no limits, and the default reference price.
_NO_LIMITS = LimitsConfig()
_UNLIMITED = LimitSpec()
_REFERENCE = ReferencePrice()
_DEFAULT_REFERENCE_PRICES = TokenPrices.per_million(
    _REFERENCE.input_per_m, _REFERENCE.cached_input_per_m, _REFERENCE.output_per_m
)


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who pays for the request (resolved from the API key)."""

    id: str
    default_class: RouteClass | None = None
    normalize: NormalizeMode = "off"
    normalize_rules: frozenset[str] | None = None
    capture_content: bool = False
    shared_cache: bool = False
    # The salt its requests carry to vLLM (None: it opted into the shared cache), computed once when the
    # registry builds the tenant (an HMAC per request is measurable).
    cache_salt: str | None = None
    # Its limits (the config, and the spec the store enforces) and the per-token price its savings are measured
    # against, also resolved once when the registry builds the tenant: the limits and settle stages read them
    # here instead of looking the tenant up again per request.
    limits: LimitsConfig = _NO_LIMITS
    limit_spec: LimitSpec = _UNLIMITED
    reference_prices: TokenPrices = _DEFAULT_REFERENCE_PRICES


@dataclass(frozen=True, slots=True)
class NormalizeReport:
    """What normalization did (or would do, in observe mode): rule names and counts, never values."""

    mode: NormalizeMode
    moved: dict[str, int] = field(default_factory=dict)  # rule name -> spans moved
    tools_canonicalized: int = 0
    date_pinned: bool = False
    applied: bool = False
    to_head: int = 0  # of the moved spans, how many went to the head of the first user turn (per session/day)

    @property
    def moved_total(self) -> int:
        """Number of spans moved across all rules."""
        return sum(self.moved.values())

    def header(self) -> str:
        """The `x-kvgate-normalized` header value."""
        if self.mode == "off":
            return "off"
        if not self.moved and not self.to_head and not self.tools_canonicalized and not self.date_pinned:
            return f"{self.mode};moved=0"  # what nearly every request says: no sort, join or list for it
        rules = ",".join(f"{k}:{v}" for k, v in sorted(self.moved.items()))
        parts = [self.mode, f"moved={self.moved_total}"]
        if rules:
            parts.append(f"rules={rules}")
        if self.to_head:
            parts.append(f"head={self.to_head}")
        if self.tools_canonicalized:
            parts.append(f"tools={self.tools_canonicalized}")
        if self.date_pinned:
            parts.append("date_pinned")
        return ";".join(parts)


@dataclass(frozen=True, slots=True)
class ClassDecision:
    """The latency class and the rule that chose it."""

    route_class: RouteClass
    reason: str  # header | service_tier | tenant_default | stream | n | max_tokens | default | degraded


@dataclass(slots=True)
class RouteDecision:
    """Where the request goes: pool, replica (its URL, and the state the dispatcher leases), and why."""

    pool: str
    replica: str
    policy: str
    reason: str
    runner_up: str | None = None
    spilled: bool = False
    priority: int | None = None
    attempt: int = 1
    detail: str = ""  # why it left the home pool (spill/failover), for the span
    target: PickedReplica | None = None  # set by pick (a ReplicaState); None only in records built outside routing
    cached_tokens: int | None = None  # prompt tokens the replica is predicted to reuse (kv_events)
    load_stamp: str | None = None  # which shared load snapshot decided, when routing.peer_load.route_header is on
    session: str | None = None  # what named the session that decided (header, prompt_cache_key, metadata, history)
    prediction: RoutePrediction | None = None  # the predicted times that chose the pool (app/routing/tpot), if they did

    def suffix(self) -> str:
        """The route header's tail: which session key decided, which load snapshot, the predictions that chose
        the pool."""
        out = f";session={self.session}" if self.session else ""
        out += f";{self.load_stamp}" if self.load_stamp else ""
        return out + self.prediction.header() if self.prediction is not None else out


@dataclass(slots=True)
class Admission:
    """What the limits stage granted; settle hands it back to release and reconcile."""

    tenant: Tenant  # the record tenancy resolved: its limits are the ones this admission was checked against
    lease_id: str  # also the spend record's id
    lease_taken: bool = False
    tokens_reserved: int = 0
    enforced: bool = True  # False: the store was unreachable and fail_mode is open
    degraded: LimitReason | None = None  # over a limit, served degraded (bulk, capped max_tokens)
    # The post-pick correction of tokens_reserved still on its way to the store (settle waits for it).
    correction: asyncio.Task[None] | None = None
    # A stream's lease renewal (a stream may outlive the lease): cancelled by settle.
    renewal: asyncio.Task[None] | None = None

    @property
    def tenant_id(self) -> str:
        """The admitted tenant's id."""
        return self.tenant.id

    @property
    def spec(self) -> LimitSpec:
        """The limits the store enforces for this admission (the tenant's, built once with it)."""
        return self.tenant.limit_spec


@dataclass(slots=True)
class RequestContext:
    """Everything known about one request; created by the api stage, completed by settle."""

    request_id: str
    surface: Surface
    path: str
    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    headers: dict[str, str]
    prompt: PromptView = field(default_factory=PromptView)
    timing: Timing = field(default_factory=Timing)
    tenant: Tenant | None = None
    estimated_input_tokens: int = 0
    limit_notes: list[str] = field(default_factory=list)
    normalize_report: NormalizeReport | None = None
    cache_salt: str | None = None
    route_class: ClassDecision | None = None
    route: RouteDecision | None = None
    usage: Usage = field(default_factory=Usage)
    status: int = 0
    error_type: str | None = None
    response_id: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    cost_usd: float = 0.0
    savings_usd: float = 0.0
    admission: Admission | None = None
    # The prompt's routing key (app/prefix_key.py), set just before pick.
    routing_key: int = 0
    # The prompt's exact KV block hashes, when a pool of the model routes on KV events.
    blocks: PromptBlocks | None = None
    # What the request is predicted to use on its picked replica (app/call_estimate.py), set after pick.
    call_estimate: CallEstimate | None = None
    # (pool, replica URL) the request must go to: it continues a response stored there.
    pinned: tuple[str, str] | None = None
    settled: bool = False
    # Mid-stream migration: how many times the stream moved, each outcome (a metric label), replicas left.
    migrations: int = 0
    migration_outcomes: list[str] = field(default_factory=list)
    migration_failed: set[str] = field(default_factory=set)
    # Usage was not reported by the upstream (a cut stream): billed from the estimate and what was relayed.
    usage_estimated: bool = False
    # Whether an upstream call was made at all (telemetry tells rejections from upstream failures).
    upstream_called: bool = False
    # SSE events of the stream that carried generated content (one per engine step): tokens per step (app/routing/tpot).
    stream_events: int = 0
    # The pool's admission slot (app/admission), held from admission until settle releases it once.
    queue_ticket: Ticket | None = None
    # Reads back the assistant message the client got, once it was sent (reply learning, app/kvcache/replies).
    reply: Callable[[], dict[str, Any] | None] | None = None
    client: str = ""  # the client's address: its share of the upstream failure budget (app/failure_budget.py)

    @property
    def operation(self) -> Operation:
        """The GenAI operation name (chat, text_completion, embeddings)."""
        return self.surface.operation

    @property
    def tenant_id(self) -> str:
        """The paying tenant's id ("anonymous" before tenancy ran)."""
        return self.tenant.id if self.tenant is not None else "anonymous"
