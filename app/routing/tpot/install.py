"""Plugs the TPOT router into a gateway: pick reads it from the cluster, settle feeds it, /metrics shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.routing.tpot.metrics import register_tpot_metrics
from app.routing.tpot.router import TpotRouter

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from app.config import GatewayConfig
    from app.routing.state import ClusterState
    from app.settle import Settler


def install_tpot(cfg: GatewayConfig, cluster: ClusterState, settler: Settler, meter: Meter) -> TpotRouter | None:
    """Attach a router when the config calls for one (TpotRouter.for_config); None otherwise."""
    router = TpotRouter.for_config(cfg)
    if router is not None:
        cluster.tpot = router  # ClusterState.from_config hands it on when discovery rebuilds the cluster
        settler.observers.append(router.observe)
        register_tpot_metrics(meter, router)
    return router
