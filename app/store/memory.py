"""In-process Store: the embedded default, correct for exactly one gateway replica.

It runs the same arithmetic as the Redis scripts (integer leaky buckets, lease expiry, idempotent
spend) so both stores answer alike; nothing here awaits, so each call is atomic on the event loop.

Every structure costs O(1) amortized per request and stays bounded at any sustained rate: what
Redis expires with a TTL (spend record ids, leases, spend rows) is kept in expiry order here and
forgotten from the old end, never by scanning everything. What remains grows with the number of
tenants and API keys, not with traffic (rate buckets: two per tenant; keys: as issued).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from app.store.base import (
    SPEND_DEDUPE_S,
    SPEND_KEEP_S,
    VOLATILE_KEEP_S,
    VOLATILE_PER_TENANT,
    AdmitResult,
    DayUsage,
    LimitReason,
    LimitSpec,
    LoadShare,
    PoolUsage,
    Release,
    SpendRecord,
)
from app.store.facts import Facts

US = 1_000_000
# Redis remembers a spend id for SPEND_DEDUPE_S at any rate, so that a write which timed out after Redis
# applied it counts once when the ledger replays it. A MemoryStore write cannot time out and nothing replays
# it, so here the window only has to catch a record settled twice in quick succession. At ~180 B an id, the
# cap holds ~12 MiB: the full window up to 218 req/s, 15 s at 4,300 req/s (one process's maximum); past it
# the oldest ids go first. A window sized for 1,000 req/s (300k ids, ~55 MiB) kept the process growing for
# minutes at full rate, +29% over the first minute's RSS by the fourth (docs/reliability.md, "Soak").
MAX_SPEND_IDS = 65_536
# A spend row's last-write time is refreshed at most this often: rows live SPEND_KEEP_S (400 days)
# after it, so a minute early is nothing, and most requests skip the ordered-map update.
_TOUCH_US = 60 * US


@dataclass(slots=True)
class _Bucket:
    level: int = 0  # units: one token/request costs window_us; drains `limit` units per µs
    last_us: int = 0


def _drained(b: _Bucket, limit: int, now_us: int) -> int:
    elapsed = max(now_us - b.last_us, 0)
    return 0 if elapsed * limit >= b.level else b.level - elapsed * limit


class RecentIds:
    """Ids remembered for `ttl_us` after first sight (Redis `SET NX PX`), at most about `cap` of them.

    Each id keeps its exact expiry; ids are also filed in arrival order in slots `slot_us` wide,
    and a slot is dropped whole once its last expiry has passed, so forgetting an id is O(1)
    amortized and nothing is ever scanned. Past `cap` the oldest slot goes early.
    """

    def __init__(self, ttl_us: int, cap: int, slot_us: int = 100_000) -> None:
        self._ttl = ttl_us
        self._cap = cap
        self._slot_us = slot_us
        # A slot never holds more than this, so evicting one for the cap forgets few recent ids.
        self._slot_max = max(cap // 64, 1)
        self._expiry: dict[str, int] = {}
        self._slots: deque[tuple[int, list[str]]] = deque()  # (end µs: all expiries are below it, ids)
        self._tail: list[str] = []  # the newest slot's ids (filed when the first id goes in)
        self._tail_end = 0
        self._filed = 0  # ids in slots (a re-seen id is filed twice until its old slot goes)
        self.visited = 0  # ids looked at while forgetting: the whole upkeep cost, for tests and stats

    def __len__(self) -> int:
        return len(self._expiry)

    @property
    def filed(self) -> int:
        """Slot entries held (>= len: an id seen again after expiring is filed in two slots for a while)."""
        return self._filed

    def add(self, rid: str, now_us: int) -> bool:
        """Remember `rid` and return True, or False if it is already remembered (expiry unchanged)."""
        slots = self._slots
        while slots and slots[0][0] <= now_us:
            self._forget(slots.popleft())
        exp = self._expiry.get(rid)
        if exp is not None and exp > now_us:
            return False
        exp = now_us + self._ttl
        self._expiry[rid] = exp
        # Any id expiring before a slot's end may go in it (even one filed after a clock step back).
        if exp < self._tail_end and len(self._tail) < self._slot_max and slots:
            self._tail.append(rid)
        else:
            self._tail, self._tail_end = [rid], (exp // self._slot_us + 1) * self._slot_us
            slots.append((self._tail_end, self._tail))
        self._filed += 1
        while self._filed > self._cap:
            self._forget(slots.popleft())
        return True

    def _forget(self, slot: tuple[int, list[str]]) -> None:
        end, ids = slot
        expiry = self._expiry
        for rid in ids:
            # An id seen again after expiring has a later expiry and is filed in a later slot: keep it.
            if expiry.get(rid, end) < end:
                del expiry[rid]
        self._filed -= len(ids)
        self.visited += len(ids)


@dataclass(slots=True)
class _Leases:
    """One tenant's concurrency leases: id -> expiry, plus a min-heap on expiry to drop expired ones."""

    expiry: dict[str, int] = field(default_factory=dict)
    heap: list[tuple[int, str]] = field(default_factory=list)  # may hold released ids (skipped)

    def take(self, lease_id: str, exp_us: int) -> None:
        self.expiry[lease_id] = exp_us
        heapq.heappush(self.heap, (exp_us, lease_id))

    def release(self, lease_id: str) -> None:
        if self.expiry.pop(lease_id, None) is not None and len(self.heap) > 2 * len(self.expiry) + 64:
            # Released leases linger in the heap; rebuilding once they are the majority keeps it
            # within ~2x the live leases for O(1) amortized per release.
            self.heap = [(exp, lid) for lid, exp in self.expiry.items()]
            heapq.heapify(self.heap)

    def live(self, now_us: int) -> int:
        """Drop leases expired at `now_us` (Redis: ZREMRANGEBYSCORE -inf now) and count the rest."""
        heap, expiry = self.heap, self.expiry
        while heap and heap[0][0] <= now_us:
            exp, lid = heapq.heappop(heap)
            if expiry.get(lid) == exp:
                del expiry[lid]
        return len(expiry)


class MemoryStore:
    """A Store kept in this process (lost on restart; one replica only)."""

    def __init__(self, clock_us: Callable[[], int] | None = None, *, max_spend_ids: int = MAX_SPEND_IDS) -> None:
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._leases: dict[str, _Leases] = {}
        self._month: dict[tuple[str, str], int] = {}
        self._days: dict[tuple[str, str], dict[str, PoolUsage]] = {}
        # (tenant, month or day) -> last write µs, oldest write first: rows expire SPEND_KEEP_S after
        # their last write (to the minute), as the Redis keys do (PEXPIRE on every write).
        self._written: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._rows_checked_until = 0  # no row expires before this µs: skips the check per request
        self._seen = RecentIds(SPEND_DEDUPE_S * US, max_spend_ids)
        self._keys: dict[str, str] = {}
        self._tenant_keys: dict[str, set[str]] = {}
        self._revoked: set[str] = set()
        self._facts = Facts()
        # tenant -> volatile template fingerprint -> µs it was last added, oldest add first
        self._volatile: dict[str, OrderedDict[int, int]] = {}
        # gateway process id -> (µs its load payload expires, µs it was written, the payload)
        self._loads: dict[str, tuple[int, int, str]] = {}

    # -- limits --------------------------------------------------------------------------------
    async def admit(
        self, tenant_id: str, limits: LimitSpec, tokens: int, lease_id: str, month: str, force_lease: bool
    ) -> AdmitResult:
        """Check budget, concurrency, rpm and tpm together; commit all only if all pass."""
        now = self._clock_us()
        window = int(limits.window_s * US)
        fail: LimitReason | None = None
        retry_us = 0
        if limits.budget_micros is not None:
            self._expire_rows(now)
            if self._month.get((tenant_id, month), 0) >= limits.budget_micros:
                fail = "budget"
        leases: _Leases | None = None
        if limits.concurrent is not None:
            leases = self._leases.get(tenant_id)
            if leases is None:
                leases = self._leases[tenant_id] = _Leases()
            if leases.live(now) >= limits.concurrent:
                fail = fail or "concurrent"
                retry_us = max(retry_us, US)
        staged: list[tuple[_Bucket, int]] = []
        for name, limit, cost in (("rpm", limits.rpm, 1), ("tpm", limits.tpm, tokens)):
            if limit is None:
                continue
            b = self._buckets.setdefault((tenant_id, name), _Bucket(last_us=now))
            new = _drained(b, limit, now) + cost * window
            cap = limit * window
            if new > cap:
                fail = fail or name  # type: ignore[assignment]
                retry_us = max(retry_us, -(-(new - cap) // limit))
            staged.append((b, new))
        if fail is None:
            for b, new in staged:
                b.level, b.last_us = new, now
        take_lease = leases is not None and (fail is None or force_lease)
        if leases is not None and take_lease:
            leases.take(lease_id, now + int(limits.lease_s * US))
        return AdmitResult(
            admitted=fail is None,
            reason=fail,
            retry_after_s=retry_us / US,
            lease_taken=take_lease,
            tokens_reserved=tokens if fail is None and limits.tpm is not None else 0,
        )

    async def renew_lease(self, tenant_id: str, lease_id: str, lease_s: float) -> bool:
        """Move a held lease's expiry (its old heap entry no longer matches and is skipped)."""
        leases = self._leases.get(tenant_id)
        now = self._clock_us()
        if leases is None or leases.expiry.get(lease_id, 0) <= now:
            return False
        leases.take(lease_id, now + int(lease_s * US))
        return True

    async def settle(self, release: Release | None, spend: SpendRecord | None) -> None:
        """Release the lease, reconcile TPM and record spend."""
        if release is not None:
            if release.lease_id is not None and (leases := self._leases.get(release.tenant_id)) is not None:
                leases.release(release.lease_id)
            if release.tpm is not None and release.token_delta:
                now = self._clock_us()
                b = self._buckets.setdefault((release.tenant_id, "tpm"), _Bucket(last_us=now))
                level = _drained(b, release.tpm, now) + release.token_delta * int(release.window_s * US)
                b.level, b.last_us = max(level, 0), now
        if spend is not None:
            self._record(spend)

    async def record_spend(self, records: Sequence[SpendRecord]) -> None:
        """Record several charges (idempotent per record id)."""
        for r in records:
            self._record(r)

    def _record(self, r: SpendRecord) -> None:
        now = self._clock_us()
        if not self._seen.add(r.id, now):
            return  # a duplicate within the window changes nothing (Redis: SET NX fails)
        self._expire_rows(now)
        month_key, day_key = (r.tenant_id, r.month), (r.tenant_id, r.day)
        self._month[month_key] = self._month.get(month_key, 0) + r.usd_micros
        row = self._days.setdefault(day_key, {}).setdefault(r.pool, PoolUsage())
        row.usd_micros += r.usd_micros
        row.uncached_tokens += r.uncached_tokens
        row.cached_tokens += r.cached_tokens
        row.output_tokens += r.output_tokens
        row.requests += r.requests
        written = self._written
        for key in (month_key, day_key):
            if written.get(key, 0) < now - _TOUCH_US:
                written[key] = now
                written.move_to_end(key)

    def _expire_rows(self, now_us: int) -> None:
        if now_us < self._rows_checked_until:
            return
        written = self._written
        cutoff = now_us - SPEND_KEEP_S * US
        while written:
            key, last = next(iter(written.items()))
            if last > cutoff:
                # The oldest write expires first; until then nothing does (a row written since only moved later).
                self._rows_checked_until = last + SPEND_KEEP_S * US
                return
            del written[key]
            # A month is "YYYY-MM", a day "YYYY-MM-DD": one ordered map serves both.
            if len(key[1]) == 7:
                self._month.pop(key, None)
            else:
                self._days.pop(key, None)

    def entry_counts(self) -> dict[str, int]:
        """How many entries each structure holds (what must stay bounded under sustained load)."""
        return {
            "spend_ids": len(self._seen),
            "spend_id_slots": self._seen.filed,
            "leases": sum(len(x.expiry) for x in self._leases.values()),
            "lease_heap": sum(len(x.heap) for x in self._leases.values()),
            "buckets": len(self._buckets),
            "month_rows": len(self._month),
            "day_rows": len(self._days),
            "keys": len(self._keys),
            "revoked": len(self._revoked),
            "volatile": sum(len(x) for x in self._volatile.values()),
        }

    # -- reads ---------------------------------------------------------------------------------
    async def usage(self, tenant_id: str, days: Sequence[str]) -> list[DayUsage]:
        """Spend rows for the given days."""
        self._expire_rows(self._clock_us())
        out = []
        for day in days:
            rows = self._days.get((tenant_id, day), {})
            copy = {}
            for pool, row in rows.items():
                copy[pool] = PoolUsage()
                copy[pool].add(row)
            out.append(DayUsage(day, copy))
        return out

    async def month_spend_micros(self, tenant_id: str, month: str) -> int:
        """Total charged to a tenant in a month."""
        self._expire_rows(self._clock_us())
        return self._month.get((tenant_id, month), 0)

    # -- keys ----------------------------------------------------------------------------------
    async def put_key(self, key_hash: str, tenant_id: str, *, unless_revoked: bool = False) -> bool:
        """Map an API key hash to a tenant."""
        if unless_revoked and key_hash in self._revoked:
            return False
        self._revoked.discard(key_hash)
        self._keys[key_hash] = tenant_id
        self._tenant_keys.setdefault(tenant_id, set()).add(key_hash)
        return True

    async def key_tenant(self, key_hash: str) -> str | None:
        """The tenant an API key hash belongs to."""
        return self._keys.get(key_hash)

    async def tenant_keys(self, tenant_id: str) -> list[str]:
        """The key hashes a tenant holds."""
        return sorted(self._tenant_keys.get(tenant_id, set()))

    async def revoke_key(self, tenant_id: str, key_hash: str) -> bool:
        """Unmap a key hash and remember it as revoked."""
        held = self._tenant_keys.get(tenant_id, set())
        if key_hash not in held:
            return False
        held.discard(key_hash)
        self._keys.pop(key_hash, None)
        self._revoked.add(key_hash)
        return True

    async def remember(self, name: str, value: str, ttl_s: float) -> None:
        """Keep a routing fact in this process (bounded, oldest out first)."""
        self._facts.put(name, value, ttl_s)

    async def recall(self, name: str) -> str | None:
        """A fact kept by `remember`, while it lives."""
        return self._facts.get(name)

    # -- learned volatility --------------------------------------------------------------------
    async def add_volatile(self, tenant_id: str, fingerprints: Collection[int], forget: Collection[int] = ()) -> None:
        """Add fingerprints to the tenant's set (re-adding refreshes one), drop `forget`; oldest out past the cap."""
        now = self._clock_us()
        held = self._volatile.setdefault(tenant_id, OrderedDict())
        for fp in fingerprints:
            held[fp] = now
            held.move_to_end(fp)
        for fp in forget:
            held.pop(fp, None)
        self._expire_volatile(tenant_id, held, now)
        while len(held) > VOLATILE_PER_TENANT:
            held.popitem(last=False)

    async def volatile_fingerprints(self, tenant_ids: Sequence[str]) -> dict[str, set[int]]:
        """Each tenant's live fingerprints."""
        now = self._clock_us()
        out: dict[str, set[int]] = {}
        for tid in tenant_ids:
            held = self._volatile.get(tid)
            if held is not None:
                self._expire_volatile(tid, held, now)
            out[tid] = set(held) if held else set()
        return out

    def _expire_volatile(self, tenant_id: str, held: OrderedDict[int, int], now_us: int) -> None:
        cutoff = now_us - VOLATILE_KEEP_S * US
        while held and next(iter(held.values())) <= cutoff:
            held.popitem(last=False)
        if not held:
            del self._volatile[tenant_id]

    async def share_load(self, process_id: str, payload: str | None, ttl_s: float) -> LoadShare:
        """Publish ours (unless None), drop the expired, return every live one's (gateways sharing this object)."""
        now = self._clock_us()
        if payload is not None:
            self._loads[process_id] = (now + int(ttl_s * US), now, payload)
        for pid in [pid for pid, (expires, _, _) in self._loads.items() if expires < now]:
            del self._loads[pid]
        return now, {pid: (written, p) for pid, (_, written, p) in self._loads.items()}

    async def ping(self) -> None:
        """Always reachable."""

    async def aclose(self) -> None:
        """Nothing to release."""
