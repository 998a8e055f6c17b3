"""Per-tenant bounded memory of candidate-span fingerprints: learns which spans change between requests."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

_V = TypeVar("_V")


class _TenantMemory:
    """One tenant's tables, each an LRU of hashes (no text)."""

    __slots__ = ("positional", "spans", "static", "static_rules")

    def __init__(self) -> None:
        # template key -> [last value hash, volatile flag]
        self.spans: OrderedDict[int, list[int]] = OrderedDict()
        # hashes of paragraphs already found to hold no metadata (skip re-parsing static text)
        self.static: OrderedDict[int, None] = OrderedDict()
        self.static_rules: frozenset[str] = frozenset()
        # hash of a text with its moving lines removed -> whether it refers to a span by position
        self.positional: OrderedDict[int, bool] = OrderedDict()


def _bounded_put(table: OrderedDict[int, _V], key: int, value: _V, capacity: int) -> None:
    table[key] = value
    if len(table) > capacity:
        table.popitem(last=False)


class VolatilityMemory:
    """Remembers, per tenant, the last value hash seen for each span template; hashes only, LRU-bounded.

    One instance per gateway process (created by the app factory). `normalize` mutates it in place:
    that learning is the only state of the normalize stage. A key is a hash of where a span sits (its
    message slot, the line with the span replaced by its rule name, and the neighbouring static lines);
    a value is a hash of the span's text. Two caches ride along, also hashes only: lines known not to be
    metadata, and texts known to refer to spans by position; they only save time. No prompt text is
    kept. Not thread-safe: the gateway calls it from one event loop and `normalize` never awaits.
    """

    __slots__ = ("_capacity", "_max_tenants", "_tenants")

    def __init__(self, capacity_per_tenant: int = 256, max_tenants: int = 10_000) -> None:
        if capacity_per_tenant < 1 or max_tenants < 1:
            raise ValueError("capacity_per_tenant and max_tenants must be >= 1")
        self._capacity = capacity_per_tenant
        self._max_tenants = max_tenants
        self._tenants: OrderedDict[str, _TenantMemory] = OrderedDict()

    def _tenant(self, tenant_id: str) -> _TenantMemory:
        mem = self._tenants.get(tenant_id)
        if mem is None:
            mem = _TenantMemory()
            self._tenants[tenant_id] = mem
            if len(self._tenants) > self._max_tenants:
                self._tenants.popitem(last=False)
        else:
            self._tenants.move_to_end(tenant_id)
        return mem

    def observe(self, tenant_id: str, key: int, value: int, presume_volatile: bool) -> bool:
        """Record one sighting and say whether the span at `key` counts as volatile.

        Volatile once its value has been seen to change under the same key, and sticky from then on
        (flip-flopping would move the line back and forth and break the cache twice). On first sight
        the caller's presumption decides (strongly typed values under "now"/"request id" labels).
        """
        table = self._tenant(tenant_id).spans
        entry = table.get(key)
        if entry is None:
            _bounded_put(table, key, [value, int(presume_volatile)], self._capacity)
            return presume_volatile
        table.move_to_end(key)
        if entry[0] != value:
            entry[0] = value
            entry[1] = 1
        return bool(entry[1])

    def peek(self, tenant_id: str, key: int) -> bool | None:
        """Whether `key` is known volatile (None if unknown); does not learn."""
        mem = self._tenants.get(tenant_id)
        if mem is None or key not in mem.spans:
            return None
        return bool(mem.spans[key][1])

    def is_static_text(self, tenant_id: str, text_hash: int, rules: frozenset[str]) -> bool:
        """Whether this paragraph was already parsed and found to hold no metadata under the same rules."""
        mem = self._tenants.get(tenant_id)
        if mem is None or mem.static_rules != rules:
            return False
        return text_hash in mem.static

    def add_static_text(self, tenant_id: str, text_hash: int, rules: frozenset[str]) -> None:
        """Remember a paragraph without metadata (the table resets when the tenant's rules change)."""
        mem = self._tenant(tenant_id)
        if mem.static_rules != rules:
            mem.static.clear()
            mem.static_rules = rules
        _bounded_put(mem.static, text_hash, None, 4 * self._capacity)

    def positional(self, tenant_id: str, text_hash: int) -> bool | None:
        """Cached answer to "does this text refer to a span by position?" (None if not cached)."""
        mem = self._tenants.get(tenant_id)
        return None if mem is None else mem.positional.get(text_hash)

    def add_positional(self, tenant_id: str, text_hash: int, refers: bool) -> None:
        """Cache the positional-reference answer for a text (keyed by its hash)."""
        _bounded_put(self._tenant(tenant_id).positional, text_hash, refers, 64)

    def size(self, tenant_id: str | None = None) -> int:
        """Span entries held for one tenant, or the number of tenants when `tenant_id` is None."""
        if tenant_id is None:
            return len(self._tenants)
        mem = self._tenants.get(tenant_id)
        return 0 if mem is None else len(mem.spans)
