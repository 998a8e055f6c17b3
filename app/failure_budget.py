"""A budget of upstream failures per caller, so one caller cannot burn the pool for everyone.

Every request that ends in an upstream 5xx (its own, or a body two replicas failed the same way: see
app/attribution.py) takes one token from its tenant's bucket and one from its client's (the address within the
tenant: anonymous callers apart, and no tenant refused for another behind the same load balancer). A caller with
an empty bucket is refused with a 429 in its API's envelope, before any replica is picked, until the bucket
refills: a client sending 10 poisoned requests a second reaches the replicas about `refill_per_s` times a
second. Failures that are the replica's (connect errors, timeouts) take nothing: an outage must not turn
into refusals of the callers it hit. Buckets live in this process (the limit is on the damage one gateway
relays); only callers with recent failures hold one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from app.config.failure_budget import FailureBudgetConfig
from app.errors import GatewayError
from app.headers import RETRY_AFTER

# Buckets kept before full (recovered) ones are dropped: a bucket back at its burst says nothing.
MAX_BUCKETS = 10_000


class FailureBudget:
    """Token buckets of upstream failures, by tenant id and by client address."""

    __slots__ = ("_buckets", "_clock", "cfg")

    def __init__(self, cfg: FailureBudgetConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def check(self, tenant_id: str, client: str) -> None:
        """Raise the 429 when the tenant or the client has no failure left to spend."""
        if not self.cfg.enabled or not self._buckets:
            return
        now = self._clock()
        for key, burst in self._keys(tenant_id, client):
            tokens = self._level(key, burst, now)
            if tokens < 1:
                wait = math.ceil((1 - tokens) / self.cfg.refill_per_s)
                raise GatewayError(
                    429, "Too many of this caller's requests failed upstream; try again later.",
                    type="rate_limit_exceeded", code="failure_budget_exceeded",
                    headers={RETRY_AFTER: str(max(wait, 1))}, reason="failure_budget",
                )  # fmt: skip

    def charge(self, tenant_id: str, client: str) -> None:
        """One failure caused by this caller's request."""
        if not self.cfg.enabled:
            return
        now = self._clock()
        if len(self._buckets) >= MAX_BUCKETS:
            self._prune(now)
        for key, burst in self._keys(tenant_id, client):
            self._buckets[key] = (self._level(key, burst, now) - 1, now)

    def _keys(self, tenant_id: str, client: str) -> tuple[tuple[str, int], tuple[str, int]]:
        return (f"t:{tenant_id}", self.cfg.tenant_burst), (f"c:{tenant_id}:{client}", self.cfg.client_burst)

    def _level(self, key: str, burst: int, now: float) -> float:
        held = self._buckets.get(key)
        if held is None:
            return float(burst)
        tokens, at = held
        return min(float(burst), tokens + (now - at) * self.cfg.refill_per_s)

    def _prune(self, now: float) -> None:
        burst = max(self.cfg.tenant_burst, self.cfg.client_burst)
        full = [k for k, (tokens, at) in self._buckets.items() if tokens + (now - at) * self.cfg.refill_per_s >= burst]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= MAX_BUCKETS:  # a flood of addresses: forget them; tenants' buckets stay
            self._buckets = {k: v for k, v in self._buckets.items() if k.startswith("t:")}
