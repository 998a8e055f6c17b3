"""Tenancy: `Authorization: Bearer <key>` → tenant. Keys are kept only as sha256 hex digests.

Lookups are cached in-process for `auth.key_cache_ttl_s` (default 5 s), so a key revoked through another
gateway replica stops working here within that TTL; a revoke through this replica's admin API
invalidates the cache at once. When the store is unreachable, keys listed in the config still
resolve (from their hashes kept here) and so do cached keys; other keys get 503 (they cannot be
verified, and serving them anonymously would bill the wrong tenant), with `auth.required: false` too.

Sources of truth:
- config keys (`tenants[].api_keys`): the config. The store holds a copy, written at start-up and again
  whenever the store answers "unknown" for one (an emptied Redis: FLUSHALL, a restart without persistence,
  eviction), so an empty store never turns a configured key into a 401. A config key revoked through the
  admin API stays revoked while the store keeps its `revoked:` marker; to retire one for good, remove it from
  the config (an emptied store forgets the marker, and the config brings the key back).
- admin-minted keys (POST /admin/tenants/{id}/keys): the store alone. With Redis they live as long as its
  data (persist it: `appendonly yes`); an emptied Redis or the in-memory store's restart forgets them, and
  their holders get 401 until new keys are minted.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable

from app.config import GatewayConfig, LimitsConfig, TenantConfig
from app.context import Tenant
from app.cost import reference_prices
from app.errors import invalid_key, store_unavailable
from app.limits import limit_spec
from app.normalize.salt import cache_salt_for
from app.store.base import Store, StoreUnavailable

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
_CACHE_MAX = 10_000
_MIN_PREFIX = 8


def hash_key(key: str) -> str:
    """sha256 hex of a plaintext key; a configured `sha256:<hex>` entry is taken as already hashed."""
    if key.startswith("sha256:"):
        return key[len("sha256:") :]
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of a `Bearer` Authorization header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def keys_match(presented: str, allowed_hashes: set[str]) -> bool:
    """Whether a plaintext key hashes to one of `allowed_hashes` (constant-time per comparison)."""
    digest = hash_key(presented) if not presented.startswith("sha256:") else ""
    return any(hmac.compare_digest(digest, h) for h in allowed_hashes)


def lease_seconds(cfg: GatewayConfig) -> float:
    """How long a concurrency slot outlives a gateway that died holding it: the longest upstream read, plus a
    minute (a live stream renews its lease long before that)."""
    return cfg.upstream.read_timeout_s + 60


def _tenant_from(tc: TenantConfig, salt_secret: str, lease_s: float) -> Tenant:
    return Tenant(
        id=tc.id,
        cache_salt=None if tc.shared_cache else cache_salt_for(tc.id, salt_secret),
        default_class=tc.default_class,
        normalize=tc.normalize,
        normalize_rules=frozenset(tc.normalize_rules) if tc.normalize_rules is not None else None,
        capture_content=tc.capture_content,
        shared_cache=tc.shared_cache,
        limits=tc.limits,
        limit_spec=limit_spec(tc.limits, lease_s),
        reference_prices=reference_prices(tc.reference_price),
    )


class TenantRegistry:
    """Config tenants plus the store's key → tenant map, with a short in-process cache."""

    def __init__(
        self,
        cfg: GatewayConfig,
        store: Store,
        *,
        cache_ttl_s: float | None = None,
        lease_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._required = cfg.auth.required
        self._anonymous_keys = frozenset(cfg.auth.anonymous_keys) if not cfg.auth.required else frozenset()
        self._store = store
        self._ttl = cfg.auth.key_cache_ttl_s if cache_ttl_s is None else cache_ttl_s
        self._clock = clock
        secret = cfg.normalize.salt_secret
        lease = lease_seconds(cfg) if lease_s is None else lease_s
        # Each tenant is built here once, whole (salt, limits, prices): every request of it carries this record.
        self._tenants = {t.id: _tenant_from(t, secret, lease) for t in cfg.tenants}
        self._anonymous = self._tenants.get(ANONYMOUS) or _tenant_from(TenantConfig(id=ANONYMOUS), secret, lease)
        # Hashes only: the plaintext of config keys is dropped here.
        self._config_keys = {hash_key(k): t.id for t in cfg.tenants for k in t.api_keys}
        self._cache: dict[str, tuple[str | None, float]] = {}
        self._loaded = False

    async def load(self) -> None:
        """Write config keys' sha256 into the store (a key revoked via admin stays revoked)."""
        try:
            for key_hash, tenant_id in self._config_keys.items():
                await self._store.put_key(key_hash, tenant_id, unless_revoked=True)
        except StoreUnavailable:
            log.warning("store unavailable while loading API keys; will retry on the next lookup")
            return
        self._loaded = True

    # -- lookups -------------------------------------------------------------------------------
    def tenant(self, tenant_id: str) -> Tenant | None:
        """The configured tenant with this id."""
        return self._tenants.get(tenant_id)

    def tenant_ids(self) -> list[str]:
        """Configured tenant ids, sorted."""
        return sorted(self._tenants)

    def limits_for(self, tenant_id: str) -> LimitsConfig:
        """The tenant's limits (no limits for an unknown/anonymous tenant without config); for the admin API; the
        request path reads them from its tenant record."""
        tenant = self._tenants.get(tenant_id)
        return tenant.limits if tenant is not None else LimitsConfig()

    async def resolve(self, authorization: str | None, api_key: str | None = None) -> Tenant:
        """The tenant an `Authorization: Bearer` (or Anthropic's `x-api-key`) header names. No key: anonymous
        unless auth is required (401); a key that names no tenant: 401 always."""
        token = bearer_token(authorization) or (api_key.strip() if api_key and api_key.strip() else None)
        if token is None or token in self._anonymous_keys:
            if self._required:
                raise invalid_key(
                    "You didn't provide an API key. Provide it in an Authorization header (Bearer <key>)"
                    " or an x-api-key header."
                )
            return self._anonymous
        # A key that cannot be verified (store down) is a 503 even where anonymous access is allowed: serving
        # it anonymously would take a wrong key for no key.
        tenant_id = await self._lookup(hash_key(token) if not token.startswith("sha256:") else "")
        tenant = self._tenants.get(tenant_id) if tenant_id is not None else None
        if tenant is not None:
            return tenant
        # A key that was sent must be valid, even where anonymous access is allowed: a typo'd key would
        # otherwise lose its tenant's limits, normalization and billing without a sign.
        raise invalid_key("Incorrect API key provided.")

    async def _lookup(self, key_hash: str) -> str | None:
        if not key_hash:
            return None
        now = self._clock()
        hit = self._cache.get(key_hash)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            if not self._loaded:
                await self.load()
            tenant_id = await self._store.key_tenant(key_hash)
            if tenant_id is None and key_hash in self._config_keys:
                tenant_id = await self._reseed(key_hash)
        except StoreUnavailable:
            if hit is not None:
                return hit[0]  # stale, but the best answer while the store is down
            if key_hash in self._config_keys:
                return self._config_keys[key_hash]
            raise store_unavailable("Shared state is unavailable; the API key cannot be verified.") from None
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[key_hash] = (tenant_id, now + self._ttl)
        return tenant_id

    async def _reseed(self, key_hash: str) -> str | None:
        """A config key the store does not know (emptied, restarted, evicted): write it back unless revoked."""
        tenant_id = self._config_keys[key_hash]
        if await self._store.put_key(key_hash, tenant_id, unless_revoked=True):
            log.warning("config API key of tenant %s was missing from the store; written back", tenant_id)
            return tenant_id
        return None

    # -- key management (admin) -----------------------------------------------------------------
    async def create_key(self, tenant_id: str) -> tuple[str, str]:
        """Mint a key for a configured tenant; returns (plaintext, hash). Only the hash is stored."""
        if tenant_id not in self._tenants:
            raise KeyError(tenant_id)
        plaintext = f"sk-kvgate-{secrets.token_urlsafe(32)}"
        key_hash = hash_key(plaintext)
        await self._store.put_key(key_hash, tenant_id)
        self._cache.pop(key_hash, None)
        return plaintext, key_hash

    async def revoke_key(self, tenant_id: str, hash_prefix: str) -> str:
        """Revoke the tenant's key whose hash starts with `hash_prefix`; returns the full hash.

        Raises KeyError (no such key) or ValueError (prefix too short or ambiguous).
        """
        if len(hash_prefix) < _MIN_PREFIX:
            raise ValueError(f"give at least {_MIN_PREFIX} hex digits of the key hash")
        matches = [h for h in await self._store.tenant_keys(tenant_id) if h.startswith(hash_prefix.lower())]
        if not matches:
            raise KeyError(hash_prefix)
        if len(matches) > 1:
            raise ValueError("prefix matches more than one key; give more digits")
        key_hash = matches[0]
        await self._store.revoke_key(tenant_id, key_hash)
        self._config_keys.pop(key_hash, None)
        self._cache[key_hash] = (None, self._clock() + self._ttl)
        return key_hash
