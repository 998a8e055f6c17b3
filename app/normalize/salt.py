"""Per-tenant cache_salt: an HMAC of the tenant id, so tenants never share (or time) each other's KV blocks."""

from __future__ import annotations

import base64
import hashlib
import hmac

from app.context import Tenant

SALT_PREFIX = "kvg1-"


def cache_salt_for(tenant_id: str, secret: str) -> str:
    """HMAC-SHA256(secret, tenant id) as url-safe base64: 48 chars, no `@ / \\` or NUL (vLLM's rules)."""
    if not secret:
        raise ValueError("cache salt secret must not be empty")
    digest = hmac.new(secret.encode(), b"kvgate-cache-salt\x00" + tenant_id.encode(), hashlib.sha256).digest()
    return SALT_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def salt_for_tenant(tenant: Tenant, secret: str) -> str | None:
    """The salt to send for `tenant`, or None when it opted into the shared cache."""
    return None if tenant.shared_cache else cache_salt_for(tenant.id, secret)
