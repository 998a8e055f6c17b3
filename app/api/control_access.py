"""Who may read /metrics and the API docs (/docs, /redoc, /openapi.json): `auth.metrics_access`, `auth.docs_access`.

/metrics names every tenant (its labels) and the docs list every route; on an address clients reach, either can
be kept to holders of an admin key (`auth.admin_keys`, sent as `Authorization: Bearer <key>`; Prometheus:
`authorization: {credentials: <key>}` in its scrape config). /metrics defaults to open, so the shipped compose and
Kubernetes Prometheus scrapes keep working; the docs default to admin-only. `off` answers 404 as for any unknown
path.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.config.types import Access
from app.errors import GatewayError
from app.tenancy import bearer_token, hash_key, keys_match

METRICS_PATHS = frozenset({"/metrics"})
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


@dataclass(frozen=True, slots=True)
class ControlAccess:
    """The rule for each control path and the admin keys' hashes."""

    metrics: Access
    docs: Access
    admin_hashes: frozenset[str]

    @classmethod
    def build(cls, metrics: Access, docs: Access, admin_keys: list[str]) -> ControlAccess:
        """From the auth section's values."""
        return cls(metrics, docs, frozenset(hash_key(k) for k in admin_keys))

    def rule(self, path: str) -> Access:
        """The access rule of `path` (open for every path this module does not guard)."""
        if path in METRICS_PATHS:
            return self.metrics
        if path in DOCS_PATHS:
            return self.docs
        return "open"

    def refusal(self, path: str, authorization: str | None) -> GatewayError | None:
        """The error to answer instead of `path`, or None when the caller may read it."""
        rule = self.rule(path)
        if rule == "open":
            return None
        if rule == "off":
            return GatewayError(404, "Not Found", type="not_found_error")
        token = bearer_token(authorization)
        if token is None:
            return GatewayError(401, f"{path} needs an admin API key (Authorization: Bearer <key>).",
                                code="invalid_api_key")
        if not self.admin_hashes or not keys_match(token, set(self.admin_hashes)):
            return GatewayError(403, f"This key may not read {path}.", type="permission_error", code="forbidden")
        return None
