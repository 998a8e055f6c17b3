"""Virtual token counter: which waiting request starts next, so that backlogged tenants get equal service.

Sheng et al., "Fairness in Serving Large Language Models" (OSDI'24), as in llm-d's and AIBrix's VTC: every
tenant has a counter of the service it received, in tokens divided by its weight; the backlogged tenant with
the lowest counter goes next and is charged its request's cost (the gateway charges uncached prompt + predicted
output at start and corrects with the actual count at settle). A tenant that becomes backlogged has its counter
lifted to the lowest counter of those already backlogged (or, when none is, to the counter of the last one that
left): idle time earns no credit to spend later in a burst. With two tenants backlogged the whole time, their
weighted service differs by at most the largest single request cost (their counters never drift further).

Within a tenant, interactive requests go before bulk ones, each in arrival order. Pure and deterministic:
on equal counters the shorter backlog goes first (a tenant just lifted to the minimum, typically a light one
with one request, does not wait behind a flood's), then the tenant backlogged first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.config.admission import RouteClass
from app.config.types import ROUTE_CLASSES

T = TypeVar("T")
CLASSES: tuple[RouteClass, ...] = ROUTE_CLASSES


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """A waiting item: whose, which class, and the cost charged when it starts."""

    tenant: str
    route_class: RouteClass
    item: T
    cost: float


class _Backlog(Generic[T]):
    __slots__ = ("by_class", "since")

    def __init__(self, since: int) -> None:
        # Insertion-ordered dicts keyed by id(item): FIFO head with next(iter()), O(1) removal on cancel.
        self.by_class: dict[RouteClass, dict[int, Entry[T]]] = {c: {} for c in CLASSES}
        self.since = since  # tie-break: order of becoming backlogged

    def __len__(self) -> int:
        return sum(len(q) for q in self.by_class.values())

    def head(self) -> Entry[T]:
        for c in CLASSES:
            q = self.by_class[c]
            if q:
                return next(iter(q.values()))
        raise IndexError("empty backlog")


class VirtualTokenCounter(Generic[T]):
    """Per-tenant FIFO queues released lowest weighted service first."""

    def __init__(self, weights: Mapping[str, float] | None = None, default_weight: float = 1.0) -> None:
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        self.counters: dict[str, float] = {}
        self._backlogs: dict[str, _Backlog[T]] = {}
        self._last_left = 0.0  # counter of the last tenant whose backlog emptied
        self._seq = itertools.count()
        self._size = 0

    def weight(self, tenant: str) -> float:
        """The tenant's share weight."""
        return self._weights.get(tenant, self._default_weight)

    def __len__(self) -> int:
        return self._size

    def backlog(self, tenant: str) -> int:
        """Items the tenant has waiting."""
        b = self._backlogs.get(tenant)
        return len(b) if b is not None else 0

    def backlogged(self) -> Iterator[str]:
        """Tenants with something waiting, in the order they became backlogged."""
        return iter(self._backlogs)

    def ahead_of_new(self, tenant: str) -> float:
        """About how many waiting requests start before a new one of `tenant` (it included): its backlog and
        the others' in proportion to their weights, at most all of them."""
        weights = sum(self.weight(t) for t in self._backlogs if t != tenant) + self.weight(tenant)
        return min(self._size + 1, (self.backlog(tenant) + 1) * weights / self.weight(tenant))

    def push(self, tenant: str, route_class: RouteClass, item: T, cost: float) -> None:
        """Queue `item`; a tenant that was not backlogged gets its counter lifted first."""
        b = self._backlogs.get(tenant)
        if b is None:
            self._lift(tenant)
            b = self._backlogs[tenant] = _Backlog(next(self._seq))
        b.by_class[route_class][id(item)] = Entry(tenant, route_class, item, cost)
        self._size += 1

    def peek(self) -> Entry[T] | None:
        """The entry pop() would return, without charging."""
        t = self._next_tenant()
        return None if t is None else self._backlogs[t].head()

    def order(self) -> list[str]:
        """Backlogged tenants in the order they would be served if nothing changed their counters."""
        return sorted(self._backlogs, key=lambda t: (self.counters[t], len(self._backlogs[t]), self._backlogs[t].since))

    def head_of(self, tenant: str) -> Entry[T] | None:
        """The entry the tenant would start next (interactive first)."""
        b = self._backlogs.get(tenant)
        return None if b is None else b.head()

    def pop(self, tenant: str | None = None) -> Entry[T] | None:
        """Take the next entry (lowest counter's tenant, or `tenant`'s; interactive first) and charge its cost."""
        t = self._next_tenant() if tenant is None else tenant
        if t is None or t not in self._backlogs:
            return None
        entry = self._backlogs[t].head()
        self._drop(entry)
        self.charge(t, entry.cost)
        if t not in self._backlogs:
            self._last_left = self.counters[t]
        return entry

    def remove(self, tenant: str, route_class: RouteClass, item: T) -> bool:
        """Take `item` out uncharged (cancelled, expired, evicted); False if it was not waiting."""
        b = self._backlogs.get(tenant)
        if b is None:
            return False
        entry = b.by_class[route_class].get(id(item))
        if entry is None or entry.item is not item:
            return False
        self._drop(entry)
        if tenant not in self._backlogs:
            self._last_left = self.counters.get(tenant, 0.0)
        return True

    def longest_other(self, tenant: str) -> str | None:
        """The tenant to evict from for a new item of `tenant`: the longest weighted backlog, if clearly longer
        than its own would be."""
        mine = (self.backlog(tenant) + 1) / self.weight(tenant)
        best, best_len = None, mine
        for t in self._backlogs:
            length = self.backlog(t) / self.weight(t)
            if t != tenant and length > best_len:
                best, best_len = t, length
        return best

    def newest(self, tenant: str) -> Entry[T] | None:
        """The tenant's most recent bulk entry, else its most recent interactive one (what to evict first)."""
        b = self._backlogs.get(tenant)
        if b is None:
            return None
        for c in reversed(CLASSES):
            q = b.by_class[c]
            if q:
                return next(reversed(q.values()))
        return None

    def charge(self, tenant: str, tokens: float) -> None:
        """Add service to the tenant's counter (negative: a correction when a request used less than charged)."""
        weight = self._weights.get(tenant, self._default_weight)  # self.weight() inlined: on every settle
        self.counters[tenant] = self.counters.get(tenant, self._last_left) + tokens / weight

    def serve_direct(self, tenant: str, cost: float) -> None:
        """Charge a request that started without waiting: as if it joined the queue and left it at once."""
        if self._backlogs:
            self._lift(tenant)
            self.charge(tenant, cost)
            if tenant not in self._backlogs:
                self._last_left = self.counters[tenant]
            return
        # Nobody backlogged (every request below saturation): the floor is the last counter to leave, the
        # lift, the charge and the new floor in one step.
        floor = self._last_left
        counter = self.counters.get(tenant, floor)
        if counter < floor:
            counter = floor
        counter += cost / self._weights.get(tenant, self._default_weight)
        self.counters[tenant] = self._last_left = counter

    def forget_idle(self) -> int:
        """Drop counters that a lift would overwrite anyway (idle tenants at or below the floor); returns how many."""
        floor = self._floor()
        gone = [t for t, c in self.counters.items() if t not in self._backlogs and c <= floor]
        for t in gone:
            del self.counters[t]
        return len(gone)

    # ------------------------------------------------------------------------------------------------------
    def _floor(self) -> float:
        if self._backlogs:
            return min(self.counters[t] for t in self._backlogs)
        return self._last_left

    def _lift(self, tenant: str) -> None:
        floor = self._floor()
        self.counters[tenant] = max(self.counters.get(tenant, floor), floor)

    def _next_tenant(self) -> str | None:
        best: str | None = None
        best_key = (0.0, 0, 0)
        counters = self.counters
        for t, b in self._backlogs.items():
            key = (counters[t], len(b), b.since)
            if best is None or key < best_key:
                best, best_key = t, key
        return best

    def _drop(self, entry: Entry[T]) -> None:
        b = self._backlogs[entry.tenant]
        del b.by_class[entry.route_class][id(entry.item)]
        self._size -= 1
        if not len(b):
            del self._backlogs[entry.tenant]
