"""Which tenants a pool serves now: the fair queue engages by default only when there is more than one.

A pool that one tenant uses has nobody to be fair to: its queue stays a pass-through (no wait, no refusal:
vLLM's own queue orders that tenant's requests as it would without a gateway). A tenant counts as present
for `window_s` after its last request. Per request: one dict store and a length test; stale tenants are
dropped at each scrape (`prune`), so the table holds the tenants of the last window only.
"""

from __future__ import annotations


class ActiveTenants:
    """Tenants with a request in the last `window_s` seconds."""

    __slots__ = ("last", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.last: dict[str, float] = {}  # tenant -> its last request; the queue's fast path stores it directly

    def arrived(self, tenant: str, now: float) -> bool:
        """Record a request of `tenant`; whether the pool now serves more than one tenant."""
        self.last[tenant] = now
        return len(self.last) > 1

    def several(self) -> bool:
        """Whether more than one tenant is present."""
        return len(self.last) > 1

    def prune(self, now: float) -> None:
        """Forget tenants whose last request is older than the window."""
        cutoff = now - self.window_s
        if any(t < cutoff for t in self.last.values()):
            self.last = {k: t for k, t in self.last.items() if t >= cutoff}
