"""`upstream.failure_budget`: upstream failures a caller may cause (app/failure_budget.py).

Self-contained (no import of app.config) so UpstreamConfig mounts it with one line.
"""

from __future__ import annotations

from pydantic import Field

from app.config.types import StrictModel


class FailureBudgetConfig(StrictModel):
    """Upstream failures a caller may cause (a token bucket per tenant and per client address); past it, that
    caller's requests are refused (429 in their API's envelope) without touching a replica."""

    enabled: bool = Field(True, description="Refuse callers whose requests keep failing upstream.")
    tenant_burst: int = Field(20, ge=1, description="Failures one tenant may cause at once before refusals start.")
    client_burst: int = Field(10, ge=1, description="Failures one client address may cause at once.")
    refill_per_s: float = Field(1.0, gt=0, description="Failures per second each bucket regains.")
