"""Which tenants got less than their fair share of a capped pool lately: they start first.

The virtual token counter (app.admission.vtc) shares a saturated pool equally among the tenants waiting now,
and a tenant that becomes backlogged is lifted to the others' counter: it banks no credit. That is fair to two
floods, but not to a tenant whose demand is just under its share: on a pool of 4 sequences, a light tenant
needing 1.8 of them at random moments gets exactly 2 whenever it waits (utilization 0.9 of its share) and its
queue, once formed, drains at 0.2 requests/s — seconds of waiting (measured in experiments/admission_model.py:
light TTFT p99 2-6 s on 4 slots beside a flood).

So the queue also tracks each tenant's service over the last `window_s` (tokens started, decaying
exponentially, weighted): a tenant below its weighted share of the active tenants' total has the priority — its
next request starts at the next free slot, before any tenant above its share, whatever their counters say.
Over the window no tenant gets more than its share while another wants it (the one above it waits), and a
tenant under it is never queued behind one above it. A tenant's level never counts as less than half the
others' (weighted), so the credit it can bank by being idle is bounded. Recorded only while the pool is capped:
below saturation nothing here runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

CREDIT_FLOOR = 0.5  # of a tenant's weighted share of the others' level: the least its own level counts as


class RecentService:
    """Exponentially decayed tokens started per tenant (time constant `window_s`)."""

    __slots__ = ("_by", "_weight", "window_s")

    def __init__(self, window_s: float, weight: Callable[[str], float]) -> None:
        self.window_s = window_s
        self._weight = weight
        self._by: dict[str, tuple[float, float]] = {}  # tenant -> (decayed tokens, as of when)

    def add(self, tenant: str, tokens: float, now: float, active: Iterable[str] = ()) -> None:
        """`tokens` started for `tenant` at `now`. Its level counts as at least half its weighted share of what
        the `active` tenants got (the credit a tenant can bank — a newcomer, or one back from idle — is bounded:
        a flood arriving beside another catches up for a few seconds, not a whole window)."""
        level = self.level(tenant, now)
        total = total_w = 0.0
        for t in active:
            if t != tenant:
                total += self.level(t, now)
                total_w += self._weight(t)
        if total_w > 0:
            w = self._weight(tenant)
            level = max(level, CREDIT_FLOOR * total * w / total_w)
        self._by[tenant] = (level + tokens, now)

    def level(self, tenant: str, now: float) -> float:
        """The tenant's decayed tokens at `now` (not weighted)."""
        got = self._by.get(tenant)
        if got is None:
            return 0.0
        value, at = got
        return value * math.exp(-(now - at) / self.window_s) if now > at else value

    def below_share(self, tenant: str, active: Iterable[str], now: float) -> bool:
        """Whether `tenant` got less than its weighted share of what the `active` tenants (it among them) got."""
        total = total_w = 0.0
        for t in active:
            total += self.level(t, now)
            total_w += self._weight(t)
        w = self._weight(tenant)
        return total_w > w and self.level(tenant, now) * total_w < total * w

    def forget(self, now: float, floor: float = 1.0) -> None:
        """Drop tenants whose decayed service fell under `floor` tokens (idle for many windows)."""
        gone = [t for t in self._by if self.level(t, now) < floor]
        for t in gone:
            del self._by[t]
