"""vLLM `priority` per latency class, for pools started with `--scheduling-policy priority`."""

from __future__ import annotations

from app.config import PoolConfig
from app.context import RouteClass

# vLLM runs lower values first. Interactive outranks bulk on every pool, so interactive traffic spilled onto
# the bulk pool jumps its queue and bulk borrowing the interactive pool yields to interactive requests.
CLASS_PRIORITY: dict[RouteClass, int] = {"interactive": 0, "bulk": 10}


def priority_for(route_class: RouteClass, pool: PoolConfig) -> int | None:
    """The `priority` to send, or None when the pool does not schedule by priority (vLLM rejects it then)."""
    if not pool.priority_scheduling:
        return None
    return CLASS_PRIORITY[route_class]
