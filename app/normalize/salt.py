"""Per-tenant cache_salt: an HMAC of the tenant id, so tenants never share (or time) each other's KV blocks.

A client's own `cache_salt` (vLLM's field: a client may partition its cache further) is never forwarded as sent:
it is namespaced under its tenant, HMAC(tenant salt, client salt), so no client can name another tenant's salt
(a tenant's id is on /metrics, and the secret has a public default) nor share blocks across tenants, a
`shared_cache` tenant included. The secret must be set outside dev: `kvgate serve` refuses the default on an
address other than loopback (`salt_secret_problem`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress

from app.context import Tenant

SALT_PREFIX = "kvg1-"
DEFAULT_SECRET = "kvgate-dev-secret"  # NormalizeConfig.salt_secret's default: public, for dev only


def cache_salt_for(tenant_id: str, secret: str) -> str:
    """HMAC-SHA256(secret, tenant id) as url-safe base64: 48 chars, no `@ / \\` or NUL (vLLM's rules)."""
    if not secret:
        raise ValueError("cache salt secret must not be empty")
    return _b64(hmac.new(secret.encode(), b"kvgate-cache-salt\x00" + tenant_id.encode(), hashlib.sha256).digest())


def _b64(digest: bytes) -> str:
    return SALT_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def salt_for_tenant(tenant: Tenant, secret: str) -> str | None:
    """The salt to send for `tenant`, or None when it opted into the shared cache."""
    return None if tenant.shared_cache else cache_salt_for(tenant.id, secret)


def client_salt(tenant_id: str, secret: str, client: str) -> str:
    """A client's cache_salt namespaced under its tenant: HMAC(the tenant's salt, the client's)."""
    key = cache_salt_for(tenant_id, secret).encode()
    message = b"kvgate-client-salt\x00" + client.encode("utf-8", "surrogatepass")
    return _b64(hmac.new(key, message, hashlib.sha256).digest())


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def salt_secret_problem(secret: str, host: str) -> str | None:
    """Why the gateway must not start with this secret on this listen address (None: it may).

    Dev is a loopback listen address: nothing but this machine reaches it. Anywhere else the public default
    would let anyone compute every tenant's salt from its id.
    """
    if secret != DEFAULT_SECRET or _loopback(host):
        return None
    return (f"normalize.salt_secret is the public default while listening on {host}: set it (e.g. "
            "KVGATE_NORMALIZE__SALT_SECRET=$(openssl rand -hex 32)) to a secret of your own; the default is "
            "accepted only on a loopback address")



def request_salt(tenant: Tenant, sent: object, secret: str) -> str | None:
    """The cache_salt a request of `tenant` sends: its tenant's, or the client's own (`sent`, the body's
    cache_salt) namespaced under the tenant."""
    if isinstance(sent, str) and sent:
        return client_salt(tenant.id, secret, sent)
    return tenant.cache_salt
