"""The shared-state contract every gateway replica talks to: rate windows, leases, spend, API keys, learning.

Money is integer micro-dollars so sums are exact; time is the store's own clock (Redis `TIME` for
the Redis store) so gateway replicas with skewed clocks still share one window.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

LimitReason = Literal["budget", "concurrent", "rpm", "tpm"]

MICROS_PER_USD = 1_000_000
# Spend rows and month totals outlive a year so "usage by day" can look back that far.
SPEND_KEEP_S = 400 * 86_400
# A record id is remembered this long, so a retried (possibly already applied) record counts once.
# Only a write that timed out after Redis applied it needs this; its retry comes from the ledger's
# flusher within seconds of Redis answering again. Cost: one small key per request for this long
# (~90 B each: ~27 MB at 1,000 req/s).
SPEND_DEDUPE_S = 5 * 60
# Learned volatility shared by gateway replicas (64-bit template fingerprints, no text): a fingerprint lives
# this long after it was last added, and a tenant keeps at most this many, the oldest added going first.
VOLATILE_KEEP_S = 7 * 86_400
VOLATILE_PER_TENANT = 2048


# share_load's answer: the store's clock (µs), and per live gateway process (µs its payload was written, payload).
LoadShare = tuple[int, dict[str, tuple[int, str]]]


def written_payload(value: str) -> tuple[int, str]:
    """A stored "<written µs>|<payload>" split; written 0 for a value without a write time (an older gateway's)."""
    head, bar, rest = value.partition("|")
    return (int(head), rest) if bar and head.isdigit() else (0, value)


class StoreUnavailable(Exception):
    """The store could not be reached (or answered too slowly); callers apply the fail mode."""


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One tenant's limits as the store enforces them (None = unlimited)."""

    rpm: int | None = None
    tpm: int | None = None
    concurrent: int | None = None
    budget_micros: int | None = None
    window_s: float = 60.0
    # A concurrency slot frees itself after this long even if its gateway died before releasing it.
    lease_s: float = 360.0

    @property
    def unlimited(self) -> bool:
        """No limit of any kind: admission needs no store round trip."""
        return self.rpm is None and self.tpm is None and self.concurrent is None and self.budget_micros is None


@dataclass(frozen=True, slots=True)
class AdmitResult:
    """What the store decided, atomically, for one request."""

    admitted: bool  # every check passed and rpm/tpm/lease were committed
    reason: LimitReason | None = None  # the first failing check (budget, concurrent, rpm, tpm)
    retry_after_s: float = 0.0  # when the failing rate checks would pass (0 for budget)
    lease_taken: bool = False  # a concurrency lease is held and must be released
    tokens_reserved: int = 0  # tokens charged to the TPM window (to reconcile at settle)


@dataclass(frozen=True, slots=True)
class Release:
    """The admission side of settle: free the lease and correct the TPM window to actual tokens."""

    tenant_id: str
    lease_id: str | None
    tpm: int | None
    token_delta: int  # actual - reserved (negative gives tokens back)
    window_s: float = 60.0


@dataclass(frozen=True, slots=True)
class SpendRecord:
    """One request's charge; `id` makes recording idempotent (a retry never double-counts)."""

    id: str
    tenant_id: str
    day: str  # YYYY-MM-DD (UTC)
    pool: str
    usd_micros: int
    uncached_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    requests: int = 1

    @property
    def month(self) -> str:
        """YYYY-MM: the budget period this charge counts against."""
        return self.day[:7]


@dataclass(slots=True)
class PoolUsage:
    """Sums for one tenant, day and pool."""

    usd_micros: int = 0
    uncached_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0

    def add(self, other: PoolUsage) -> None:
        """Accumulate another row into this one."""
        self.usd_micros += other.usd_micros
        self.uncached_tokens += other.uncached_tokens
        self.cached_tokens += other.cached_tokens
        self.output_tokens += other.output_tokens
        self.requests += other.requests


@dataclass(slots=True)
class DayUsage:
    """One tenant's spend on one day, by pool."""

    day: str
    pools: dict[str, PoolUsage] = field(default_factory=dict)

    def total(self) -> PoolUsage:
        """All pools together."""
        out = PoolUsage()
        for row in self.pools.values():
            out.add(row)
        return out


USAGE_FIELDS = ("usd_micros", "uncached_tokens", "cached_tokens", "output_tokens", "requests")


class Store(Protocol):
    """Shared state for limits, spend, API keys and learned volatility (Redis across replicas, or in-memory)."""

    async def admit(
        self, tenant_id: str, limits: LimitSpec, tokens: int, lease_id: str, month: str, force_lease: bool
    ) -> AdmitResult:
        """Check budget, concurrency, rpm and tpm together; commit all only if all pass.

        With `force_lease` a failing request still takes a concurrency lease (it will be served
        degraded, so it does occupy a slot) but charges nothing to the rpm/tpm windows.
        """
        ...

    async def settle(self, release: Release | None, spend: SpendRecord | None) -> None:
        """Release the lease, reconcile TPM and record spend in one round trip."""
        ...

    async def renew_lease(self, tenant_id: str, lease_id: str, lease_s: float) -> bool:
        """Move a held concurrency lease's expiry to `lease_s` from now; False when it is no longer held."""
        ...

    async def record_spend(self, records: Sequence[SpendRecord]) -> None:
        """Record several charges (idempotent per record id); used to flush buffered spend."""
        ...

    async def usage(self, tenant_id: str, days: Sequence[str]) -> list[DayUsage]:
        """Spend rows for the given days (days with nothing recorded come back empty)."""
        ...

    async def month_spend_micros(self, tenant_id: str, month: str) -> int:
        """Total charged to a tenant in a month (what the budget is checked against)."""
        ...

    async def put_key(self, key_hash: str, tenant_id: str, *, unless_revoked: bool = False) -> bool:
        """Map an API key hash to a tenant; with unless_revoked a revoked hash stays revoked."""
        ...

    async def key_tenant(self, key_hash: str) -> str | None:
        """The tenant an API key hash belongs to, or None."""
        ...

    async def tenant_keys(self, tenant_id: str) -> list[str]:
        """The key hashes a tenant holds, sorted."""
        ...

    async def revoke_key(self, tenant_id: str, key_hash: str) -> bool:
        """Unmap a key hash and remember it as revoked; False if the tenant did not hold it."""
        ...

    async def remember(self, name: str, value: str, ttl_s: float) -> None:
        """Keep a small routing fact (a response id's replica) for `ttl_s` seconds."""
        ...

    async def recall(self, name: str) -> str | None:
        """A fact kept by `remember`, while it lives."""
        ...

    async def add_volatile(self, tenant_id: str, fingerprints: Collection[int], forget: Collection[int] = ()) -> None:
        """Add template fingerprints a replica found volatile to the tenant's shared set; drop `forget` from it."""
        ...

    async def volatile_fingerprints(self, tenant_ids: Sequence[str]) -> dict[str, set[int]]:
        """Each tenant's shared set of volatile template fingerprints (at most VOLATILE_PER_TENANT each)."""
        ...

    async def share_load(self, process_id: str, payload: str | None, ttl_s: float) -> LoadShare:
        """Publish this gateway process's load payload, kept `ttl_s` (None: only read); the store's clock (µs)
        and every live process's (µs it was written by that clock, payload) by process id, this one's included."""
        ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
