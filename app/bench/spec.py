"""What a bench run is asked to do, and what one request measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Arrival = Literal["closed", "poisson"]


@dataclass(frozen=True, slots=True)
class Pricing:
    """GPU price (the operator's reckoning) and a reference cloud price for savings, all in USD."""

    gpu_hour_usd: float | None = None
    gpus: int = 1
    # Explicit per-M prices of the pool, when the config gives them instead of a GPU price.
    input_per_m: float | None = None
    cached_input_per_m: float | None = None
    output_per_m: float | None = None
    reference_input_per_m: float = 3.00
    reference_cached_input_per_m: float = 0.30
    reference_output_per_m: float = 15.00


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """One bench run: target, workload, load shape, bounds, SLOs and prices."""

    base_url: str
    # Further gateway processes: session i goes to URL i mod n of (base_url, *these) for all its turns, as a load
    # balancer in front of several gateways keeps a client on one.
    more_base_urls: tuple[str, ...] = ()
    workload: str = "chat"
    api: str = "chat"  # chat | responses | messages: which API carries the workload (app/bench/apis.py)
    model: str | None = None  # None: the first id from GET /v1/models
    api_key: str | None = None
    api_keys: tuple[str, ...] = ()
    tenants: int = 1
    concurrency: int = 8
    rate: float | None = None  # requests/s, Poisson arrivals; None = closed loop at `concurrency`
    requests: int | None = None
    # Requests sent first and left out of the summary (on top of `requests`): a closed loop starts with
    # `concurrency` requests at once, a cold-cache burst that is not the steady state.
    warmup: int = 0
    duration_s: float | None = None
    seed: int = 0
    max_tokens: int | None = None  # None: the workload's default
    mixed_ratio: float = 0.8  # share of interactive sessions in the mixed workload
    class_header: str = "x-kvgate-class"
    tool_choice: str = "none"  # agent workloads: none | auto | omit
    prompt_tokens: int = 256  # synthetic: prompt length in tokens
    tokenizer: str | None = None  # synthetic: tokenizer.json (or its folder) that sizes prompts exactly
    stream: bool = True
    timeout_s: float = 300.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    pricing: Pricing = field(default_factory=Pricing)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request (e.g. ignore_eos)
    # The target's clock runs this many times faster than real time (kvgate sim --time-scale): reported
    # durations are converted back to the target's modeled time.
    time_scale: float = 1.0
    progress: bool = False
    max_inflight: int = 4096  # open-loop safety bound

    @property
    def arrival(self) -> Arrival:
        """Closed loop (fixed concurrency) or open loop (Poisson at `rate`)."""
        return "closed" if self.rate is None else "poisson"

    def request_bound(self) -> int | None:
        """How many requests to send: explicit, else unbounded by count if a duration is set, else a default."""
        if self.requests is not None:
            return self.requests + self.warmup
        if self.duration_s is not None:
            return None
        return max(50, 4 * self.concurrency) + self.warmup

    def public_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready data, API keys left out."""
        d = asdict(self)
        d.pop("api_key", None)
        d.pop("api_keys", None)
        d["api_key_count"] = len(self.api_keys) or (1 if self.api_key else 0)
        return d


@dataclass(slots=True)
class RequestRecord:
    """What one request measured; times are seconds, `start_s` relative to the run's start."""

    index: int
    session: int
    turn: int
    tenant: int
    route_class: str
    start_s: float = 0.0
    ok: bool = False
    status: int = 0
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    usage_reported: bool = False
    token_chunks: int = 0
    warmup: bool = False  # sent during warm-up: kept in the records, left out of the summary
    cost_usd: float | None = None  # what a kvgate gateway billed it (x-kvgate-cost-usd, or a stream's trailer)
    route: str | None = None  # a kvgate gateway's x-kvgate-route (which pool, and what decided)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return asdict(self)
