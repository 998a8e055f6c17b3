"""Pre-warm's request glue as a path hook: once a request is routed, count its prefix for its pool and keep it
as its key's latest history, so a replica that joins replays what it will be asked for.

Registered only with `routing.prewarm.enabled`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.hooks import PathHook
from app.prewarm.memory import PrefixMemory

if TYPE_CHECKING:
    from app.context import RequestContext


class PrewarmRecord(PathHook):
    """Records each routed request's prefix under its pool, tenant and routing key."""

    name = "prewarm_record"

    def __init__(self, prefixes: PrefixMemory) -> None:
        self.prefixes = prefixes

    def routed(self, ctx: RequestContext) -> None:
        """Count the request's prefix for the pool it went to (its text is read only when its key is new)."""
        if ctx.route is not None and ctx.tenant is not None:
            self.prefixes.record(ctx.route.pool, ctx.tenant.id, ctx.routing_key, ctx.body, ctx.cache_salt,
                                 ctx.surface, ctx.prompt)  # fmt: skip
