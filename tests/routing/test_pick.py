from __future__ import annotations

from typing import Any

import pytest

from app.config import GatewayConfig
from app.context import ClassDecision, RouteDecision
from app.errors import GatewayError
from app.routing.pick import pick
from app.routing.state import ClusterState
from tests.routing.factory import make_cluster, make_config, set_load

INTERACTIVE = ClassDecision("interactive", "stream")
BULK = ClassDecision("bulk", "n")
F1, F2 = "http://127.0.0.1:9101", "http://127.0.0.1:9102"
B1 = "http://127.0.0.1:9201"


def route(
    cluster: ClusterState, decision: ClassDecision, exclude: frozenset[str] = frozenset(), **routing: Any
) -> RouteDecision:
    cfg = make_config(routing=routing)
    return pick(model=cfg.models[0], decision=decision, key=123, cluster=cluster, cfg=cfg.routing, exclude=exclude)


def route_with(cfg: GatewayConfig, cluster: ClusterState, decision: ClassDecision,
               exclude: frozenset[str] = frozenset()) -> RouteDecision:
    return pick(model=cfg.models[0], decision=decision, key=123, cluster=cluster, cfg=cfg.routing, exclude=exclude)


def detail(route: RouteDecision) -> str:
    return route.detail


def saturate(cluster: ClusterState, pool: str, waiting: int = 3) -> None:
    for r in cluster.pools[pool].replicas:
        set_load(r, running=8, waiting=waiting, kv=0.9)


def test_each_class_goes_to_its_home_pool() -> None:
    cluster = make_cluster(make_config())
    got = route(cluster, INTERACTIVE)
    assert (got.pool, got.reason, got.spilled, got.policy) == ("fast", "prefix_home", False, "prefix_affinity")
    assert {got.replica, got.runner_up} == {F1, F2}
    got = route(cluster, BULK)
    assert (got.pool, got.replica, got.reason, got.runner_up) == ("bulk", B1, "round_robin", None)


def test_single_pool_takes_every_class() -> None:
    cfg = make_config(bulk=[])
    cluster = make_cluster(cfg)
    got = pick(model=cfg.models[0], decision=BULK, key=1, cluster=cluster, cfg=cfg.routing)
    assert got.pool == "fast" and not got.spilled


def test_saturated_interactive_spills_to_bulk_with_headroom_and_says_why() -> None:
    cluster = make_cluster(make_config())
    saturate(cluster, "fast")
    got = route(cluster, INTERACTIVE)
    assert (got.pool, got.reason, got.spilled) == ("bulk", "spill_interactive_to_bulk", True)
    assert "fast queues" in detail(got)


def test_interactive_over_ttft_slo_spills() -> None:
    cluster = make_cluster(make_config())
    for r in cluster.pools["fast"].replicas:
        r.on_first_token(0.9)  # SLO is 500 ms
    got = route(cluster, INTERACTIVE)
    assert got.reason == "spill_interactive_to_bulk"
    assert "TTFT" in detail(got)


def test_no_spill_when_one_interactive_replica_is_free() -> None:
    cluster = make_cluster(make_config())
    set_load(cluster.pools["fast"].replicas[0], running=8, waiting=5)
    assert route(cluster, INTERACTIVE).pool == "fast"


def test_no_spill_when_bulk_has_no_headroom() -> None:
    cluster = make_cluster(make_config())
    saturate(cluster, "fast")
    saturate(cluster, "bulk", waiting=1)
    got = route(cluster, INTERACTIVE)
    assert (got.pool, got.spilled) == ("fast", False)


def test_no_spill_when_disabled() -> None:
    cluster = make_cluster(make_config())
    saturate(cluster, "fast")
    assert route(cluster, INTERACTIVE, allow_spill=False).pool == "fast"


def test_bulk_borrows_interactive_only_below_the_utilization_threshold() -> None:
    cluster = make_cluster(make_config())
    saturate(cluster, "bulk")
    for r in cluster.pools["fast"].replicas:
        set_load(r, running=1, kv=0.1)
    got = route(cluster, BULK, bulk_borrow_below_utilization=0.3)
    assert (got.pool, got.reason, got.spilled) == ("fast", "borrow_idle_interactive", True)
    assert "utilization 0.10 < 0.30" in detail(got)
    for r in cluster.pools["fast"].replicas:
        set_load(r, running=3, kv=0.5)
    assert route(cluster, BULK, bulk_borrow_below_utilization=0.3).pool == "bulk"


def test_bulk_stays_home_when_bulk_is_not_saturated() -> None:
    cluster = make_cluster(make_config())
    assert route(cluster, BULK, bulk_borrow_below_utilization=1.0).pool == "bulk"


def test_priority_follows_class_only_on_priority_scheduled_pools() -> None:
    cfg = make_config(bulk_extra={"priority_scheduling": True})
    cluster = make_cluster(cfg)
    assert route(cluster, BULK).priority == 10
    assert route(cluster, INTERACTIVE).priority is None  # fast does not schedule by priority
    saturate(cluster, "fast")
    spilled = route(cluster, INTERACTIVE)
    assert spilled.pool == "bulk" and spilled.priority is not None and spilled.priority < 10


def test_retry_excludes_tried_replicas_and_counts_as_failover() -> None:
    cluster = make_cluster(make_config())
    first = route(cluster, INTERACTIVE)
    second = route(cluster, INTERACTIVE, exclude=frozenset({first.replica}))
    assert second.pool == "fast" and second.replica != first.replica
    assert (second.reason, second.attempt) == ("failover", 2)


def test_fails_over_to_the_other_pool_when_home_has_nothing_left() -> None:
    cluster = make_cluster(make_config())
    got = route(cluster, INTERACTIVE, exclude=frozenset({F1, F2}))
    assert (got.pool, got.reason, got.spilled) == ("bulk", "failover", True)
    assert "2 tried" in detail(got)


def test_unhealthy_and_open_breaker_replicas_are_skipped() -> None:
    cluster = make_cluster(make_config())
    a, b = cluster.pools["fast"].replicas
    a.apply_probe(False, 1, 1)
    for _ in range(b.breaker.cfg.failures):
        b.on_failure("connect")
    got = route(cluster, INTERACTIVE)
    assert (got.pool, got.reason) == ("bulk", "failover")
    assert "1 unhealthy, 1 breaker open" in detail(got)


def test_nothing_in_rotation_is_a_503() -> None:
    cluster = make_cluster(make_config())
    for r in cluster.replicas():
        r.apply_probe(False, 1, 1)
    with pytest.raises(GatewayError) as info:
        route(cluster, INTERACTIVE)
    assert info.value.status == 503 and info.value.code == "no_healthy_upstream"


def test_no_cross_pool_failover_when_spill_is_disabled() -> None:
    cluster = make_cluster(make_config())
    with pytest.raises(GatewayError):
        route(cluster, INTERACTIVE, exclude=frozenset({F1, F2}), allow_spill=False)


def test_interactive_returns_home_once_the_spilled_away_pool_is_idle_again() -> None:
    cluster = make_cluster(make_config())
    fast = cluster.pools["fast"].replicas

    def scrape(ttft_sum: float, count: int, running: int, t: float) -> None:
        for r in fast:
            r.apply_metrics({"vllm:time_to_first_token_seconds_sum": ttft_sum,
                             "vllm:time_to_first_token_seconds_count": count,
                             "vllm:num_requests_running": running}, t)

    scrape(0.0, 0, 0, 1.0)
    scrape(4.0, 2, 3, 2.0)  # 2 s TTFT against a 500 ms SLO
    assert route(cluster, INTERACTIVE).pool == "bulk"
    scrape(4.0, 2, 0, 3.0)  # drained, nothing new measured: the estimate halves to 1 s
    assert route(cluster, INTERACTIVE).pool == "bulk"
    scrape(4.0, 2, 0, 4.0)  # 0.5 s: no longer over the SLO
    assert route(cluster, INTERACTIVE).pool == "fast"


def test_between_scrapes_our_finished_requests_drain_the_estimated_queue() -> None:
    cluster = make_cluster(make_config())
    for r in cluster.pools["fast"].replicas:
        r.on_start()
        r.on_start()
        set_load(r, running=8, waiting=1)
    assert route(cluster, INTERACTIVE).pool == "bulk"
    for r in cluster.pools["fast"].replicas:
        r.on_success()
        r.on_success()
    assert route(cluster, INTERACTIVE).pool == "fast"


def test_a_second_pool_of_the_same_role_is_a_failover_target_not_a_spill_target() -> None:
    cfg = make_config(bulk_extra={"role": "interactive"})
    cluster = make_cluster(cfg)
    saturate(cluster, "fast")
    assert route_with(cfg, cluster, INTERACTIVE).pool == "fast"
    got = route_with(cfg, cluster, INTERACTIVE, exclude=frozenset({F1, F2}))
    assert (got.pool, got.reason) == ("bulk", "failover")
