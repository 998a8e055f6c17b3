"""Per-tenant bounded memory of candidate-span fingerprints: learns which spans change between requests."""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple, TypeVar

from app.normalize.transient import Transient
from app.normalize.varying import Variation

_V = TypeVar("_V")
_POSITIONAL_CAPACITY = 64
_SHAPE_CAPACITY = 64
# Learned keys (lines found by structure alone, no typed rule): volatile after this many changes in a
# row (a value seen three times, each time different: the third request moves it). One change is a
# version bump or a prompt edit, not volatility.
LEARN_AFTER_CHANGES = 2
# ... and static again after this many sightings in a row with the same value (a value that settled:
# a mixed client fleet that converged, sessions that stopped interleaving). Costs one miss when it happens.
RELAX_AFTER_SAMES = 16


class LearnedKey(int):
    """A template key of a learned line (an int, so it hashes and compares as one); marks the kind only.

    `TenantMemory.observe` needs more evidence before it calls such a line volatile, and lets it go again
    once its value settles; typed lines keep the one-change, sticky rule.
    """

    __slots__ = ()


class Shape(NamedTuple):
    """Last scan of one message slot: which lines were metadata, a hash of the rest, its positional answer."""

    line_indices: tuple[int, ...]
    prefix_lens: tuple[int, ...]  # length of each line's text before its value (label, bullet)
    prefix_hashes: tuple[int, ...]
    keys: tuple[int, ...]
    skeletons: tuple[int, ...]  # hashes of each line with its spans blanked out
    rest_hash: int
    refers: bool


def fingerprint_key(secret: bytes, tenant_id: str) -> bytes:
    """The BLAKE2b key of one tenant's template fingerprints: HMAC-SHA256(secret, label + tenant id)."""
    return hmac.new(secret, b"kvgate-volatility-fingerprint\0" + tenant_id.encode(), hashlib.sha256).digest()


def _bounded_put(table: OrderedDict[int, _V], key: int, value: _V, capacity: int) -> None:
    table[key] = value
    if len(table) > capacity:
        table.popitem(last=False)


def _observe_learned(entry: list[int], value: int) -> bool:
    """One sighting of a learned key: count the run of changes (or of equal values) and flip at the bounds."""
    run = entry[2]
    if entry[0] != value:
        entry[0] = value
        run = run + 1 if run > 0 else 1
        if run >= LEARN_AFTER_CHANGES:
            entry[1] = 1
    else:
        run = run - 1 if run < 0 else -1
        if -run >= RELAX_AFTER_SAMES:
            entry[1] = 0
    entry[2] = max(-RELAX_AFTER_SAMES, min(run, LEARN_AFTER_CHANGES))  # bounded: a small int forever
    return bool(entry[1])


class TenantMemory:
    """One tenant's tables, each an LRU of hashes (no text). Obtain via `VolatilityMemory.for_tenant`."""

    __slots__ = (
        "_capacity", "_fingerprints", "_forget", "_positional", "_publish", "_shapes", "_shared", "_spans", "_static",
        "_static_rules", "fingerprint_key", "transient", "variation",
    )

    def __init__(self, capacity: int, fingerprint_key: bytes = b"") -> None:
        self._capacity = capacity
        # Keys template keys (scan.fingerprint) so that every gateway process computes the same ones.
        self.fingerprint_key = fingerprint_key
        # local hash of a template's parts -> its fingerprint (the hash is per process, the fingerprint is not)
        self._fingerprints: OrderedDict[int, int] = OrderedDict()
        # Shared learning (app/normalize/shared.py): keys other replicas found volatile, read on first sight
        # only; keys this process found volatile by evidence, or found settled again, not yet written to the
        # store. Bounded: the store caps what it hands back, and past `capacity` pending keys wait locally.
        self._shared: set[int] = set()
        self._publish: set[int] = set()
        self._forget: set[int] = set()
        # template key -> [last value hash, volatile flag] (+ a run counter for learned keys: changes in a
        # row when > 0, same values in a row when < 0)
        self._spans: OrderedDict[int, list[int]] = OrderedDict()
        # hashes of paragraphs already found to hold no metadata (skip re-parsing static text)
        self._static: OrderedDict[int, None] = OrderedDict()
        self._static_rules: frozenset[str] = frozenset()
        # hash of a text with its moving lines removed -> whether it refers to a span by position
        self._positional: OrderedDict[int, bool] = OrderedDict()
        # hash of a message slot -> (rules the scan ran under, the shape it found)
        self._shapes: OrderedDict[int, tuple[frozenset[str], Shape]] = OrderedDict()
        # how each span varies (between sessions, within one) and each session's head layout (app/normalize/varying)
        self.variation = Variation(capacity)
        # reminders clients send in their latest user turn only (app/normalize/transient)
        self.transient = Transient(capacity)

    def observe(self, key: int, value: int, presume_volatile: bool) -> bool:
        """Record one sighting and say whether the span at `key` counts as volatile.

        Typed keys: volatile once the value has been seen to change under the same key, and sticky from
        then on (flip-flopping would move the line back and forth and break the cache twice); on first
        sight the caller's presumption decides (strongly typed values under "now"/"request id" labels).
        `LearnedKey`s: never presumed; volatile after `LEARN_AFTER_CHANGES` changes in a row, static
        again after `RELAX_AFTER_SAMES` equal sightings in a row. Either kind counts as volatile at first
        sight when another gateway replica already found it so (`set_shared`).
        """
        entry = self._spans.get(key)
        learned = type(key) is LearnedKey
        if entry is None:
            shared = key in self._shared
            if learned:
                # Shared: as if this process had seen the changes itself (it still settles after equal values).
                entry = [value, 1, LEARN_AFTER_CHANGES] if shared else [value, 0, 0]
                _bounded_put(self._spans, key, entry, self._capacity)
                return shared
            volatile = presume_volatile or shared
            _bounded_put(self._spans, key, [value, int(volatile)], self._capacity)
            return volatile
        self._spans.move_to_end(key)
        if learned:
            was = entry[1]
            now = _observe_learned(entry, value)
            if now != was:
                self._changed(key, now)
            return now
        if entry[0] != value:
            entry[0] = value
            if not entry[1]:
                entry[1] = 1
                self._changed(key, True)
        return bool(entry[1])

    def _changed(self, key: int, volatile: bool) -> None:
        """Evidence turned a key volatile (or a learned one static again): queue it for the shared set."""
        if volatile:
            self._forget.discard(key)
            if key not in self._shared and len(self._publish) < self._capacity:
                self._publish.add(key)
        else:
            self._shared.discard(key)  # settled here: an eviction and a re-sighting must not revive it
            self._publish.discard(key)
            if len(self._forget) < self._capacity:
                self._forget.add(key)

    def set_shared(self, fingerprints: Iterable[int]) -> None:
        """Replace the keys other replicas found volatile (bar those this process saw settle and has not
        written yet); consulted on a key's first sighting only, so a key already known here keeps its state."""
        shared = set(fingerprints)
        shared.difference_update(self._forget)
        self._shared = shared

    def take_pending(self) -> tuple[set[int], set[int]]:
        """Keys to add to the shared set and keys to remove from it since the last call (the queues empty)."""
        publish, forget = self._publish, self._forget
        self._publish, self._forget = set(), set()
        self._shared |= publish  # they are what the shared set will hold once written
        return publish, forget

    def requeue(self, publish: Iterable[int], forget: Iterable[int]) -> None:
        """Put back what `take_pending` gave when the write failed, unless newer evidence overrode it."""
        for key in publish:
            if key not in self._forget and len(self._publish) < self._capacity:
                self._publish.add(key)
        for key in forget:
            if key not in self._publish and len(self._forget) < self._capacity:
                self._forget.add(key)

    def has_pending(self) -> bool:
        """Whether `take_pending` would return anything."""
        return bool(self._publish or self._forget)

    def peek(self, key: int) -> bool | None:
        """Whether `key` is known volatile (None if unknown); does not learn."""
        entry = self._spans.get(key)
        return None if entry is None else bool(entry[1])

    def is_static_text(self, text_hash: int, rules: frozenset[str]) -> bool:
        """Whether this paragraph was already parsed and found to hold no metadata under the same rules."""
        if self._static_rules is not rules and self._static_rules != rules:
            return False
        return text_hash in self._static

    def add_static_text(self, text_hash: int, rules: frozenset[str]) -> None:
        """Remember a paragraph without metadata (the table resets when the tenant's rules change)."""
        if self._static_rules is not rules and self._static_rules != rules:
            self._static.clear()
            self._static_rules = rules
        _bounded_put(self._static, text_hash, None, 4 * self._capacity)

    def known_fingerprint(self, local_hash: int) -> int | None:
        """The fingerprint already computed for a template's parts (by their local hash), if cached."""
        return self._fingerprints.get(local_hash)

    def add_fingerprint(self, local_hash: int, fingerprint: int) -> None:
        """Cache a template's fingerprint (bounded like the span table, oldest first)."""
        _bounded_put(self._fingerprints, local_hash, fingerprint, self._capacity)

    def positional(self, text_hash: int) -> bool | None:
        """Cached answer to "does this text refer to a span by position?" (None if not cached)."""
        return self._positional.get(text_hash)

    def add_positional(self, text_hash: int, refers: bool) -> None:
        """Cache the positional-reference answer for a text (keyed by its hash)."""
        _bounded_put(self._positional, text_hash, refers, _POSITIONAL_CAPACITY)

    def shape(self, slot_key: int, rules: frozenset[str]) -> Shape | None:
        """The shape last scanned in this slot under the same rules, if any."""
        found = self._shapes.get(slot_key)
        if found is None or (found[0] is not rules and found[0] != rules):
            return None
        return found[1]

    def add_shape(self, slot_key: int, shape: Shape, rules: frozenset[str]) -> None:
        """Remember the shape a full scan found in this slot."""
        _bounded_put(self._shapes, slot_key, (rules, shape), _SHAPE_CAPACITY)

    def __len__(self) -> int:
        return len(self._spans)


class VolatilityMemory:
    """Remembers, per tenant, the last value hash seen for each span template; hashes only, LRU-bounded.

    One instance per gateway process (created by the app factory). `normalize` mutates it in place:
    that learning is the only state of the normalize stage. A key is a hash of where a span sits (its
    message slot, the line with the span replaced by its rule name, and the neighbouring static lines);
    a value is a hash of the span's text. Two caches ride along, also hashes only: paragraphs known to
    hold no metadata, and texts known to refer to spans by position; they only save time. No prompt
    text is kept. Not thread-safe: the gateway calls it from one event loop and `normalize` never awaits.
    """

    __slots__ = ("_capacity", "_max_tenants", "_secret", "_tenants")

    def __init__(self, capacity_per_tenant: int = 256, max_tenants: int = 10_000, secret: str = "") -> None:
        if capacity_per_tenant < 1 or max_tenants < 1:
            raise ValueError("capacity_per_tenant and max_tenants must be >= 1")
        self._capacity = capacity_per_tenant
        self._max_tenants = max_tenants
        # Gateway replicas share learned keys only when they key their fingerprints alike (normalize.salt_secret).
        self._secret = secret.encode()
        self._tenants: OrderedDict[str, TenantMemory] = OrderedDict()

    def for_tenant(self, tenant_id: str) -> TenantMemory:
        """The tenant's tables, created on first use; the least recently used tenant is dropped past the cap."""
        mem = self._tenants.get(tenant_id)
        if mem is None:
            mem = TenantMemory(self._capacity, fingerprint_key(self._secret, tenant_id))
            self._tenants[tenant_id] = mem
            if len(self._tenants) > self._max_tenants:
                self._tenants.popitem(last=False)
        else:
            self._tenants.move_to_end(tenant_id)
        return mem

    def pending_tenants(self) -> list[str]:
        """Tenants with learned keys not yet written to the shared set."""
        return [tid for tid, mem in self._tenants.items() if mem.has_pending()]

    def observe(self, tenant_id: str, key: int, value: int, presume_volatile: bool) -> bool:
        """`TenantMemory.observe` for one tenant."""
        return self.for_tenant(tenant_id).observe(key, value, presume_volatile)

    def peek(self, tenant_id: str, key: int) -> bool | None:
        """Whether `key` is known volatile for the tenant (None if unknown); does not learn."""
        mem = self._tenants.get(tenant_id)
        return None if mem is None else mem.peek(key)

    def size(self, tenant_id: str | None = None) -> int:
        """Span entries held for one tenant, or the number of tenants when `tenant_id` is None."""
        if tenant_id is None:
            return len(self._tenants)
        mem = self._tenants.get(tenant_id)
        return 0 if mem is None else len(mem)
