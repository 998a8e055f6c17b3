"""Stored-response affinity as a path hook: a request that continues a stored response is pinned to the replica
that stores it, and a stored response's replica is remembered before the request settles.

Only surfaces that say so take part (`Surface.continues`, `Surface.stores_responses`: the Responses API).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.hooks import PathHook
from app.routing.response_affinity import Holder, ResponseRoutes

if TYPE_CHECKING:
    from app.config import ModelConfig
    from app.context import RequestContext


class ResponsePinning(PathHook):
    """Pins continuations (previous_response_id) and remembers where each stored response lives."""

    name = "response_pinning"

    def __init__(self, routes: ResponseRoutes) -> None:
        self.routes = routes

    async def before_pick(self, ctx: RequestContext, model: ModelConfig) -> None:
        """A continuation goes where its response lives (404 when no replica holds it whole)."""
        previous = ctx.surface.continues(ctx.body)
        if previous is not None:
            holder = ResponseRoutes.usable(previous, await self.routes.recall(previous))
            ctx.pinned = (holder.pool, holder.replica)

    async def before_settle(self, ctx: RequestContext) -> None:
        """Remember the replica of a response it stored (GET, cancel and continuations route to it)."""
        if ctx.surface.stores_responses and ctx.response_id and ctx.route is not None and ctx.status == 200:
            holder = Holder(ctx.route.pool, ctx.route.replica, ctx.model, migrated=ctx.migrations > 0)
            await self.routes.remember(ctx.response_id, holder)
