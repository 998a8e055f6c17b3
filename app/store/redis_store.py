"""Store on Redis, shared by every gateway replica: one connection pool, one Lua script per operation.

Keys live under `key_prefix`, a tenant's keys share the hash tag `{<tenant>}` so a Redis Cluster keeps
them in one slot (each script touches one tenant only). Calls time out fast (`socket_timeout`, 0.25 s)
and after a failure the store fails fast for `cooldown_s` instead of waiting on a dead server again;
either way the caller gets StoreUnavailable and applies the configured fail mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.store.base import (
    SPEND_DEDUPE_S,
    SPEND_KEEP_S,
    USAGE_FIELDS,
    AdmitResult,
    DayUsage,
    LimitReason,
    LimitSpec,
    PoolUsage,
    Release,
    SpendRecord,
    StoreUnavailable,
)
from app.store.redis_scripts import ADMIT, SETTLE

T = TypeVar("T")
log = logging.getLogger(__name__)
US = 1_000_000
_DOWN_ERRORS = (RedisConnectionError, RedisTimeoutError, TimeoutError, OSError)


class RedisStore:
    """A Store on a Redis server (standalone; cluster-ready key layout)."""

    def __init__(
        self,
        url: str,
        key_prefix: str = "kvgate:",
        *,
        socket_timeout_s: float = 0.25,
        cooldown_s: float = 0.5,
        max_connections: int = 512,
    ) -> None:
        # No client-side retries: a retry loop is what stalls requests while Redis is down.
        self._r: aioredis.Redis = aioredis.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 0),
            max_connections=max_connections,
        )
        self._p = key_prefix
        self._cooldown = cooldown_s
        self._down_until = 0.0
        self._admit = self._r.register_script(ADMIT)
        self._settle = self._r.register_script(SETTLE)

    # -- plumbing ------------------------------------------------------------------------------
    def _t(self, tenant_id: str, name: str) -> str:
        return f"{self._p}{{{tenant_id}}}:{name}"

    async def _call(self, aw: Awaitable[T]) -> T:
        if time.monotonic() < self._down_until:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise StoreUnavailable("redis marked down (cooling off)")
        try:
            # socket_timeout bounds every read and connect; no outer timer needed (it costs CPU per call).
            result = await aw
        except _DOWN_ERRORS as err:
            self._down_until = time.monotonic() + self._cooldown
            raise StoreUnavailable(f"redis unavailable: {type(err).__name__}") from err
        except RedisError as err:
            # A server-side error (read-only replica after failover, OOM, script error) must not become
            # a 500: it is treated like an outage, and logged because it is not one.
            log.error("redis error: %s", err)
            raise StoreUnavailable(f"redis error: {type(err).__name__}") from err
        self._down_until = 0.0
        return result

    def _settle_args(self, release: Release | None, spend: SpendRecord | None) -> tuple[list[str], list[Any]]:
        tenant = release.tenant_id if release is not None else spend.tenant_id if spend is not None else ""
        day = spend.day if spend is not None else "-"
        keys = [
            self._t(tenant, "tpm"),
            self._t(tenant, "conc"),
            self._t(tenant, f"month:{spend.month if spend is not None else '-'}"),
            self._t(tenant, f"day:{day}"),
            self._t(tenant, f"spent:{spend.id if spend is not None else '-'}"),
        ]
        args: list[Any] = [
            (release.lease_id or "") if release is not None else "",
            (release.tpm or 0) if release is not None else 0,
            release.token_delta if release is not None else 0,
            int(release.window_s * US) if release is not None else 0,
            "1" if spend is not None else "0",
        ]
        if spend is not None:
            args += [
                spend.pool,
                spend.usd_micros,
                spend.uncached_tokens,
                spend.cached_tokens,
                spend.output_tokens,
                spend.requests,
            ]
        else:
            args += ["-", 0, 0, 0, 0, 0]
        args += [SPEND_DEDUPE_S * 1000, SPEND_KEEP_S * 1000]
        return keys, args

    # -- limits --------------------------------------------------------------------------------
    async def admit(
        self, tenant_id: str, limits: LimitSpec, tokens: int, lease_id: str, month: str, force_lease: bool
    ) -> AdmitResult:
        """Check budget, concurrency, rpm and tpm together in one script; commit only if all pass."""
        keys = [
            self._t(tenant_id, "rpm"),
            self._t(tenant_id, "tpm"),
            self._t(tenant_id, "conc"),
            self._t(tenant_id, f"month:{month}"),
        ]
        args: list[Any] = [
            limits.rpm or 0,
            limits.tpm or 0,
            limits.concurrent or 0,
            -1 if limits.budget_micros is None else limits.budget_micros,
            tokens,
            lease_id,
            int(limits.lease_s * US),
            int(limits.window_s * US),
            "1" if force_lease else "0",
        ]
        reply: str = await self._call(self._admit(keys=keys, args=args))
        ok, reason, retry_us, lease, reserved = reply.split("|")
        why: LimitReason | None = reason or None  # type: ignore[assignment]
        return AdmitResult(
            admitted=ok == "1",
            reason=why,
            retry_after_s=int(retry_us) / US,
            lease_taken=lease == "1",
            tokens_reserved=int(reserved),
        )

    async def settle(self, release: Release | None, spend: SpendRecord | None) -> None:
        """Release the lease, reconcile TPM and record spend in one script call."""
        keys, args = self._settle_args(release, spend)
        await self._call(self._settle(keys=keys, args=args))

    async def record_spend(self, records: Sequence[SpendRecord]) -> None:
        """Record several charges in one pipelined round trip (idempotent per record id)."""
        if not records:
            return
        pipe = self._r.pipeline(transaction=False)
        for r in records:
            keys, args = self._settle_args(None, r)
            await self._settle(keys=keys, args=args, client=pipe)
        await self._call(pipe.execute())

    # -- reads ---------------------------------------------------------------------------------
    async def usage(self, tenant_id: str, days: Sequence[str]) -> list[DayUsage]:
        """Spend rows for the given days, one pipelined round trip."""
        pipe = self._r.pipeline(transaction=False)
        for day in days:
            pipe.hgetall(self._t(tenant_id, f"day:{day}"))
        rows: list[dict[str, str]] = await self._call(pipe.execute())
        out = []
        for day, raw in zip(days, rows, strict=True):
            pools: dict[str, PoolUsage] = {}
            for name, value in raw.items():
                pool, _, fld = name.rpartition("|")
                if fld in USAGE_FIELDS:
                    setattr(pools.setdefault(pool, PoolUsage()), fld, int(value))
            out.append(DayUsage(day, pools))
        return out

    async def month_spend_micros(self, tenant_id: str, month: str) -> int:
        """Total charged to a tenant in a month."""
        value = await self._call(self._r.get(self._t(tenant_id, f"month:{month}")))
        return int(value or 0)

    # -- keys ----------------------------------------------------------------------------------
    async def put_key(self, key_hash: str, tenant_id: str, *, unless_revoked: bool = False) -> bool:
        """Map an API key hash to a tenant (key map and tenant set live in different slots)."""
        if unless_revoked:
            revoked: int = await self._call(self._r.exists(f"{self._p}revoked:{key_hash}"))
            if revoked:
                return False
        pipe = self._r.pipeline(transaction=False)
        pipe.delete(f"{self._p}revoked:{key_hash}")
        pipe.set(f"{self._p}key:{key_hash}", tenant_id)
        pipe.sadd(self._t(tenant_id, "keys"), key_hash)
        await self._call(pipe.execute())
        return True

    async def key_tenant(self, key_hash: str) -> str | None:
        """The tenant an API key hash belongs to."""
        value = await self._call(self._r.get(f"{self._p}key:{key_hash}"))
        return None if value is None else str(value)

    async def tenant_keys(self, tenant_id: str) -> list[str]:
        """The key hashes a tenant holds, sorted."""
        members = await self._call(self._r.smembers(self._t(tenant_id, "keys")))
        return sorted(str(m) for m in members)

    async def revoke_key(self, tenant_id: str, key_hash: str) -> bool:
        """Unmap a key hash and remember it as revoked."""
        removed = await self._call(self._r.srem(self._t(tenant_id, "keys"), key_hash))
        if not removed:
            return False
        pipe = self._r.pipeline(transaction=False)
        pipe.delete(f"{self._p}key:{key_hash}")
        pipe.set(f"{self._p}revoked:{key_hash}", "1")
        await self._call(pipe.execute())
        return True

    async def ping(self) -> None:
        """Raise StoreUnavailable unless Redis answers."""
        await self._call(self._r.ping())

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._r.aclose()
