"""The `upstream` block: connections to the replicas, timeouts, sizes, retries, mid-stream migration."""

from __future__ import annotations

from pydantic import Field

from app.config.failure_budget import FailureBudgetConfig
from app.config.types import StrictModel


class BackoffConfig(StrictModel):
    """Between failover attempts: uniform in [0, min(cap_s, base_s * 2^(n-1))] (full jitter)."""

    base_s: float = Field(0.05, ge=0, description="Backoff of the first retry.")
    cap_s: float = Field(1.0, ge=0, description="Longest backoff.")


class UpstreamConfig(StrictModel):
    """Connections to the replicas: timeouts, sizes, retries."""

    connect_timeout_s: float = Field(5.0, gt=0, description="TCP connect timeout to a replica.")
    read_timeout_s: float = Field(300.0, gt=0, description="Longest wait for the next bytes of a replica's response.")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 beyond).")
    max_connections_per_replica: int = Field(512, ge=1, description="Connection pool size per replica.")
    retries: int = Field(2, ge=0, le=5, description="Failover attempts on other replicas before the first byte.")
    keepalive_timeout_s: float = Field(30.0, gt=0, description="An idle upstream connection is closed after this.")
    backoff: BackoffConfig = Field(BackoffConfig(), description="Pause between failover attempts.")
    max_migrations: int = Field(1, ge=0, le=3, description=(
        "A chat stream whose replica fails midway continues on another replica this many times (0: never)."))
    idle_timeout_s: float = Field(60.0, gt=0, description=(
        "A stream whose replica sends nothing this long (a hung replica) fails that attempt: it migrates, or the "
        "request is retried; a whole-body request's replica is checked this often for being out of rotation."))
    failure_budget: FailureBudgetConfig = Field(FailureBudgetConfig(), description="Upstream failures per caller.")
