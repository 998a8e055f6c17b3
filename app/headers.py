"""Every public `x-kvgate-*` header name, in one place: clients and dashboards rely on these spellings."""

from __future__ import annotations

REQUEST_ID = "x-request-id"
# Response headers the gateway sets.
ROUTE = "x-kvgate-route"
NORMALIZED = "x-kvgate-normalized"
COST_USD = "x-kvgate-cost-usd"
OVERHEAD_MS = "x-kvgate-overhead-ms"
LIMIT = "x-kvgate-limit"
UPSTREAM_STATUS = "x-kvgate-upstream-status"
# Request headers a client may send.
CLASS = "x-kvgate-class"
NORMALIZE_OPT_OUT = "x-kvgate-normalize"
RETRY_AFTER = "Retry-After"
API_KEY = "x-api-key"  # Anthropic's SDK sends its key here
