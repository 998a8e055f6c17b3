"""Small routing facts with a lifetime (a response id → the replica that holds it), kept in process."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

MAX_FACTS = 100_000


class Facts:
    """Bounded: past `cap` entries the oldest goes first; an expired entry reads as absent."""

    def __init__(self, cap: int = MAX_FACTS, clock: Callable[[], float] = time.monotonic) -> None:
        self._cap = cap
        self._clock = clock
        self._items: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, name: str, value: str, ttl_s: float) -> None:
        """Keep `value` under `name` for `ttl_s` seconds."""
        items = self._items
        items.pop(name, None)
        items[name] = (value, self._clock() + ttl_s)
        while len(items) > self._cap:
            items.popitem(last=False)

    def get(self, name: str) -> str | None:
        """The value, while it lives."""
        hit = self._items.get(name)
        if hit is None:
            return None
        if hit[1] <= self._clock():
            del self._items[name]
            return None
        return hit[0]
