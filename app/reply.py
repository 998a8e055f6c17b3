"""What the path hands the api layer back, and the gateway's own response headers on it.

`x-kvgate-route` (where the request went and why), `x-kvgate-normalized`, `x-kvgate-limit` and `x-request-id`
are built here from the context, the same for a complete body, a stream and an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from app.admission.step import route_suffix
from app.context import RequestContext
from app.headers import LIMIT, NORMALIZED, REQUEST_ID, ROUTE


@dataclass(slots=True)
class Reply:
    """What the api layer sends back: either a complete body or an SSE stream."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


def gateway_headers(ctx: RequestContext) -> dict[str, str]:
    """The gateway's headers for the request as far as it got (route only once it was picked)."""
    headers = {REQUEST_ID: ctx.request_id}
    if ctx.route is not None and ctx.route_class is not None:
        r = ctx.route
        route = (
            f"pool={r.pool};class={ctx.route_class.route_class};reason={ctx.route_class.reason};"
            f"policy={r.policy};pick={r.reason};attempt={r.attempt}"
        )
        if r.cached_tokens is not None:
            route += f";cached={r.cached_tokens}"
        if r.runner_up is not None:
            route += f";runner_up={r.runner_up}"
        headers[ROUTE] = route + route_suffix(ctx.queue_ticket) + r.suffix()
    if ctx.normalize_report is not None:
        headers[NORMALIZED] = ctx.normalize_report.header()
    if ctx.limit_notes:
        headers[LIMIT] = ";".join(ctx.limit_notes)
    return headers
