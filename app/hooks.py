"""The path's named hook points: where an optional feature plugs into the request path without editing it.

The shape of llm-d's request-control plugins (PreRequest, ResponseReceived, ResponseComplete): a feature is a
`PathHook` subclass in its own package that overrides the points it needs; app/gateway.py registers the hooks
of the features the config enables, and `Hooks.of` keeps, per point, only the hooks that override it. So a
feature that is off is not registered and costs nothing, and a point no feature uses is an empty tuple.

The points, in the order a request meets them:

- `before_pick`: the request is classified and normalized; its pool and replica are not chosen yet (response
  pinning, the fair queue, KV block hashing). The path awaits what it returns, if anything: a hook with nothing
  to wait for on most requests (the fair queue below saturation) is a plain function returning None then.
- `after_pick`: a replica is chosen, the upstream call not made (once per attempt: the call's estimate).
- `routed`: the upstream answered; the reply or stream is about to go to the client (pre-warm's record).
- `before_settle`: the whole reply was sent (or is complete), its status and usage are known, it is not yet
  settled (remember where a stored response lives).
- `finished`: after settle, or after the client left (`cancelled`) (reply learning).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.config import ModelConfig
    from app.context import RequestContext

POINTS = ("before_pick", "after_pick", "routed", "before_settle", "finished")


class PathHook:
    """An optional feature's glue to the path; override the points it uses (the base's do nothing)."""

    name = "hook"

    def before_pick(self, ctx: RequestContext, model: ModelConfig) -> Awaitable[None] | None:
        """Before pool and replica are chosen (may pin the request, hold a slot, or raise a GatewayError); an
        awaitable it returns is awaited (an `async def` override returns one)."""
        return None

    def after_pick(self, ctx: RequestContext) -> None:
        """After pick, before each upstream call."""

    def routed(self, ctx: RequestContext) -> None:
        """The upstream answered; the reply goes out next."""

    async def before_settle(self, ctx: RequestContext) -> None:
        """The reply is complete (or the stream ended); settle is next."""

    async def finished(self, ctx: RequestContext, cancelled: bool) -> None:
        """After settle (or after the client left)."""


@dataclass(frozen=True, slots=True)
class Hooks:
    """Per point, the bound methods of the hooks that override it, in registration order."""

    before_pick: tuple[Callable[[RequestContext, ModelConfig], Awaitable[None] | None], ...] = ()
    after_pick: tuple[Callable[[RequestContext], None], ...] = ()
    routed: tuple[Callable[[RequestContext], None], ...] = ()
    before_settle: tuple[Callable[[RequestContext], Awaitable[None]], ...] = ()
    finished: tuple[Callable[[RequestContext, bool], Awaitable[None]], ...] = ()
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, hooks: Iterable[PathHook]) -> Hooks:
        """The points each hook overrides (a point left as PathHook's is skipped: it would do nothing)."""
        hooks = list(hooks)
        points = {
            point: tuple(getattr(h, point) for h in hooks if getattr(type(h), point) is not getattr(PathHook, point))
            for point in POINTS
        }
        return cls(**points, names=tuple(h.name for h in hooks))

    def run_after_pick(self, ctx: RequestContext) -> None:
        """Every after_pick hook (the dispatcher calls this once per attempt)."""
        for hook in self.after_pick:
            hook(ctx)

    def after_pick_runner(self) -> Callable[[RequestContext], None]:
        """What the dispatcher calls once per attempt: the one after_pick hook itself when there is one (no loop
        around it per attempt), else `run_after_pick`."""
        return self.after_pick[0] if len(self.after_pick) == 1 else self.run_after_pick
