"""Admin endpoints behind an admin key: tenants, their API keys, and their usage and spend.

Keys are shown only once, at creation; afterwards only a prefix of their sha256 identifies them. A minted key
lives in the store alone (Redis: persist it; the in-memory store forgets minted keys on restart), config keys in
the config (app/tenancy.py: an emptied store gets them back on their next use).
Errors use OpenAI's envelope, answered here so the router works in any app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from app.api.parse import single_credentials
from app.errors import GatewayError, store_unavailable
from app.spend import recent_days, usage_report
from app.store.base import MICROS_PER_USD, Store, StoreUnavailable
from app.tenancy import TenantRegistry, bearer_token, hash_key, keys_match

_PREFIX_SHOWN = 12
_MAX_DAYS = 400


def _json(status: int, payload: dict[str, Any]) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _error(err: GatewayError) -> Response:
    return Response(err.body(), status_code=err.status, media_type="application/json", headers=err.headers)


def _not_found(what: str) -> GatewayError:
    return GatewayError(404, f"{what} not found", code="not_found")


def admin_router(registry: TenantRegistry, store: Store, admin_keys: list[str]) -> APIRouter:
    """The /admin routes; admin keys are plaintext or `sha256:<hex>` (compared by hash)."""
    allowed = {hash_key(k) for k in admin_keys}
    router = APIRouter(prefix="/admin", include_in_schema=False)

    def authorize(request: Request) -> None:
        single_credentials(request.headers.raw)
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise GatewayError(401, "Admin API key required (Authorization: Bearer <key>).", code="invalid_api_key")
        if not allowed or not keys_match(token, allowed):
            raise GatewayError(403, "This key may not use the admin API.", type="permission_error", code="forbidden")

    def known(tenant_id: str) -> None:
        if registry.tenant(tenant_id) is None:
            raise _not_found(f"tenant {tenant_id!r}")

    async def guarded(request: Request, work: Callable[[], Awaitable[Response]]) -> Response:
        try:
            authorize(request)
            return await work()
        except GatewayError as err:
            return _error(err)
        except StoreUnavailable:
            return _error(store_unavailable("Shared state is unavailable."))

    @router.get("/tenants")
    async def list_tenants(request: Request) -> Response:
        """Configured tenants, their key hash prefixes and limits."""

        async def work() -> Response:
            data = []
            for tid in registry.tenant_ids():
                hashes = await store.tenant_keys(tid)
                data.append(
                    {
                        "id": tid,
                        "keys": [h[:_PREFIX_SHOWN] for h in hashes],
                        "limits": registry.limits_for(tid).model_dump(),
                    }
                )
            return _json(200, {"object": "list", "data": data})

        return await guarded(request, work)

    @router.post("/tenants/{tenant_id}/keys")
    async def create_key(request: Request, tenant_id: str) -> Response:
        """Mint an API key; the plaintext is in this response only."""

        async def work() -> Response:
            known(tenant_id)
            plaintext, key_hash = await registry.create_key(tenant_id)
            return _json(
                201, {"tenant": tenant_id, "api_key": plaintext, "key_hash_prefix": key_hash[:_PREFIX_SHOWN]}
            )

        return await guarded(request, work)

    @router.delete("/tenants/{tenant_id}/keys/{key_hash_prefix}")
    async def revoke_key(request: Request, tenant_id: str, key_hash_prefix: str) -> Response:
        """Revoke the key whose sha256 starts with the given prefix."""

        async def work() -> Response:
            known(tenant_id)
            try:
                key_hash = await registry.revoke_key(tenant_id, key_hash_prefix)
            except KeyError:
                raise _not_found("key") from None
            except ValueError as err:
                raise GatewayError(409, str(err), param="key_hash_prefix", code="ambiguous_key") from None
            return _json(200, {"tenant": tenant_id, "revoked": key_hash[:_PREFIX_SHOWN]})

        return await guarded(request, work)

    @router.get("/tenants/{tenant_id}/usage")
    async def usage(request: Request, tenant_id: str) -> Response:
        """Spend by day and by pool, tokens by type and request counts for the last `days` days."""

        async def work() -> Response:
            known(tenant_id)
            raw = request.query_params.get("days", "7")
            # isascii: "²" and "٣" are str.isdigit() but int() refuses the first (a 500 before) and reads the second.
            if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= _MAX_DAYS:
                raise GatewayError(400, f"days must be an integer in 1..{_MAX_DAYS}", param="days")
            now = datetime.now(UTC)
            days = await store.usage(tenant_id, recent_days(int(raw), now.date()))
            month = now.strftime("%Y-%m")
            month_micros = await store.month_spend_micros(tenant_id, month)
            budget = registry.limits_for(tenant_id).monthly_budget_usd
            return _json(
                200,
                {
                    "tenant": tenant_id,
                    "month": {"month": month, "usd": month_micros / MICROS_PER_USD, "budget_usd": budget},
                    **usage_report(days),
                },
            )

        return await guarded(request, work)

    return router
