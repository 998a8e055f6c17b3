"""Small routing facts with a lifetime (a response id → the replica that holds it), kept in process."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class Facts:
    """Each fact lives its `ttl_s`, however many others come: expired ones are dropped oldest first as new ones
    arrive (amortized O(1) per put), and an expired one reads as absent.

    Memory is what the lifetime holds: ~250 bytes per fact, so 100 Responses requests/s for the default
    `routing.response_ttl_s` (3600 s) keep ~90 MB, as a Redis store would. Before 2026-12-02 a cap of 100,000
    facts dropped the oldest early: past ~28 Responses requests/s, a response was no longer routable by id
    within its lifetime.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._items: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, name: str, value: str, ttl_s: float) -> None:
        """Keep `value` under `name` for `ttl_s` seconds."""
        items = self._items
        now = self._clock()
        # Insertion order is expiry order for one ttl (every response route has the same): the front is due first.
        while items:
            first = next(iter(items.values()))
            if first[1] > now:
                break
            items.popitem(last=False)
        items.pop(name, None)
        items[name] = (value, now + ttl_s)

    def get(self, name: str) -> str | None:
        """The value, while it lives."""
        hit = self._items.get(name)
        if hit is None:
            return None
        if hit[1] <= self._clock():
            del self._items[name]
            return None
        return hit[0]
