"""Config and state builders shared by the routing tests."""

from __future__ import annotations

from typing import Any

from app.config import GatewayConfig, parse_config
from app.routing.state import ClusterState, ReplicaState
from kvlab.configs import gateway_config

PRICE = {"gpu_hour_usd": 2.5, "capacity_tokens_per_s": 1000}


def make_config(
    fast: list[str] | None = None,
    bulk: list[str] | None = None,
    *,
    routing: dict[str, Any] | None = None,
    fast_extra: dict[str, Any] | None = None,
    bulk_extra: dict[str, Any] | None = None,
) -> GatewayConfig:
    """A model `m` served by pools `fast` (interactive) and `bulk`; a pool given as [] is left out."""
    fast = ["http://127.0.0.1:9101", "http://127.0.0.1:9102"] if fast is None else fast
    bulk = ["http://127.0.0.1:9201"] if bulk is None else bulk
    pools: dict[str, Any] = {}
    if fast:
        pools["fast"] = {"role": "interactive", "replicas": fast, **(fast_extra or {})}
    if bulk:
        pools["bulk"] = {"role": "bulk", "replicas": bulk, **(bulk_extra or {})}
    return parse_config(gateway_config(pools, price=PRICE, routing=routing or {}))


def make_cluster(cfg: GatewayConfig) -> ClusterState:
    """Cluster state for `cfg` with default breakers."""
    return ClusterState.from_config(cfg)


def replicas(urls: list[str]) -> list[ReplicaState]:
    """Standalone replica states."""
    return [ReplicaState(u, "p", i) for i, u in enumerate(urls)]


def set_load(replica: ReplicaState, running: int = 0, waiting: int = 0, kv: float = 0.0) -> None:
    """Pretend a scrape just reported these numbers."""
    replica.apply_metrics(
        {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
         "vllm:kv_cache_usage_perc": kv},
        now=1.0,
    )
