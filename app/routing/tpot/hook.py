"""The TPOT router's glue to the gateway: pick reads it from the cluster, `finished` feeds it, /metrics shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.hooks import PathHook
from app.routing.tpot.metrics import register_tpot_metrics
from app.routing.tpot.router import TpotRouter

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from app.config import GatewayConfig
    from app.context import RequestContext
    from app.routing.state import ClusterState


class TpotLearning(PathHook):
    """After each request: what it teaches the router (output length, acceptance, predicted vs observed TPOT)."""

    name = "tpot"

    def __init__(self, router: TpotRouter) -> None:
        self.router = router

    @classmethod
    def install(cls, cfg: GatewayConfig, cluster: ClusterState, meter: Meter) -> TpotLearning | None:
        """Attach a router to the cluster (rebuilt in place by rediscovery) when the config calls for one
        (TpotRouter.for_config) and register its metrics; None otherwise."""
        router = TpotRouter.for_config(cfg)
        if router is None:
            return None
        cluster.tpot = router
        register_tpot_metrics(meter, router)
        return cls(router)

    async def finished(self, ctx: RequestContext, cancelled: bool) -> None:
        """A request that reached its end (a cancelled one teaches nothing)."""
        if not cancelled and ctx.upstream_called:
            self.router.observe(ctx)
