from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.routing import promtext as m
from app.routing.breaker import BreakerConfig, CircuitBreaker
from app.routing.state import ClusterState, ReplicaState
from tests.routing.factory import make_config, set_load


def test_load_is_scrape_moved_by_in_flight_change_since_the_scrape() -> None:
    r = ReplicaState("http://a:1")
    r.on_start()
    r.on_start()
    set_load(r, running=5, waiting=1)  # the scrape saw our 2 plus 4 from elsewhere
    assert r.load() == 6
    r.on_start()
    assert r.load() == 7
    r.on_success()
    r.on_success()
    assert r.load() == 5


def test_load_never_below_own_in_flight() -> None:
    r = ReplicaState("http://a:1")
    set_load(r, running=0)
    for _ in range(3):
        r.on_start()
    assert r.load() == 3


def test_in_flight_accounting_through_success_failure_release() -> None:
    r = ReplicaState("http://a:1")
    for _ in range(3):
        r.on_start()
    r.on_success()
    r.on_failure("connect")
    r.on_release()
    r.on_release()  # a double release never goes negative
    assert r.in_flight == 0
    assert r.last_error == "connect"


def test_failures_feed_the_breaker_and_take_the_replica_out() -> None:
    r = ReplicaState("http://a:1")
    for _ in range(r.breaker.cfg.failures):
        r.on_start()
        r.on_failure("status_5xx")
    assert r.healthy and not r.available()


def test_status_names_what_routing_does_with_the_replica() -> None:
    clock = [0.0]
    r = ReplicaState("http://a:1", breaker=CircuitBreaker(BreakerConfig(failures=1, open_s=5.0), lambda: clock[0]))
    assert r.status() == "serving"  # optimistic before its first probe
    r.set_warming(True)
    assert r.status() == "warming"
    r.set_warming(False)
    r.on_start()
    r.on_failure("status_5xx")
    assert r.status() == "breaker_open"
    clock[0] = 6.0
    r.on_start()  # past the cool-down: the one trial
    assert r.status() == "breaker_half_open"
    r.on_success()
    r.apply_probe(False, healthy_after=1, unhealthy_after=1)
    assert r.status() == "unhealthy"
    joining = ReplicaState("http://b:1")
    joining.healthy = joining.in_rotation = False  # as discovery adds a replica: out until a good probe
    assert joining.status() == "joining"
    joining.apply_probe(True, healthy_after=1, unhealthy_after=1)
    assert joining.status() == "serving"


def test_probe_hysteresis() -> None:
    r = ReplicaState("http://a:1")
    r.apply_probe(True, healthy_after=2, unhealthy_after=2)
    r.apply_probe(False, 2, 2)
    assert r.healthy  # one bad probe is not enough
    r.apply_probe(False, 2, 2)
    assert not r.healthy
    r.apply_probe(True, 2, 2)
    assert not r.healthy  # one good probe is not enough either
    r.apply_probe(True, 2, 2)
    assert r.healthy


def test_first_probe_decides_at_once() -> None:
    r = ReplicaState("http://a:1")
    r.apply_probe(False, healthy_after=3, unhealthy_after=3)
    assert not r.healthy


def test_unhealthy_probe_forgets_scraped_load() -> None:
    r = ReplicaState("http://a:1")
    set_load(r, running=9, waiting=4, kv=0.9)
    r.apply_probe(False, 1, 1)
    assert (r.load(), r.waiting, r.kv_usage) == (0, 0, 0.0)


def test_interval_rates_from_counter_deltas_and_resets() -> None:
    r = ReplicaState("http://a:1")
    r.apply_metrics({m.PREFIX_QUERIES: 1000, m.PREFIX_HITS: 100, m.TTFT_SUM: 1.0, m.TTFT_COUNT: 4}, 1.0)
    assert r.ttft_ewma_s is None  # one scrape has no interval yet
    r.apply_metrics(
        {m.PREFIX_QUERIES: 2000, m.PREFIX_HITS: 850, m.SPEC_DRAFT_TOKENS: 0, m.TTFT_SUM: 2.0, m.TTFT_COUNT: 6},
        2.0,
    )
    assert r.ttft_ewma_s == 0.5
    r.apply_metrics({m.TTFT_SUM: 0.1, m.TTFT_COUNT: 1, m.RUNNING: 1}, 3.0)  # restarted: counters went down
    assert r.ttft_ewma_s == 0.5
    assert r.last_scrape == 3.0


def test_projected_ttft_grows_with_the_queue() -> None:
    r = ReplicaState("http://a:1")
    assert r.projected_ttft_ms() == 0.0
    r.on_first_token(0.2)
    set_load(r, running=2, waiting=0)
    idle = r.projected_ttft_ms()
    set_load(r, running=2, waiting=4)
    assert r.projected_ttft_ms() == 3 * idle


def test_reload_keeps_surviving_replicas_and_builds_policies() -> None:
    cfg = make_config(fast=["http://127.0.0.1:9101", "http://127.0.0.1:9102"])
    first = ClusterState.from_config(cfg)
    kept = first.pools["fast"].replicas[1]
    kept.on_start()
    cfg2 = make_config(fast=["http://127.0.0.1:9102", "http://127.0.0.1:9103"])
    second = ClusterState.from_config(cfg2, first)
    assert second.pools["fast"].replicas[0] is kept and kept.index == 0
    assert second.pools["fast"].replicas[1].in_flight == 0
    assert second.pools["fast"].policy.name == "prefix_affinity"
    assert second.pools["bulk"].policy.name == "round_robin"  # one replica, no policy key
    assert len(list(second.replicas())) == 3


def test_queue_estimate_follows_our_requests_only_when_the_replica_was_queueing() -> None:
    r = ReplicaState("http://a:1")
    set_load(r, running=4, waiting=0)
    r.on_start()
    assert r.queued() == 0  # it had no queue: our request may have found a free slot
    set_load(r, running=4, waiting=2)
    r.on_start()
    r.on_start()
    assert r.queued() == 4
    for _ in range(3):
        r.on_success()
    assert r.queued() == 1


def test_idle_replica_relaxes_an_old_slow_ttft_until_it_is_dropped() -> None:
    r = ReplicaState("http://a:1")
    r.apply_metrics({m.TTFT_SUM: 0.0, m.TTFT_COUNT: 0}, 1.0)
    r.apply_metrics({m.TTFT_SUM: 4.0, m.TTFT_COUNT: 2, m.RUNNING: 1}, 2.0)
    assert r.ttft_ewma_s == 2.0
    r.apply_metrics({m.TTFT_SUM: 4.0, m.TTFT_COUNT: 2, m.RUNNING: 1}, 3.0)
    assert r.ttft_ewma_s == 2.0  # busy, no new measurement: keep it
    seen = []
    for t in range(4, 30):
        r.apply_metrics({m.TTFT_SUM: 4.0, m.TTFT_COUNT: 2}, float(t))
        seen.append(r.ttft_ewma_s)
    assert seen[:2] == [1.0, 0.5]
    assert seen[-1] is None


def test_open_breaker_readmits_one_trial_after_cooldown_then_closes_on_success() -> None:
    now = [0.0]
    r = ReplicaState("http://a:1", breaker=CircuitBreaker(BreakerConfig(failures=1, open_s=1.0), lambda: now[0]))
    r.on_start()
    r.on_failure("timeout")
    assert not r.available()
    now[0] = 1.5
    assert r.available()
    r.on_start()  # the trial
    assert not r.available()
    r.on_success()
    assert r.available() and r.in_rotation


# -- the hot path's inlined twin: PoolState.candidates runs ReplicaState.available() inlined --------------------
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.sampled_from(["closed", "open", "half_open"]),
                          st.booleans()), min_size=1, max_size=6),
       st.sets(st.integers(0, 5)))  # fmt: skip
def test_candidates_are_exactly_the_available_replicas_not_excluded(flags: list[tuple[bool, bool, str, bool]],
                                                                    excluded: set[int]) -> None:  # fmt: skip
    urls = [f"http://127.0.0.1:{9100 + i}" for i in range(len(flags))]
    pool = ClusterState.from_config(make_config(urls, [])).pools["fast"]
    for replica, (healthy, warming, breaker, refreshed) in zip(pool.replicas, flags, strict=True):
        replica.healthy = healthy
        replica.warming = warming
        replica.breaker.state = breaker  # type: ignore[assignment]
        if refreshed:
            replica._refresh()  # else in_rotation is stale, as between a verdict and its refresh
    exclude = frozenset(pool.replicas[i].url for i in excluded if i < len(pool.replicas))
    assert pool.candidates(exclude) == [r for r in pool.replicas if r.available() and r.url not in exclude]
