"""Store on Redis, shared by every gateway replica: one Lua script per operation.

The two per-request scripts (admit, settle) go over `RespClient`: one persistent pipelined
connection with prebuilt command framing, a fraction of redis-py's CPU per call. Everything cold
(spend flushes, usage reads, API keys, ping) uses redis-py's pool. URLs the small client does not
speak (TLS, extra options) or `fast_path=False` send the scripts through redis-py too.

Keys live under `key_prefix`, a tenant's keys share the hash tag `{<tenant>}` so a Redis Cluster keeps
them in one slot (each script touches one tenant only). Calls time out fast (`socket_timeout`, 0.25 s:
each redis-py read and connect, and each pipelined command from send to reply) and after a failure
the store fails fast for `cooldown_s` instead of waiting on a dead server again; either way the
caller gets StoreUnavailable and applies the configured fail mode. A redis-py timeout fails only its own
call while the pipelined client exists: redis-py times a read on this process's loop, so a busy loop makes it
late without Redis being slow (a peer-load share timed out in a 100-request burst and the cool-off served 43
admits unenforced); the pipelined client, timed on Redis' answer, is what judges a slow server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Collection, Sequence
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
    StoreUnavailable,
    written_payload,
)
from app.store.redis_scripts import ADMIT, ADMIT_KEYS, RENEW_LEASE, SETTLE, SETTLE_KEYS, SHARE_LOAD
from app.store.resp import RespClient, RespError, ScriptCall
from app.store.resp_address import RespAddress, encode_command

T = TypeVar("T")
log = logging.getLogger(__name__)
US = 1_000_000
_DEDUPE_MS = str(SPEND_DEDUPE_S * 1000)
_KEEP_MS = str(SPEND_KEEP_S * 1000)
_DOWN_ERRORS = (RedisConnectionError, RedisTimeoutError, TimeoutError, OSError)

# KEYS: the tenant's volatile sorted set (member: fingerprint, score: µs it was last added, < 2^53)
# ARGV: keep µs, cap, number of fingerprints to add n, the n fingerprints, then the fingerprints to forget.
# Stale members (older than keep) go, then the oldest past the cap; the key lives `keep` past its last write.
_VOLATILE_ADD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local keep = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local score = string.format('%.0f', now)  -- a Lua number would be sent as %.14g: 16 digits need this
for i = 4, 3 + n do redis.call('ZADD', KEYS[1], score, ARGV[i]) end
for i = 4 + n, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - keep))
local size = redis.call('ZCARD', KEYS[1])
if size > cap then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, size - cap - 1) end
if size > 0 then redis.call('PEXPIRE', KEYS[1], string.format('%.0f', keep / 1000)) end
return size
"""
_VOLATILE_KEEP_US = str(VOLATILE_KEEP_S * US)


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
        fast_path: bool = True,
    ) -> None:
        # One retry, on connection errors only: after a Redis restart every idle pooled connection is
        # stale and redis-py fails the first command on each (it does not notice the close), which
        # would put the whole store, hot path included, into its cool-off. The cold commands are reads
        # or idempotent (spend dedupes by record id); with fast_path off the admit script goes this way
        # too, and a connection error there means the server closed or is gone, so a retry either runs
        # it once on a fresh connection or cannot connect. Timeouts are not retried: a slow server
        # must stay a fast failure.
        self._r: aioredis.Redis = aioredis.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            max_connections=max_connections,
        )
        self._p = key_prefix
        self._cooldown = cooldown_s
        self._down_until = 0.0
        self._admit = self._r.register_script(ADMIT)
        self._settle = self._r.register_script(SETTLE)
        self._volatile_add = self._r.register_script(_VOLATILE_ADD)
        self._share_load = self._r.register_script(SHARE_LOAD)
        self._renew_lease = self._r.register_script(RENEW_LEASE)
        self._admit_call = ScriptCall(ADMIT, ADMIT_KEYS, 9)
        self._settle_call = ScriptCall(SETTLE, SETTLE_KEYS, 13)
        addr = RespAddress.from_url(url) if fast_path else None
        self._fast = None if addr is None else RespClient(addr, socket_timeout_s)

    @property
    def fast_path(self) -> bool:
        """Whether admit/settle use the pipelined client (else redis-py)."""
        return self._fast is not None

    # -- plumbing ------------------------------------------------------------------------------
    def _t(self, tenant_id: str, name: str) -> str:
        return f"{self._p}{{{tenant_id}}}:{name}"

    def _check_up(self) -> None:
        if time.monotonic() < self._down_until:
            raise StoreUnavailable("redis marked down (cooling off)")

    def _down(self, err: Exception, *, cool: bool = True) -> StoreUnavailable:
        if cool:  # the whole store fails fast for `cooldown_s`; else only this call failed
            self._down_until = time.monotonic() + self._cooldown
        return StoreUnavailable(f"redis unavailable: {type(err).__name__}")

    @staticmethod
    def _server_error(err: Exception) -> StoreUnavailable:
        # A server-side error (read-only replica after failover, OOM, script error) must not become
        # a 500: it is treated like an outage, and logged because it is not one.
        log.error("redis error: %s", err)
        return StoreUnavailable(f"redis error: {type(err).__name__}")

    async def _call(self, aw: Awaitable[T]) -> T:
        try:
            self._check_up()
        except StoreUnavailable:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise
        try:
            # socket_timeout bounds every read and connect; no outer timer needed (it costs CPU per call).
            result = await aw
        except (RedisTimeoutError, TimeoutError) as err:
            raise self._down(err, cool=self._fast is None) from err
        except _DOWN_ERRORS as err:
            raise self._down(err) from err
        except RedisError as err:
            raise self._server_error(err) from err
        self._down_until = 0.0
        return result

    async def _script(self, call: ScriptCall, keys_and_args: list[str]) -> Any:
        """Run a hot script: EVALSHA on the pipelined connection, EVAL once if the server lost it."""
        fast = self._fast
        if fast is None:
            script = self._admit if call is self._admit_call else self._settle
            n = call.numkeys
            return await self._call(script(keys=keys_and_args[:n], args=keys_and_args[n:]))
        self._check_up()
        body = call.body(keys_and_args)
        try:
            try:
                reply = await fast.execute(call.evalsha_head + body)
            except RespError as err:
                if not err.noscript:
                    raise
                # NOSCRIPT means it did not run; EVAL runs it and caches it for the next EVALSHA.
                reply = await fast.execute(call.eval_head + body)
        except _DOWN_ERRORS as err:
            raise self._down(err) from err
        except RespError as err:
            raise self._server_error(err) from err
        self._down_until = 0.0
        return reply

    def _settle_args(self, release: Release | None, spend: SpendRecord | None) -> list[str]:
        """SETTLE's keys then args, as strings (see redis_scripts.SETTLE)."""
        tenant = release.tenant_id if release is not None else spend.tenant_id if spend is not None else ""
        t = f"{self._p}{{{tenant}}}:"
        out = [
            t + "tpm",
            t + "conc",
            f"{t}month:{spend.month if spend is not None else '-'}",
            f"{t}day:{spend.day if spend is not None else '-'}",
            f"{t}spent:{spend.id if spend is not None else '-'}",
        ]
        if release is not None:
            out += [release.lease_id or "", str(release.tpm or 0), str(release.token_delta),
                    str(int(release.window_s * US))]
        else:
            out += ["", "0", "0", "0"]
        if spend is not None:
            out += ["1", spend.pool, str(spend.usd_micros), str(spend.uncached_tokens), str(spend.cached_tokens),
                    str(spend.output_tokens), str(spend.requests)]
        else:
            out += ["0", "-", "0", "0", "0", "0", "0"]
        out += [_DEDUPE_MS, _KEEP_MS]
        return out

    # -- limits --------------------------------------------------------------------------------
    async def admit(
        self, tenant_id: str, limits: LimitSpec, tokens: int, lease_id: str, month: str, force_lease: bool
    ) -> AdmitResult:
        """Check budget, concurrency, rpm and tpm together in one script; commit only if all pass."""
        t = f"{self._p}{{{tenant_id}}}:"
        reply = await self._script(self._admit_call, [
            t + "rpm",
            t + "tpm",
            t + "conc",
            f"{t}month:{month}",
            str(limits.rpm or 0),
            str(limits.tpm or 0),
            str(limits.concurrent or 0),
            "-1" if limits.budget_micros is None else str(limits.budget_micros),
            str(tokens),
            lease_id,
            str(int(limits.lease_s * US)),
            str(int(limits.window_s * US)),
            "1" if force_lease else "0",
        ])
        text: str = reply.decode() if isinstance(reply, bytes) else reply
        ok, reason, retry_us, lease, reserved = text.split("|")
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
        await self._script(self._settle_call, self._settle_args(release, spend))

    async def renew_lease(self, tenant_id: str, lease_id: str, lease_s: float) -> bool:
        """Move a held lease's expiry (rare: one call per long stream every lease_s / 3)."""
        key = self._t(tenant_id, "conc")
        held = await self._call(self._renew_lease(keys=[key], args=[lease_id, int(lease_s * US)]))
        return bool(held)

    async def record_spend(self, records: Sequence[SpendRecord]) -> None:
        """Record several charges in one pipelined round trip (idempotent per record id)."""
        if not records:
            return
        pipe = self._r.pipeline(transaction=False)
        for r in records:
            keys_and_args = self._settle_args(None, r)
            await self._settle(keys=keys_and_args[:SETTLE_KEYS], args=keys_and_args[SETTLE_KEYS:], client=pipe)
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
        return await self._get(f"{self._p}key:{key_hash}")

    async def remember(self, name: str, value: str, ttl_s: float) -> None:
        """SET with an expiry: any gateway replica can read it back (on the pipelined connection: it runs
        once per Responses request, and through redis-py it cost as much CPU as the limiter's settle)."""
        key, px = f"{self._p}fact:{name}", max(int(ttl_s * 1000), 1)
        if self._fast is None:
            await self._call(self._r.set(key, value, px=px))
            return
        await self._fast_command(encode_command("SET", key, value, "PX", px))

    async def recall(self, name: str) -> str | None:
        """GET a remembered fact."""
        return await self._get(f"{self._p}fact:{name}")

    async def _get(self, key: str) -> str | None:
        """GET on the pipelined connection when there is one: the hot path's reads (a key lookup, a response's
        holder) ride with its scripts, so a burst of them is one write instead of one pooled connection each."""
        if self._fast is None:
            value = await self._call(self._r.get(key))
            return None if value is None else str(value)
        reply = await self._fast_command(encode_command("GET", key))
        return None if reply is None else bytes(reply).decode()

    async def _fast_command(self, payload: bytes) -> Any:
        assert self._fast is not None
        self._check_up()
        try:
            reply = await self._fast.execute(payload)
        except _DOWN_ERRORS as err:
            raise self._down(err) from err
        except RespError as err:
            raise self._server_error(err) from err
        self._down_until = 0.0
        return reply

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

    # -- learned volatility --------------------------------------------------------------------
    async def add_volatile(self, tenant_id: str, fingerprints: Collection[int], forget: Collection[int] = ()) -> None:
        """One script on the tenant's sorted set: add (refreshing their time), forget, expire, cap."""
        if not fingerprints and not forget:
            return
        args = [_VOLATILE_KEEP_US, str(VOLATILE_PER_TENANT), str(len(fingerprints))]
        args += [str(fp) for fp in fingerprints]
        args += [str(fp) for fp in forget]
        await self._call(self._volatile_add(keys=[self._t(tenant_id, "volatile")], args=args))

    async def volatile_fingerprints(self, tenant_ids: Sequence[str]) -> dict[str, set[int]]:
        """Every tenant's set in one pipelined round trip (what is not a fingerprint is skipped)."""
        if not tenant_ids:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for tid in tenant_ids:
            pipe.zrange(self._t(tid, "volatile"), 0, VOLATILE_PER_TENANT - 1)
        replies: list[list[str]] = await self._call(pipe.execute())
        return {tid: {int(m) for m in members if m.isdigit()} for tid, members in zip(tenant_ids, replies, strict=True)}

    async def share_load(self, process_id: str, payload: str | None, ttl_s: float) -> LoadShare:
        """One script on the load hash: publish ours (unless None), expire the silent, read every process's."""
        args = [process_id, str(max(int(ttl_s * 1000), 1)), payload or ""]
        reply: list[str] = await self._call(self._share_load(keys=[f"{self._p}in_flight"], args=args))
        return int(reply[0]), {pid: written_payload(v) for pid, v in zip(reply[1::2], reply[2::2], strict=True)}

    async def ping(self) -> None:
        """Raise StoreUnavailable unless Redis answers."""
        await self._call(self._r.ping())

    async def aclose(self) -> None:
        """Close the pipelined connection and the connection pool."""
        if self._fast is not None:
            await self._fast.aclose()
        await self._r.aclose()
