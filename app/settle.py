"""The settle stage: usage → cost and savings, spend and limits reconciled in the store, spans and metrics.

Entered once per request, at its end: `settle` when a response is complete (before a non-streaming reply
leaves, so the cost header only shows acknowledged spend; after a stream's last event), `cancelled` when
the client went away first. Both are idempotent: whichever comes first counts.
"""

from __future__ import annotations

import logging
import time

from app.admission.step import settle_ticket
from app.config import GatewayConfig
from app.context import RequestContext
from app.cost import pool_prices, request_cost, request_savings
from app.limits import Limiter
from app.telemetry import Telemetry

_log = logging.getLogger(__name__)


class Settler:
    """Prices a finished request once and hands it to the store and to telemetry, exactly once."""

    def __init__(self, cfg: GatewayConfig, limiter: Limiter, telemetry: Telemetry) -> None:
        self._pool_prices = {name: pool_prices(pool.price) for name, pool in cfg.pools.items()}
        self._limiter = limiter
        self._telemetry = telemetry

    def _price(self, ctx: RequestContext) -> None:
        if ctx.route is None or not ctx.usage.reported:
            return
        prices = self._pool_prices[ctx.route.pool]
        ctx.cost_usd = request_cost(ctx.usage, prices)
        # The reference price came with the tenant's record from tenancy (built once per tenant); a routed
        # request always has one.
        if ctx.tenant is not None:
            ctx.savings_usd = request_savings(ctx.usage, prices, ctx.tenant.reference_prices)

    async def settle(self, ctx: RequestContext) -> None:
        """Price, record spend, release limits, end spans and record metrics; idempotent, never raises."""
        if ctx.settled:
            return
        ctx.settled = True
        ctx.timing.end = ctx.timing.end or time.perf_counter()
        # First: the admission slot goes to the next waiter whatever else fails below.
        try:
            settle_ticket(ctx)
        except Exception:  # the queue's bookkeeping must not break the response
            _log.exception("settle: admission release failed")
        self._price(ctx)
        if ctx.admission is not None:
            try:
                await self._limiter.settle(ctx, ctx.admission)
            except Exception:  # the limiter promises not to raise; a bug there must not break the response
                _log.exception("settle: limiter failed")
        if ctx.upstream_called:
            self._telemetry.settle(ctx)
        else:
            self._telemetry.record_rejected(ctx, ctx.status, ctx.error_type or "rejected")

    async def cancelled(self, ctx: RequestContext) -> None:
        """The client went away before the response ended: settle what was used, as status 499."""
        if ctx.settled:
            return
        ctx.status = 499
        ctx.error_type = ctx.error_type or "client_disconnected"
        await self.settle(ctx)
