"""Is a pool saturated? From each replica's scraped engine queue and KV usage, and the gateway's in-flight tokens.

A pool is saturated when every replica in rotation is: the router would have nowhere to send a request that
starts at once, so it would wait in an engine queue, which vLLM serves first-come first-served (or by a static
priority). Waiting in the gateway instead costs nothing in throughput and lets the wait be shared fairly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from app.config.admission import AdmissionConfig

SaturationReason = Literal["waiting", "kv_usage", "in_flight_tokens"]


class ReplicaLoad(Protocol):
    """What saturation reads of a replica (app.routing.state.ReplicaState satisfies it); read-only."""

    @property
    def waiting(self) -> int:
        """vllm:num_requests_waiting at the last scrape."""
        ...

    @property
    def running(self) -> int:
        """vllm:num_requests_running at the last scrape."""
        ...

    @property
    def kv_usage(self) -> float:
        """vllm:kv_cache_usage_perc at the last scrape (0-1)."""
        ...

    @property
    def in_flight(self) -> int:
        """The gateway's requests on the replica now."""
        ...

    @property
    def capacity(self) -> int:
        """Sequences the engine runs at once (the pool's max_num_seqs), 0 when unknown."""
        ...

    def queued(self) -> int:
        """Requests waiting in the engine now: the scraped queue moved by the gateway's sends since."""
        ...


@dataclass(frozen=True, slots=True)
class Saturation:
    """One verdict on a pool."""

    saturated: bool
    reason: SaturationReason | None
    replicas: int  # replicas considered
    saturated_replicas: int
    # Requests waiting in the engines beyond max_waiting_per_replica, summed: how far past the threshold.
    excess: int
    queued: int = 0  # requests waiting in the engines, summed
    running: int = 0  # requests running in the engines, summed
    # Every replica was full (queueing or KV at the threshold): `running` is then the pool's capacity.
    full: bool = False
    slots: int = 0  # the replicas' configured sequence slots, summed; 0 unless every replica declares them

    @property
    def replicas_saturated(self) -> bool:
        """Every replica is saturated (the engines' verdict, without the gateway's own token cap)."""
        return self.replicas > 0 and self.saturated_replicas == self.replicas


def replica_saturation(replica: ReplicaLoad, cfg: AdmissionConfig) -> SaturationReason | None:
    """Why this replica cannot start another request at once, or None when it can."""
    if replica.queued() >= cfg.max_waiting_per_replica:
        return "waiting"
    if replica.kv_usage >= cfg.kv_usage_threshold:
        return "kv_usage"
    return None


def assess(replicas: Iterable[ReplicaLoad], cfg: AdmissionConfig, in_flight_tokens: int = 0) -> Saturation:
    """The pool's verdict over its replicas in rotation; none in rotation is not saturated (queueing won't help)."""
    n = saturated = excess = queued = running = full = slots = 0
    declared = True
    reason: SaturationReason | None = None
    for r in replicas:
        n += 1
        q = r.queued()
        queued += q
        running += r.running
        slots += r.capacity
        declared = declared and r.capacity > 0
        if r.waiting > 0 or r.kv_usage >= cfg.kv_usage_threshold:
            full += 1
        why = replica_saturation(r, cfg)
        if why is None:
            continue
        saturated += 1
        reason = reason or why
        over = q - cfg.max_waiting_per_replica
        if over > 0:
            excess += over
    all_saturated = n > 0 and saturated == n
    if not all_saturated:
        reason = None
    cap = cfg.max_in_flight_tokens
    if reason is None and cap is not None and in_flight_tokens >= cap:
        reason = "in_flight_tokens"
    return Saturation(reason is not None, reason, n, saturated, excess, queued, running, n > 0 and full == n,
                      slots if declared else 0)  # fmt: skip
