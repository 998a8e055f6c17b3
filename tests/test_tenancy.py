"""Tenancy: bearer key → tenant via sha256 in the store, OpenAI-shaped 401, anonymous, cache and revocation."""

from __future__ import annotations

import hashlib

import orjson
import pytest
import redis

from app.config import ReferencePrice
from app.cost import reference_prices
from app.errors import GatewayError
from app.records import TokenPrices
from app.store.base import LimitSpec, Store
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from app.tenancy import TenantRegistry, bearer_token, hash_key
from tests.servers import free_port
from tests.store.helpers import ACME_KEY, BETA_KEY, config
from tests.store.redis_fixtures import redis_dump


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def loaded(store: Store, **cfg: object) -> TenantRegistry:
    reg = TenantRegistry(config(**cfg), store)  # type: ignore[arg-type]
    await reg.load()
    return reg


def test_bearer_token_parses_the_scheme_case_insensitively() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


async def test_plaintext_and_sha256_config_keys_resolve_to_their_tenants(any_store: Store) -> None:
    reg = await loaded(any_store)
    assert (await reg.resolve(f"Bearer {ACME_KEY}")).id == "acme"
    beta = await reg.resolve(f"Bearer {BETA_KEY}")
    assert beta.id == "beta"
    assert (await reg.resolve(f"Bearer {ACME_KEY}")).default_class == "interactive"


@pytest.mark.parametrize("header", [None, "Bearer sk-nope", "Token sk-acme-dev"])
async def test_missing_or_unknown_key_is_401_in_openai_shape_when_required(
    any_store: Store, header: str | None
) -> None:
    reg = await loaded(any_store)
    with pytest.raises(GatewayError) as err:
        await reg.resolve(header)
    assert err.value.status == 401
    body = orjson.loads(err.value.body())["error"]
    assert (body["type"], body["code"]) == ("invalid_request_error", "invalid_api_key")
    assert set(body) == {"message", "type", "param", "code"}


async def test_the_stored_hash_itself_is_not_a_key(any_store: Store) -> None:
    reg = await loaded(any_store)
    with pytest.raises(GatewayError):
        await reg.resolve(f"Bearer sha256:{hash_key(ACME_KEY)}")
    with pytest.raises(GatewayError):
        await reg.resolve(f"Bearer {hash_key(ACME_KEY)}")


@pytest.mark.parametrize("header", [None, "Bearer", "Basic abc", "Bearer EMPTY"])
async def test_without_required_auth_callers_without_a_key_are_anonymous(any_store: Store, header: str | None) -> None:
    reg = await loaded(any_store, required=False)
    assert (await reg.resolve(header)).id == "anonymous"
    assert (await reg.resolve(f"Bearer {ACME_KEY}")).id == "acme"


@pytest.mark.parametrize("required", [True, False])
async def test_a_key_that_names_no_tenant_is_401_even_when_auth_is_optional(any_store: Store, required: bool) -> None:
    reg = await loaded(any_store, required=required)
    with pytest.raises(GatewayError) as info:
        await reg.resolve("Bearer sk-typo")
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    with pytest.raises(GatewayError):
        await reg.resolve(None, "sk-typo")


async def test_plaintext_config_keys_never_reach_the_redis_store(redis_url: str, key_prefix: str) -> None:
    store = RedisStore(redis_url, key_prefix, socket_timeout_s=2)
    try:
        await loaded(store)
    finally:
        await store.aclose()
    dump = "\n".join(redis_dump(redis_url, key_prefix))
    assert hashlib.sha256(ACME_KEY.encode()).hexdigest() in dump
    assert ACME_KEY not in dump and BETA_KEY not in dump


async def test_a_revoke_elsewhere_takes_effect_here_within_the_cache_ttl(any_store: Store) -> None:
    clock = Clock()
    here = TenantRegistry(config(), any_store, cache_ttl_s=5, clock=clock)
    there = TenantRegistry(config(), any_store)
    await here.load()
    assert (await here.resolve(f"Bearer {ACME_KEY}")).id == "acme"
    await there.revoke_key("acme", hash_key(ACME_KEY)[:10])
    assert (await here.resolve(f"Bearer {ACME_KEY}")).id == "acme"  # cached
    clock.now += 5.1
    with pytest.raises(GatewayError):
        await here.resolve(f"Bearer {ACME_KEY}")


async def test_a_revoke_on_this_replica_takes_effect_at_once(any_store: Store) -> None:
    reg = await loaded(any_store)
    assert (await reg.resolve(f"Bearer {ACME_KEY}")).id == "acme"
    await reg.revoke_key("acme", hash_key(ACME_KEY)[:8])
    with pytest.raises(GatewayError):
        await reg.resolve(f"Bearer {ACME_KEY}")
    # A restart reloads config keys, but a revoked one stays revoked.
    again = await loaded(any_store)
    with pytest.raises(GatewayError):
        await again.resolve(f"Bearer {ACME_KEY}")


async def test_minted_keys_resolve_and_only_their_hash_is_kept(any_store: Store) -> None:
    reg = await loaded(any_store)
    plaintext, key_hash = await reg.create_key("beta")
    assert (await reg.resolve(f"Bearer {plaintext}")).id == "beta"
    assert key_hash in await any_store.tenant_keys("beta")
    with pytest.raises(KeyError):
        await reg.create_key("nobody")


async def test_revoke_needs_an_unambiguous_prefix_of_a_held_key(any_store: Store) -> None:
    reg = await loaded(any_store)
    with pytest.raises(ValueError):
        await reg.revoke_key("acme", "abc")
    with pytest.raises(KeyError):
        await reg.revoke_key("acme", hash_key(BETA_KEY)[:12])


async def test_with_redis_down_config_keys_still_resolve_and_others_get_503() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:")
    try:
        reg = await loaded(store)
        assert (await reg.resolve(f"Bearer {ACME_KEY}")).id == "acme"
        with pytest.raises(GatewayError) as err:
            await reg.resolve("Bearer sk-minted-elsewhere")
        assert err.value.status == 503
    finally:
        await store.aclose()


async def test_with_redis_down_and_auth_optional_an_unverifiable_key_is_503_not_anonymous() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x:")
    try:
        reg = await loaded(store, required=False)
        with pytest.raises(GatewayError) as err:
            await reg.resolve("Bearer sk-minted-elsewhere")
        assert err.value.status == 503
        assert (await reg.resolve(f"Bearer {ACME_KEY}")).id == "acme"
        assert (await reg.resolve(None)).id == "anonymous"
    finally:
        await store.aclose()


def _empty(store: Store, redis_url: str, key_prefix: str) -> None:
    """What FLUSHALL, a Redis restart without persistence or eviction leave: none of the store's keys."""
    if isinstance(store, MemoryStore):
        store._keys.clear()
        store._tenant_keys.clear()
        store._revoked.clear()
        return
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{key_prefix}*", count=500):
        client.delete(key)
    client.close()


@pytest.mark.parametrize("auth_required", [True, False])
async def test_config_keys_resolve_after_the_store_forgot_them(
    any_store: Store, redis_url: str, key_prefix: str, auth_required: bool
) -> None:
    reg = TenantRegistry(config(required=auth_required), any_store, cache_ttl_s=0)
    await reg.load()
    assert (await reg.resolve(f"Bearer {ACME_KEY}")).id == "acme"
    _empty(any_store, redis_url, key_prefix)
    assert (await reg.resolve(f"Bearer {ACME_KEY}")).id == "acme"
    assert (await reg.resolve(None, BETA_KEY)).id == "beta"
    # ... and they are written back, so a gateway that never held them (another process) finds them too.
    assert await any_store.key_tenant(hash_key(ACME_KEY)) == "acme"


async def test_a_config_key_revoked_elsewhere_is_not_written_back(any_store: Store) -> None:
    here = await loaded(any_store)
    there = await loaded(any_store)
    await there.revoke_key("acme", hash_key(ACME_KEY)[:10])
    with pytest.raises(GatewayError) as err:
        await here.resolve(f"Bearer {ACME_KEY}")
    assert err.value.status == 401
    assert await any_store.key_tenant(hash_key(ACME_KEY)) is None


async def test_minted_keys_live_in_the_store_alone_and_an_emptied_store_forgets_them(
    any_store: Store, redis_url: str, key_prefix: str
) -> None:
    reg = TenantRegistry(config(), any_store, cache_ttl_s=0)
    await reg.load()
    plaintext, _ = await reg.create_key("beta")
    other = await loaded(any_store)  # another gateway process: it learns minted keys from the store only
    assert (await other.resolve(f"Bearer {plaintext}")).id == "beta"
    _empty(any_store, redis_url, key_prefix)
    with pytest.raises(GatewayError) as err:
        await reg.resolve(f"Bearer {plaintext}")
    assert err.value.status == 401


def test_limits_and_reference_price_come_from_the_tenant_config() -> None:
    reg = TenantRegistry(config(acme_limits={"rpm": 5}), MemoryStore())
    assert reg.limits_for("acme").rpm == 5
    assert reg.limits_for("anonymous").rpm is None
    beta, acme = reg.tenant("beta"), reg.tenant("acme")
    assert beta is not None and acme is not None
    assert beta.reference_prices == TokenPrices(5.0e-6, 0.5e-6, 20.0e-6)
    assert acme.reference_prices == reference_prices(ReferencePrice())  # the default: 3 / 0.3 / 15 $ per M


async def test_a_resolved_tenant_carries_its_limit_spec_and_prices_built_once_at_start() -> None:
    cfg = config(acme_limits={"rpm": 5, "tpm": 900, "monthly_budget_usd": 2.5})
    reg = TenantRegistry(cfg, MemoryStore())
    first = await reg.resolve(f"Bearer {ACME_KEY}")
    # The store enforces this spec; its lease outlives the longest upstream read by a minute.
    assert first.limits == cfg.tenants[0].limits
    assert first.limit_spec == LimitSpec(rpm=5, tpm=900, budget_micros=2_500_000,
                                         lease_s=cfg.upstream.read_timeout_s + 60)
    assert await reg.resolve(f"Bearer {ACME_KEY}") is first  # one record per tenant, not one per request


async def test_a_config_key_reseeded_into_an_emptied_store_resolves_to_the_same_tenant_record(
    any_store: Store, redis_url: str, key_prefix: str
) -> None:
    reg = TenantRegistry(config(acme_limits={"rpm": 5}), any_store, cache_ttl_s=0)
    await reg.load()
    before = await reg.resolve(f"Bearer {ACME_KEY}")
    _empty(any_store, redis_url, key_prefix)
    after = await reg.resolve(f"Bearer {ACME_KEY}")  # written back, then resolved: limits and prices unchanged
    assert after is before and after.limit_spec.rpm == 5


async def test_the_anonymous_tenant_without_config_has_no_limits_and_the_default_reference_price() -> None:
    reg = TenantRegistry(config(required=False), MemoryStore())
    anonymous = await reg.resolve(None)
    assert anonymous.id == "anonymous" and anonymous.limit_spec.unlimited
    assert anonymous.reference_prices == reference_prices(ReferencePrice())
