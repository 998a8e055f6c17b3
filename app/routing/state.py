"""Pool state: what the router knows about each replica. Scrapers and the upstream stage write it; pick reads.

Everything runs on one event loop, so plain attributes need no locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, get_args

from app.config import GatewayConfig, PoolConfig
from app.errors import FailureKind
from app.routing import promtext as m
from app.routing.breaker import BreakerConfig, CircuitBreaker
from app.routing.engine_info import EngineInfo
from app.routing.hashing import stable_hash64
from app.routing.kv_events import BlockView
from app.routing.load_report import LoadReport
from app.routing.policy import Policy
from app.routing.registry import PolicyDefaults, build_policy
from app.routing.session_table import SessionTable, session_table

# Weight of one new TTFT observation in the moving average (≈ the last 5-10 requests dominate).
TTFT_ALPHA = 0.2
IDLE_TTFT_DECAY = 0.5
MIN_TTFT_S = 0.001  # below this the estimate is dropped: "unknown", i.e. not over any SLO


ReplicaStatus = Literal["serving", "warming", "breaker_open", "breaker_half_open", "unhealthy", "joining"]
REPLICA_STATUSES: tuple[ReplicaStatus, ...] = get_args(ReplicaStatus)


class ReplicaState:
    """One vLLM replica: health, the gateway's own in-flight count, the last scrape, its breaker."""

    __slots__ = (
        "bad_streak",
        "breaker",
        "capacity",
        "counters",
        "engine",
        "engine_read",
        "external",
        "good_streak",
        "hash",
        "healthy",
        "in_flight",
        "in_flight_at_scrape",
        "in_rotation",
        "index",
        "kv_usage",
        "last_error",
        "last_scrape",
        "load_report_at",
        "load_reports",
        "load_reports_unparsable",
        "pool",
        "probed",
        "running",
        "shared_load",
        "ttft_ewma_s",
        "url",
        "waiting",
        "warming",
    )

    def __init__(
        self, url: str, pool: str = "", index: int = 0, breaker: CircuitBreaker | None = None, capacity: int = 0
    ) -> None:
        self.url = url
        # Sequences the engine runs at once (--max-num-seqs); 0 = unknown. Beyond it requests queue.
        self.capacity = capacity
        self.pool = pool
        self.index = index
        self.hash = stable_hash64(url.encode())
        # Optimistic until the first probe says otherwise: the gateway serves from its first second.
        self.healthy = True
        self.probed = False
        self.good_streak = 0
        self.bad_streak = 0
        self.in_flight = 0
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.in_flight_at_scrape = 0
        # Requests the last scrape saw beyond our own in-flight ones: other clients' (kept current so
        # load() is one addition; pick reads it for every candidate of every request).
        self.external = 0
        # Every gateway process's in-flight requests here as published in the last round, the same number in
        # each of them (app/routing/peer_load.py); -1 while there is no such snapshot (no peers, store down).
        self.shared_load = -1
        self.last_scrape = 0.0
        # When the last in-band load report (a reply's endpoint-load-metrics header) arrived; a scrape asked
        # before it is older than it, and leaves the load it set alone.
        self.load_report_at = 0.0
        self.load_reports = 0  # in-band reports applied
        self.load_reports_unparsable = 0
        self.counters: dict[str, float] = {}  # the last scrape's counters, for per-interval deltas
        self.ttft_ewma_s: float | None = None
        self.last_error: str | None = None
        self.breaker = breaker or CircuitBreaker()
        # What the engine publishes about itself (app/routing/engine_info.py), replaced whole by the scraper;
        # engine_read: /v1/models and /version were read since the replica last became healthy.
        self.engine = EngineInfo()
        self.engine_read = False
        # healthy and breaker closed, kept current by every method that changes either; a replica that
        # is healthy with a non-closed breaker is still checked with breaker.allows() (time-based).
        self.in_rotation = True
        # Held out of rotation while app/prewarm replays prefixes to it (healthy, but not taking its share yet).
        self.warming = False

    def __repr__(self) -> str:
        return f"ReplicaState({self.url!r}, load={self.load()}, healthy={self.healthy})"

    # --- read by pick -------------------------------------------------------------------------------

    def load(self) -> int:
        """Requests on the replica: our in-flight count (exact, current) plus what the last scrape saw
        beyond it (other clients; up to one interval old). Equivalently: the scrape's running+waiting
        moved by our in-flight change since, never below our own count."""
        return self.in_flight + self.external

    def available(self) -> bool:
        """In rotation: healthy by probes and the breaker lets a request through."""
        return self.in_rotation or (self.healthy and not self.warming and self.breaker.allows())

    def queued(self) -> int:
        """Requests waiting now: the scraped queue, moved by our in-flight change when it was queueing.

        A replica that queued at the scrape queues every request we sent since; one that did not may
        have had free slots, so our new requests are not assumed to wait — unless they exceed its known
        capacity (max_num_seqs), which a burst between two scrapes does.
        """
        q = self.waiting + self.in_flight - self.in_flight_at_scrape if self.waiting > 0 else 0
        if self.capacity:
            # A burst between scrapes: what we sent beyond the engine's slots queues, whatever the scrape said.
            over = self.in_flight + self.external - self.capacity
            if over > q:
                q = over
        return q if q > 0 else 0

    def utilization(self) -> float:
        """0-1: KV-cache usage, or 1 when requests already queue."""
        return 1.0 if self.queued() > 0 else self.kv_usage

    def projected_ttft_ms(self) -> float:
        """A new request's TTFT if it lands here: recent TTFT scaled by the queue ahead (0 when unknown)."""
        if self.ttft_ewma_s is None:
            return 0.0
        return self.ttft_ewma_s * 1000.0 * (1.0 + self.queued() / max(self.running, 1))

    # --- written by the upstream stage --------------------------------------------------------------

    def on_start(self) -> None:
        """A request was sent to this replica."""
        self.in_flight += 1
        self.breaker.on_attempt()
        self._refresh()

    def on_success(self) -> None:
        """The replica answered (any status that is not its fault, 4xx included)."""
        self.in_flight = max(self.in_flight - 1, 0)
        self.breaker.record_success()
        self._refresh()

    def on_failure(self, kind: FailureKind) -> None:
        """The replica failed the request: connect error, timeout, 5xx, broken protocol."""
        self.in_flight = max(self.in_flight - 1, 0)
        self.last_error = kind
        self.breaker.record_failure()
        self._refresh()

    def on_release(self) -> None:
        """The request ended without a verdict on the replica (client disconnected, cancelled)."""
        self.in_flight = max(self.in_flight - 1, 0)
        self.breaker.release()
        self._refresh()

    def on_first_token(self, seconds: float) -> None:
        """The gateway measured a TTFT on this replica."""
        self._observe_ttft(seconds)

    # --- written by the scraper ---------------------------------------------------------------------

    def apply_probe(self, ok: bool, healthy_after: int, unhealthy_after: int) -> None:
        """Record one /health result; health flips only after enough consecutive agreeing probes."""
        if ok:
            self.good_streak += 1
            self.bad_streak = 0
            if not self.healthy and (self.good_streak >= healthy_after or not self.probed):
                self.healthy = True
        else:
            self.bad_streak += 1
            self.good_streak = 0
            # Before any probe the optimistic default is a guess: the first bad answer ends it.
            if self.healthy and (self.bad_streak >= unhealthy_after or not self.probed):
                self.healthy = False
            self.clear_metrics()
        self.probed = True
        self._refresh()

    def apply_metrics(self, sample: Mapping[str, float], now: float, asked_at: float | None = None) -> None:
        """Record one /metrics scrape (series as parse_metrics returns them), asked at `asked_at` (default now).

        An in-band load report that arrived after the scrape was asked is the newer reading of the engine's
        queue and KV: its load stands, and the scrape only adds its counters.
        """
        if (now if asked_at is None else asked_at) >= self.load_report_at:
            self.running = int(sample.get(m.RUNNING, 0.0))
            self.waiting = int(sample.get(m.WAITING, 0.0))
            self.kv_usage = min(max(sample.get(m.KV_USAGE, 0.0), 0.0), 1.0)
            self.in_flight_at_scrape = self.in_flight
            self.external = max(self.running + self.waiting - self.in_flight, 0)
        prev = self.counters
        ttft_sum = self._delta(prev, sample, m.TTFT_SUM)
        ttft_count = self._delta(prev, sample, m.TTFT_COUNT)
        if ttft_sum is not None and ttft_count:
            self._observe_ttft(ttft_sum / ttft_count)
        elif self.ttft_ewma_s is not None and self.running == 0 and self.waiting == 0 and self.in_flight == 0:
            # Idle and nothing new measured: an idle replica answers faster than its busy past, so the
            # estimate relaxes (halves per idle scrape). Without this a pool whose traffic all spilled
            # away would keep its bad TTFT, and keep spilling, forever.
            halved = self.ttft_ewma_s * IDLE_TTFT_DECAY
            self.ttft_ewma_s = halved if halved >= MIN_TTFT_S else None
        self.counters = {k: v for k, v in sample.items() if k in m.COUNTERS}
        self.last_scrape = now

    def apply_load_report(self, report: LoadReport, now: float) -> None:
        """Record vLLM's in-band load report (engine queue, KV usage) that a reply brought at `now`.

        vLLM builds it after the request finished, and the upstream stage applies it after that request's
        lease ended, so neither side counts that request. It reports no running count: a queueing engine runs
        its `capacity` slots; one that does not queue holds at most its free slots beyond ours.
        """
        waiting = report.waiting
        if report.kv_usage is not None:
            self.kv_usage = report.kv_usage
        if waiting is not None:
            self.waiting = waiting
            self.in_flight_at_scrape = self.in_flight
            cap = self.capacity
            if waiting > 0:
                if cap:
                    self.running = cap
                self.external = max(self.running + waiting - self.in_flight, 0)
            elif cap:
                self.external = min(self.external, max(cap - self.in_flight, 0))
        self.load_report_at = now
        self.load_reports += 1

    def clear_metrics(self) -> None:
        """Forget scraped load (stale or unreachable): fall back to the gateway's own in-flight count."""
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.in_flight_at_scrape = self.in_flight
        self.external = 0
        self.load_report_at = 0.0

    def status(self) -> ReplicaStatus:
        """What the replica is to routing now, as /metrics counts it."""
        if not self.healthy:
            return "unhealthy" if self.probed else "joining"  # joining: discovered, its first probe not yet good
        if self.warming:
            return "warming"
        if self.breaker.state != "closed":
            return "breaker_open" if self.breaker.state == "open" else "breaker_half_open"
        return "serving"

    def set_warming(self, warming: bool) -> None:
        """Hold the replica out of rotation while it is pre-warmed, or let it take its share."""
        self.warming = warming
        self._refresh()

    def _refresh(self) -> None:
        self.in_rotation = self.healthy and not self.warming and self.breaker.state == "closed"

    @staticmethod
    def _delta(prev: Mapping[str, float], cur: Mapping[str, float], name: str) -> float | None:
        # None on the first scrape, a missing series, or a counter reset (the replica restarted).
        if name not in prev or name not in cur:
            return None
        d = cur[name] - prev[name]
        return d if d >= 0 else None

    def _observe_ttft(self, seconds: float) -> None:
        if seconds < 0:
            return
        ewma = self.ttft_ewma_s
        self.ttft_ewma_s = seconds if ewma is None else ewma + TTFT_ALPHA * (seconds - ewma)


class PoolState:
    """A pool: its config, replicas (in config order) and its routing policy instance."""

    __slots__ = ("cfg", "name", "policy", "replicas", "sessions", "unsupported_params")

    def __init__(self, name: str, cfg: PoolConfig, replicas: list[ReplicaState], policy: Policy,
                 sessions: SessionTable | None = None) -> None:  # fmt: skip
        self.name = name
        self.cfg = cfg
        self.replicas = replicas
        self.policy = policy
        self.sessions = sessions  # app/routing/sessions.py; None: this pool routes requests, not sessions
        # Request fields the pool refuses: the config's when it says (unsupported_params or speculative), else
        # what its replicas publish (app/routing/engine_read.py keeps it current); read by capability routing.
        self.unsupported_params: tuple[str, ...] = ()
        self.refresh_capabilities()

    def declares_capabilities(self) -> bool:
        """Whether the config says whether the pool speculates (`speculative` set): an override of its engines."""
        return "speculative" in self.cfg.model_fields_set

    def refresh_capabilities(self) -> None:
        """Recompute what the pool refuses: the config's `unsupported_params`, plus, unless the config says
        `speculative`, every field a replica's engine refuses by what it publishes."""
        refused = dict.fromkeys(self.cfg.unsupported_params)
        if not self.declares_capabilities():
            refused.update(dict.fromkeys(p for r in self.replicas for p in r.engine.unsupported_params()))
        self.unsupported_params = tuple(refused)

    def candidates(self, exclude: frozenset[str] = frozenset()) -> list[ReplicaState]:
        """Replicas in rotation, minus those already tried."""
        # available(), inlined: this runs on every request.
        if exclude:
            return [
                r
                for r in self.replicas
                if (r.in_rotation or (r.healthy and not r.warming and r.breaker.allows())) and r.url not in exclude
            ]
        return [r for r in self.replicas if r.in_rotation or (r.healthy and not r.warming and r.breaker.allows())]


class ClusterState:
    """All pools by name, built from the config; the one object scrapers write and pick reads."""

    __slots__ = ("memo", "peer_clock", "pools")

    def __init__(self, pools: dict[str, PoolState]) -> None:
        self.pools = pools
        # Called by pick before a policy reads `shared_load`: brings the load snapshot due at this instant into
        # force (app/routing/peer_load.py) and returns the route header's stamp (or None); None without sharing.
        self.peer_clock: Callable[[], str | None] | None = None
        # Per-(model, class) lookups that only depend on the config this state was built from.
        self.memo: dict[Any, Any] = {}

    @classmethod
    def from_config(
        cls,
        cfg: GatewayConfig,
        previous: ClusterState | None = None,
        *,
        breaker: BreakerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        kv_hub: BlockView | None = None,
        probe_before_joining: bool = False,
    ) -> ClusterState:
        """Build the state; `previous` lets surviving replicas keep their counts and health across a rebuild.

        With `probe_before_joining`, a replica not in `previous` (a discovered one) is out of rotation until its
        first good probe, instead of optimistically in.
        """
        old = {(r.pool, r.url): r for r in previous.replicas()} if previous is not None else {}
        b = cfg.routing.breaker
        breaker = breaker or BreakerConfig(failures=b.failures, open_s=b.open_s, max_open_s=b.max_open_s)
        defaults = PolicyDefaults(kv_hub=kv_hub)
        pools: dict[str, PoolState] = {}
        for name, pcfg in cfg.pools.items():
            replicas = []
            for i, url in enumerate(pcfg.replicas):
                rep = old.get((name, url))
                if rep is None:
                    rep = ReplicaState(url, name, i, CircuitBreaker(breaker, clock))
                    if probe_before_joining:
                        rep.healthy = rep.in_rotation = False
                rep.index = i
                rep.capacity = pcfg.max_num_seqs or rep.engine.max_num_seqs or 0
                replicas.append(rep)
            policy = build_policy(pcfg.effective_policy(), defaults)
            before = previous.pools.get(name) if previous is not None else None
            kept = session_table(cfg.routing.sessions, policy.name, before.sessions if before is not None else None)
            pools[name] = PoolState(name, pcfg, replicas, policy, kept)
        state = cls(pools)
        state.peer_clock = previous.peer_clock if previous is not None else None
        return state

    def rebuild(self, cfg: GatewayConfig, **kwargs: Any) -> None:
        """Take the pools of a fresh build from `cfg` in place (survivors keep their state, see from_config), so
        every part holding this state (dispatcher, scraper, pre-warmer, queues) sees the new replicas."""
        fresh = ClusterState.from_config(cfg, self, **kwargs)
        self.pools = fresh.pools
        self.memo = fresh.memo

    def replicas(self) -> Iterator[ReplicaState]:
        """Every replica of every pool."""
        for pool in self.pools.values():
            yield from pool.replicas
