"""One replica's event source (where its KV events come from), its counters, and the stream state kept for it."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

PENDING_MAX = 10_000  # live batches held while a replay catches up


@dataclass(frozen=True, slots=True)
class EventSource:
    """Where one replica's events come from: its HTTP url (the routing key), PUB endpoint, replay, topic."""

    url: str
    endpoint: str
    replay: str | None = None
    topic: str = ""
    bind: bool | None = None  # None: a wildcard or ipc endpoint binds (subscriber_binds); True binds a concrete one

    @property
    def collector(self) -> bool:
        """True when we bind (the replica connects to us), as vLLM binds only wildcard endpoints."""
        return self.bind if self.bind is not None else subscriber_binds(self.endpoint)


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's own rule (ZmqEventPublisher._is_bind_endpoint): wildcard or ipc/inproc binds, the rest connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def subscriber_binds(endpoint: str) -> bool:
    """Whether the gateway binds `endpoint` as a collector: vLLM's rule, except that only `[::]` is an IPv6
    wildcard; any other address holding "::" (a discovered pod's `tcp://[fd00::7]:5557`) is a replica to dial."""
    if not endpoint.startswith("tcp://"):
        return is_bind_endpoint(endpoint)
    host = endpoint[len("tcp://") :].rpartition(":")[0]
    return "*" in host or host in ("[::]", "::")


@dataclass(slots=True)
class ReplicaStats:
    """Counters for one replica's event stream; the lead exports them as metrics."""

    batches: int = 0
    events: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    unrecoverable: int = 0
    restarts: int = 0
    decode_errors: int = 0
    skipped_events: int = 0
    duplicates: int = 0
    last_seq: int | None = None
    lag_s: float | None = None
    max_lag_s: float = 0.0
    not_whole_reason: str = "starting"
    # Tokens per block as the replica's BlockStored events say (vLLM fills it on every event); None before one.
    block_size: int | None = None


@dataclass(slots=True)
class _Stream:
    source: EventSource
    stats: ReplicaStats = field(default_factory=ReplicaStats)
    connected: bool = False
    exact: bool = False
    approx_since: float | None = None
    last_ts: float | None = None
    last_event_at: float | None = None
    owed_since: float | None = None
    replaying: bool = False
    replay_task: asyncio.Task[None] | None = None
    pending: deque[tuple[int, bytes]] = field(default_factory=lambda: deque(maxlen=PENDING_MAX))
    whole_cache: bool = False


