"""In-process Store: the embedded default, correct for exactly one gateway replica.

It runs the same arithmetic as the Redis scripts (integer leaky buckets, lease expiry, idempotent
spend) so both stores answer alike; nothing here awaits, so each call is atomic on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.store.base import (
    SPEND_DEDUPE_S,
    AdmitResult,
    DayUsage,
    LimitReason,
    LimitSpec,
    PoolUsage,
    Release,
    SpendRecord,
)

US = 1_000_000


@dataclass(slots=True)
class _Bucket:
    level: int = 0  # units: one token/request costs window_us; drains `limit` units per µs
    last_us: int = 0


def _drained(b: _Bucket, limit: int, now_us: int) -> int:
    elapsed = max(now_us - b.last_us, 0)
    return 0 if elapsed * limit >= b.level else b.level - elapsed * limit


class MemoryStore:
    """A Store kept in this process (lost on restart; one replica only)."""

    def __init__(self, clock_us: Callable[[], int] | None = None) -> None:
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._leases: dict[str, dict[str, int]] = {}  # tenant -> lease id -> expiry µs
        self._month: dict[tuple[str, str], int] = {}
        self._days: dict[tuple[str, str], dict[str, PoolUsage]] = {}
        self._seen: dict[str, int] = {}  # spend record id -> expiry µs
        self._keys: dict[str, str] = {}
        self._tenant_keys: dict[str, set[str]] = {}
        self._revoked: set[str] = set()

    # -- limits --------------------------------------------------------------------------------
    async def admit(
        self, tenant_id: str, limits: LimitSpec, tokens: int, lease_id: str, month: str, force_lease: bool
    ) -> AdmitResult:
        """Check budget, concurrency, rpm and tpm together; commit all only if all pass."""
        now = self._clock_us()
        window = int(limits.window_s * US)
        fail: LimitReason | None = None
        retry_us = 0
        if limits.budget_micros is not None and self._month.get((tenant_id, month), 0) >= limits.budget_micros:
            fail = "budget"
        leases = self._leases.setdefault(tenant_id, {})
        if limits.concurrent is not None:
            for lid in [k for k, exp in leases.items() if exp <= now]:
                del leases[lid]
            if len(leases) >= limits.concurrent:
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
        take_lease = limits.concurrent is not None and (fail is None or force_lease)
        if take_lease:
            leases[lease_id] = now + int(limits.lease_s * US)
        return AdmitResult(
            admitted=fail is None,
            reason=fail,
            retry_after_s=retry_us / US,
            lease_taken=take_lease,
            tokens_reserved=tokens if fail is None and limits.tpm is not None else 0,
        )

    async def settle(self, release: Release | None, spend: SpendRecord | None) -> None:
        """Release the lease, reconcile TPM and record spend."""
        if release is not None:
            if release.lease_id is not None:
                self._leases.get(release.tenant_id, {}).pop(release.lease_id, None)
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
        if len(self._seen) > 100_000:
            self._seen = {k: exp for k, exp in self._seen.items() if exp > now}
        if self._seen.get(r.id, 0) > now:
            return
        self._seen[r.id] = now + SPEND_DEDUPE_S * US
        self._month[(r.tenant_id, r.month)] = self._month.get((r.tenant_id, r.month), 0) + r.usd_micros
        row = self._days.setdefault((r.tenant_id, r.day), {}).setdefault(r.pool, PoolUsage())
        row.add(
            PoolUsage(r.usd_micros, r.uncached_tokens, r.cached_tokens, r.output_tokens, r.requests)
        )

    # -- reads ---------------------------------------------------------------------------------
    async def usage(self, tenant_id: str, days: Sequence[str]) -> list[DayUsage]:
        """Spend rows for the given days."""
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

    async def ping(self) -> None:
        """Always reachable."""

    async def aclose(self) -> None:
        """Nothing to release."""
