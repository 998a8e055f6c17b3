"""Admin API: admin-key auth, key minting and revocation, usage by day and pool; plaintext keys never stored."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI

from app.api.admin import admin_router
from app.errors import GatewayError
from app.store.base import SpendRecord, Store
from app.store.redis_store import RedisStore
from app.tenancy import TenantRegistry
from tests.store.helpers import ACME_KEY, ADMIN_KEY, BETA_KEY, config
from tests.store.redis_fixtures import any_store, key_prefix, redis_dump, redis_url

__all__ = ["any_store", "key_prefix", "redis_url"]

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
async def registry(any_store: Store) -> TenantRegistry:
    reg = TenantRegistry(config(acme_limits={"monthly_budget_usd": 50}), any_store)
    await reg.load()
    return reg


@pytest.fixture
async def client(registry: TenantRegistry, any_store: Store) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.include_router(admin_router(registry, any_store, [ADMIN_KEY]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin") as c:
        yield c


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": f"Bearer {ACME_KEY}"}, 403), ({"Authorization": "Bearer nope"}, 403)],
)
async def test_admin_routes_need_the_admin_key(client: httpx.AsyncClient, headers: dict[str, str], status: int) -> None:
    for method, path in [("GET", "/admin/tenants"), ("POST", "/admin/tenants/acme/keys")]:
        r = await client.request(method, path, headers=headers)
        assert r.status_code == status
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


async def test_admin_key_may_be_configured_as_sha256(any_store: Store, registry: TenantRegistry) -> None:
    app = FastAPI()
    app.include_router(admin_router(registry, any_store, ["sha256:" + hashlib.sha256(b"s3cret").hexdigest()]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin") as c:
        assert (await c.get("/admin/tenants", headers={"Authorization": "Bearer s3cret"})).status_code == 200


async def test_tenants_list_shows_key_hash_prefixes_and_limits(client: httpx.AsyncClient) -> None:
    data = (await client.get("/admin/tenants", headers=ADMIN)).json()["data"]
    acme = next(t for t in data if t["id"] == "acme")
    assert acme["keys"] == [hashlib.sha256(ACME_KEY.encode()).hexdigest()[:12]]
    assert acme["limits"]["monthly_budget_usd"] == 50
    assert {t["id"] for t in data} == {"acme", "beta"}


async def test_minted_key_works_until_revoked(client: httpx.AsyncClient, registry: TenantRegistry) -> None:
    r = await client.post("/admin/tenants/beta/keys", headers=ADMIN)
    assert r.status_code == 201
    key, prefix = r.json()["api_key"], r.json()["key_hash_prefix"]
    assert (await registry.resolve(f"Bearer {key}")).id == "beta"
    r = await client.delete(f"/admin/tenants/beta/keys/{prefix}", headers=ADMIN)
    assert r.status_code == 200 and r.json()["revoked"] == prefix
    with pytest.raises(GatewayError):
        await registry.resolve(f"Bearer {key}")
    assert (await client.delete(f"/admin/tenants/beta/keys/{prefix}", headers=ADMIN)).status_code == 404


async def test_unknown_tenant_and_short_prefix_are_refused(client: httpx.AsyncClient) -> None:
    assert (await client.post("/admin/tenants/nobody/keys", headers=ADMIN)).status_code == 404
    assert (await client.get("/admin/tenants/nobody/usage", headers=ADMIN)).status_code == 404
    assert (await client.delete("/admin/tenants/acme/keys/ab", headers=ADMIN)).status_code == 409
    assert (await client.get("/admin/tenants/acme/usage?days=0", headers=ADMIN)).status_code == 400


@pytest.mark.parametrize("days", ["%C2%B2", "%D9%A3", "%EF%BC%97", "-1", "7.0", "401", ""])
async def test_usage_days_that_are_not_ascii_digits_in_range_are_400_not_500(
    client: httpx.AsyncClient, days: str
) -> None:
    r = await client.get(f"/admin/tenants/acme/usage?days={days}", headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "days"


async def test_usage_reports_spend_by_day_and_pool(client: httpx.AsyncClient, any_store: Store) -> None:
    day = datetime.now(UTC).date().isoformat()
    await any_store.record_spend(
        [
            SpendRecord("a", "acme", day, "fast", 1_500_000, 100, 50, 10),
            SpendRecord("b", "acme", day, "bulk", 250_000, 10, 0, 5),
            SpendRecord("c", "beta", day, "bulk", 999, 1, 1, 1),
        ]
    )
    body = (await client.get("/admin/tenants/acme/usage?days=3", headers=ADMIN)).json()
    assert body["days"][0]["day"] == day and len(body["days"]) == 3
    assert body["days"][0]["pools"]["fast"]["usd"] == 1.5
    assert body["pools"]["bulk"]["tokens"] == {"uncached": 10, "cached": 0, "output": 5}
    assert body["total"]["requests"] == 2 and body["total"]["usd_micros"] == 1_750_000
    assert body["month"] == {"month": day[:7], "usd": 1.75, "budget_usd": 50}


async def test_no_plaintext_key_is_ever_written_to_redis(redis_url: str, key_prefix: str) -> None:
    store = RedisStore(redis_url, key_prefix, socket_timeout_s=2)
    reg = TenantRegistry(config(), store)
    await reg.load()
    app = FastAPI()
    app.include_router(admin_router(reg, store, [ADMIN_KEY]))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin") as c:
            minted = [(await c.post("/admin/tenants/acme/keys", headers=ADMIN)).json()["api_key"] for _ in range(3)]
            await c.delete(
                f"/admin/tenants/acme/keys/{hashlib.sha256(minted[0].encode()).hexdigest()[:16]}", headers=ADMIN
            )
    finally:
        await store.aclose()
    dump = "\n".join(redis_dump(redis_url, key_prefix))
    for secret in [ACME_KEY, BETA_KEY, ADMIN_KEY, *minted]:
        assert secret not in dump
    assert hashlib.sha256(minted[1].encode()).hexdigest() in dump
