"""The spend ledger: per tenant, per day, per pool, in integer micro-dollars.

Spend the store cannot take right now (Redis down) waits in a bounded in-process buffer and is
flushed when the store answers again. Every record carries an id the store remembers for
SPEND_DEDUPE_S, so a record whose first write timed out after Redis applied it still counts once.
"Acknowledged" spend is spend the store applied or this buffer holds; only a gateway process that
dies with a non-empty buffer (or a buffer overflow, counted in `dropped`) loses spend.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from app.cancel import raise_if_cancelled
from app.context import RequestContext
from app.store.base import MICROS_PER_USD, DayUsage, PoolUsage, SpendRecord, Store, StoreUnavailable

log = logging.getLogger(__name__)


def usd_to_micros(usd: float) -> int:
    """Dollars → integer micro-dollars (rounded half to even)."""
    return round(usd * MICROS_PER_USD)


def spend_record(ctx: RequestContext, tenant_id: str, record_id: str, when: datetime | None = None) -> SpendRecord:
    """The charge one finished request makes: its cost, tokens split by type, and pool."""
    day = (when or datetime.now(UTC)).date().isoformat()
    return SpendRecord(
        id=record_id,
        tenant_id=tenant_id,
        day=day,
        pool=ctx.route.pool if ctx.route is not None else "-",
        usd_micros=usd_to_micros(ctx.cost_usd),
        uncached_tokens=ctx.usage.uncached_tokens,
        cached_tokens=ctx.usage.cached_tokens,
        output_tokens=ctx.usage.completion_tokens,
        requests=1,
    )


class SpendLedger:
    """Writes spend to the store, buffering (bounded) what it cannot write yet."""

    def __init__(self, store: Store, max_pending: int = 50_000, flush_batch: int = 500) -> None:
        self._store = store
        self._pending: deque[SpendRecord] = deque()
        self._max = max_pending
        self._batch = flush_batch
        self._flushing = False
        self.dropped = 0

    @property
    def pending(self) -> int:
        """Records waiting for the store."""
        return len(self._pending)

    def buffer(self, record: SpendRecord) -> None:
        """Keep a record the store could not take; the oldest is dropped (and counted) when full."""
        if len(self._pending) >= self._max:
            self._pending.popleft()
            self.dropped += 1
            log.error("spend buffer full: dropped a record (%d dropped so far)", self.dropped)
        self._pending.append(record)

    async def record(self, record: SpendRecord) -> None:
        """Write one record now, or buffer it if the store is unreachable."""
        try:
            await self._store.record_spend([record])
        except StoreUnavailable:
            self.buffer(record)

    async def flush(self) -> int:
        """Write buffered records in batches until empty or the store fails; returns how many went."""
        if self._flushing or not self._pending:
            return 0
        self._flushing = True
        sent = 0
        try:
            while self._pending:
                batch = [self._pending[i] for i in range(min(self._batch, len(self._pending)))]
                try:
                    await self._store.record_spend(batch)
                except StoreUnavailable:
                    break
                for _ in batch:
                    self._pending.popleft()
                sent += len(batch)
        finally:
            self._flushing = False
        if sent:
            log.info("flushed %d buffered spend records (%d still pending)", sent, len(self._pending))
        return sent

    async def run(self, interval_s: float = 1.0) -> None:
        """Flush periodically (a background task the app starts and cancels)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.flush()
            except Exception:  # a flusher that dies silently would strand spend
                log.exception("spend flush failed")
            raise_if_cancelled()  # the store's client may have swallowed a stop


def recent_days(n: int, today: date | None = None) -> list[str]:
    """The last `n` UTC days, newest first, as YYYY-MM-DD."""
    end = today or datetime.now(UTC).date()
    return [(end - timedelta(days=i)).isoformat() for i in range(n)]


def _row(u: PoolUsage) -> dict[str, Any]:
    return {
        "usd": u.usd_micros / MICROS_PER_USD,
        "usd_micros": u.usd_micros,
        "requests": u.requests,
        "tokens": {"uncached": u.uncached_tokens, "cached": u.cached_tokens, "output": u.output_tokens},
    }


def usage_report(days: Sequence[DayUsage]) -> dict[str, Any]:
    """Spend by day and by pool, plus totals, as the admin API returns it."""
    total = PoolUsage()
    by_pool: dict[str, PoolUsage] = {}
    out_days = []
    for d in days:
        day_total = d.total()
        total.add(day_total)
        for pool, row in d.pools.items():
            by_pool.setdefault(pool, PoolUsage()).add(row)
        out_days.append({"day": d.day, **_row(day_total), "pools": {p: _row(r) for p, r in sorted(d.pools.items())}})
    return {
        "days": out_days,
        "pools": {p: _row(r) for p, r in sorted(by_pool.items())},
        "total": _row(total),
    }
