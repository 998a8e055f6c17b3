"""Gateway processes sharing a Store judge bounded load on one snapshot of all their requests, in force in all of
them from the same instant (real Redis; a fake wall clock where the instant matters)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.config import parse_config
from app.config.peer_load import PeerLoadSettings
from app.context import ClassDecision
from app.gateway import Gateway
from app.routing.peer_load import PeerLoad, Pending, counts_of_round, replica_field, until_exchange
from app.routing.pick import pick
from app.routing.prefix_affinity import PrefixAffinity
from app.routing.state import ClusterState, ReplicaState
from app.store.base import Store, StoreUnavailable
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from tests.routing.factory import make_cluster, make_config
from tests.store.redis_fixtures import loose_redis_store

FAST = ["http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103"]
SETTINGS = PeerLoadSettings()  # rounds of 0.1 s
US = 1_000_000
T0 = 1_000_000_000  # µs: a round boundary for 0.1 s rounds


@pytest.fixture
async def redis_store(redis_url: str, key_prefix: str) -> AsyncIterator[RedisStore]:
    store = loose_redis_store(redis_url, key_prefix)
    yield store
    await store.aclose()


class Clock:
    """One fake clock for the store and every process (a process may read it skewed: `_processes`)."""

    def __init__(self) -> None:
        self.us = T0

    def s(self) -> float:
        return self.us / US

    def at_round(self, k: int, phase: float = 0.5) -> None:
        self.us = int((k + phase) * SETTINGS.interval_s * US)


class Flaky(Store):  # type: ignore[misc]
    """A store whose share_load can be taken down."""

    def __init__(self, up: Store) -> None:
        self.up = up
        self.down = False

    async def share_load(self, process_id: str, payload: str | None, ttl_s: float):  # type: ignore[no-untyped-def]
        if self.down:
            raise StoreUnavailable("down")
        return await self.up.share_load(process_id, payload, ttl_s)


class Slow(Store):  # type: ignore[misc]
    """A store whose replies take time on the fake clock: `to_store_us` before the store stamps one, `back_us` after."""

    def __init__(self, up: Store, clock: Clock) -> None:
        self.up = up
        self.clock = clock
        self.to_store_us = self.back_us = 0

    async def share_load(self, process_id: str, payload: str | None, ttl_s: float):  # type: ignore[no-untyped-def]
        self.clock.us += self.to_store_us
        reply = await self.up.share_load(process_id, payload, ttl_s)
        self.clock.us += self.back_us
        return reply


def _fast(cluster: ClusterState) -> list[ReplicaState]:
    return cluster.pools["fast"].replicas


def _processes(
    store: Store, n: int, clock: Clock | None = None, skews: list[float] | None = None, on_store_clock: bool = True
) -> tuple[list[ClusterState], list[PeerLoad]]:
    """n processes on `clock` (default: the real one), process i's reading it `skews[i]` s ahead."""
    clusters = [make_cluster(make_config(FAST)) for _ in range(n)]
    shares = []
    for i, (c, skew) in enumerate(zip(clusters, skews or [0.0] * n, strict=True)):
        read = (lambda skew=skew: clock.s() + skew) if clock is not None else time.time
        shares.append(PeerLoad(store, lambda c=c: c, SETTINGS, f"gw{i}", read, on_store_clock))  # type: ignore[misc]
    return clusters, shares


def _loads(clusters: list[ClusterState]) -> list[list[int]]:
    return [[r.shared_load for r in _fast(c)] for c in clusters]


async def _early_in_a_redis_round(store: RedisStore, interval_s: float) -> int:
    """Wait for the store's next round to begin (so a few calls all land in it); its number."""
    now_us, _ = await store.share_load("clock-reader", None, 1.0)
    interval_us = int(interval_s * US)
    await asyncio.sleep((interval_us - now_us % interval_us) / US + 0.005)
    return now_us // interval_us + 1


async def test_whoever_exchanges_first_in_a_round_every_process_gets_everyone_s_counts_of_the_round_before(
    redis_store: RedisStore,
) -> None:
    settings = PeerLoadSettings(interval_s=0.2, ttl_s=1.0)
    clusters = [make_cluster(make_config(FAST)) for _ in range(3)]
    shares = [PeerLoad(redis_store, lambda c=c: c, settings, f"gw{i}") for i, c in enumerate(clusters)]
    for i, c in enumerate(clusters):
        _fast(c)[i].on_start()
    _fast(clusters[0])[0].on_start()
    k = await _early_in_a_redis_round(redis_store, settings.interval_s)
    for share in shares:
        await share.exchange()  # round k: counts [2, 1, 1]
    for c in clusters:
        _fast(c)[2].on_start()  # round k + 1's counts differ from round k's
    await _early_in_a_redis_round(redis_store, settings.interval_s)
    got = [await share.exchange() for share in shares]  # the first reads before the others published k + 1
    round_k = {replica_field("fast", url): n for url, n in zip(FAST, [2, 1, 1], strict=True)}
    assert [(p.round, p.totals) for p in got if p is not None] == [(k, round_k)] * 3
    assert all(p is not None and p.at == pytest.approx((k + 2) * settings.interval_s) for p in got)


async def test_a_snapshot_comes_into_force_at_the_next_round_s_start_in_every_process_however_late_it_arrived() -> None:
    clock = Clock()
    store = MemoryStore(clock_us=lambda: clock.us)
    clusters, shares = _processes(store, 2, clock)
    _fast(clusters[0])[0].on_start()
    _fast(clusters[1])[1].on_start()
    clock.at_round(10)
    for share in shares:
        await share.exchange()
    clock.at_round(11, 0.1)  # gw0 exchanges on time, gw1's busy loop runs its exchange just before the boundary
    await shares[0].exchange()
    clock.at_round(11, 0.99)
    await shares[1].exchange()
    assert [s.in_force() for s in shares] == [-1, -1]  # round 10's counts wait for round 12
    clock.at_round(12, 0.0)
    assert [s.in_force() for s in shares] == [10, 10]
    assert _loads(clusters) == [[1, 1, 0], [1, 1, 0]]


async def test_processes_whose_clocks_are_skewed_switch_at_the_same_store_instant() -> None:
    clock = Clock()  # the store's
    store = MemoryStore(clock_us=lambda: clock.us)
    skews = [-0.04, 0.0, 0.04]  # of a 0.1 s round
    clusters, shares = _processes(store, 3, clock, skews)
    # The same hosts on their own clocks (a store of their own: the same process ids)
    locals_, local = _processes(MemoryStore(clock_us=lambda: clock.us), 3, clock, skews, on_store_clock=False)
    for i, c in enumerate(clusters + locals_):
        _fast(c)[i % 3].on_start()
    for k in (10, 11):
        clock.at_round(k)
        for share in shares + local:
            await share.exchange()
    assert [s.offset for s in shares] == [pytest.approx(-d, abs=1e-9) for d in skews]
    clock.at_round(11, 0.97)
    assert [s.in_force() for s in shares] == [-1, -1, -1]
    assert [s.in_force() for s in local] == [-1, -1, 10]  # 40 ms ahead: already in round 12 by its clock
    clock.at_round(12, 0.0)
    assert [s.in_force() for s in shares] == [10, 10, 10]
    assert _loads(clusters) == [[1, 1, 1]] * 3
    assert shares[2].stamped() == f"snapshot=10;decided={clock.us}"  # the store's µs: rounds group alike
    clock.at_round(12, 0.03)
    assert [s.in_force() for s in local] == [-1, 10, 10]  # 40 ms behind: a third of the round on the old one


async def test_a_slow_round_trip_does_not_move_the_offset_nor_the_switch() -> None:
    clock = Clock()
    slow = Slow(MemoryStore(clock_us=lambda: clock.us), clock)
    _, shares = _processes(slow, 2, clock, [0.04, -0.01])
    clock.at_round(20)
    for share in shares:
        await share.exchange()
    clock.at_round(21)
    slow.to_store_us, slow.back_us = 2_000, 30_000  # queued on the way back: its midpoint is 14 ms off
    pending = await shares[0].exchange()
    slow.to_store_us = slow.back_us = 0
    await shares[1].exchange()
    assert [s.offset for s in shares] == [pytest.approx(-0.04, abs=1e-9), pytest.approx(0.01, abs=1e-9)]
    assert pending is not None and pending.at == pytest.approx(22 * SETTINGS.interval_s)
    clock.at_round(21, 0.999)
    assert [s.in_force() for s in shares] == [-1, -1]
    clock.at_round(22, 0.0)
    assert [s.in_force() for s in shares] == [20, 20]


async def test_an_offset_stepping_back_past_a_due_switch_skips_no_snapshot() -> None:
    clock = Clock()
    slow = Slow(MemoryStore(clock_us=lambda: clock.us), clock)
    _, (me, other) = _processes(slow, 2, clock)

    async def exchange(share: PeerLoad, k: int, phase: float, to_ms: int, back_ms: int) -> None:
        clock.at_round(k, phase)
        slow.to_store_us, slow.back_us = to_ms * 1000, back_ms * 1000
        await share.exchange()

    await exchange(me, 84, 0.5, 20, 0)  # its midpoint says the store is 10 ms ahead: the best so far
    for k in range(85, 92):
        await exchange(other, k, 0.5, 0, 0)
        await exchange(me, k, 0.5, 0, 22)  # 11 ms behind, each a longer round trip
    assert me.offset == pytest.approx(0.01)
    # Round 92's exchange runs late: sent 15 ms before the round, stamped 5 ms into it, read 10 ms into it. The
    # +10 ms sample leaves the window, the estimate steps to -11 ms: back before round 90's switch, due until then.
    await exchange(me, 91, 0.85, 20, 5)
    assert me.offset == pytest.approx(-0.011)
    clock.at_round(92, 0.5)
    assert [me.in_force(), other.in_force()] == [90, 90]


async def test_a_snapshot_that_returned_after_its_instant_comes_into_force_at_the_next_pick() -> None:
    clock = Clock()
    store = MemoryStore(clock_us=lambda: clock.us)
    clusters, shares = _processes(store, 2, clock)
    _fast(clusters[0])[2].on_start()
    clock.at_round(20)
    await shares[0].exchange()
    await shares[1].exchange()
    clock.at_round(21)
    pending = await shares[0].exchange()
    assert pending is not None
    clock.at_round(22, 0.3)  # the reply was processed a third of a round after the switch
    assert shares[0].in_force() == 20
    assert _loads(clusters)[0] == [0, 0, 1]


async def test_a_missed_round_keeps_the_last_snapshot_one_round_more_then_the_live_view() -> None:
    clock = Clock()
    store = MemoryStore(clock_us=lambda: clock.us)
    clusters, shares = _processes(store, 2, clock)
    _fast(clusters[1])[0].on_start()
    clock.at_round(30)
    await shares[0].exchange()
    await shares[1].exchange()
    clock.at_round(31)
    await shares[0].exchange()
    await shares[1].exchange()
    clock.at_round(32, 0.0)
    assert shares[0].in_force() == 30
    clock.at_round(33, 0.99)  # no exchange returned in round 32: round 30's counts decide one round more
    assert shares[0].in_force() == 30
    clock.at_round(34, 0.0)
    assert shares[0].in_force() == -1
    assert _loads(clusters)[0] == [-1, -1, -1]


async def test_with_the_store_down_every_process_leaves_the_snapshot_at_the_same_instant() -> None:
    clock = Clock()
    store = Flaky(MemoryStore(clock_us=lambda: clock.us))
    _, shares = _processes(store, 2, clock)
    for k in (40, 41):
        clock.at_round(k, 0.2 + 0.1 * (k - 40))
        for share in shares:
            await share.exchange()
    store.down = True
    clock.at_round(42)
    assert [await s.exchange() for s in shares] == [None, None]
    clock.at_round(43, 0.999)  # round 40's counts (read in 41) decide in 42, and in 43 for want of newer ones
    assert [s.in_force() for s in shares] == [40, 40]
    clock.at_round(44, 0.0)
    assert [s.in_force() for s in shares] == [-1, -1]


async def test_a_process_alone_decides_on_its_live_view_from_the_next_round_on() -> None:
    clock = Clock()
    store = MemoryStore(clock_us=lambda: clock.us)
    clusters, shares = _processes(store, 1, clock)
    _fast(clusters[0])[0].on_start()
    clock.at_round(50)
    pending = await shares[0].exchange()
    assert pending is not None and pending.totals is None
    clock.at_round(51, 0.0)
    assert shares[0].in_force() == -1
    assert _loads(clusters) == [[-1, -1, -1]]


async def test_exchanges_are_counted_by_outcome_with_the_processes_of_the_last_snapshot() -> None:
    clock = Clock()
    slow = Slow(MemoryStore(clock_us=lambda: clock.us), clock)
    store = Flaky(slow)
    _, shares = _processes(store, 2, clock)
    clock.at_round(70)
    for share in shares:
        await share.exchange()  # nobody published in round 69
    clock.at_round(71)
    await shares[0].exchange()  # both published in round 70
    clock.at_round(72)
    slow.back_us = int(0.6 * SETTINGS.interval_s * US)  # the reply of round 72's exchange is read in round 73
    await shares[1].exchange()
    store.down = True
    await shares[0].exchange()
    assert [s.exchanges for s in shares] == [
        {"shared": 1, "alone": 1, "late": 0, "store_unavailable": 1, "failed": 0},
        {"shared": 0, "alone": 1, "late": 1, "store_unavailable": 0, "failed": 0},
    ]
    assert [s.processes for s in shares] == [2, 2]


async def test_an_exchange_that_reached_the_store_a_round_late_schedules_the_store_s_round() -> None:
    clock = Clock()
    store_clock = [T0]
    store = MemoryStore(clock_us=lambda: store_clock[0])
    _, shares = _processes(store, 2, clock)
    store_clock[0] = int(60.5 * SETTINGS.interval_s * US)
    for share in shares:
        await share.exchange()
    clock.at_round(60, 0.95)  # the process sent it in round 60
    store_clock[0] = int(61.05 * SETTINGS.interval_s * US)  # the store ran it in round 61
    await shares[1].exchange()
    pending = await shares[0].exchange()
    rounds = [pytest.approx(k * SETTINGS.interval_s) for k in (62, 64)]
    assert pending == Pending(rounds[0], 60, {}, rounds[1])


async def test_the_same_snapshot_gives_every_process_the_same_pick_where_live_views_differ(
    redis_store: RedisStore,
) -> None:
    clusters, shares = _processes(redis_store, 2)
    policy = PrefixAffinity(1.25)
    key = 77
    home = policy.select(_fast(clusters[0]), key).chosen.index
    _fast(clusters[0])[home].on_start()
    _fast(clusters[1])[(home + 1) % 3].on_start()
    live = [policy.select(_fast(c), key).chosen.index for c in clusters]
    assert live[0] != live[1]  # each sees only its own request: one spills, the other goes home
    pending = [await share.exchange() for share in shares]
    await asyncio.sleep(SETTINGS.interval_s)
    pending = [await share.exchange() for share in shares]
    await asyncio.sleep(max(p.at for p in pending if p is not None) - shares[0].now() + 0.002)  # Redis' instant
    assert len({s.in_force() for s in shares}) == 1
    assert len({policy.select(_fast(c), key).chosen.index for c in clusters}) == 1


async def test_pick_brings_the_due_snapshot_into_force_and_stamps_the_route_only_when_asked() -> None:
    clock = Clock()
    store = MemoryStore(clock_us=lambda: clock.us)
    stamped = PeerLoadSettings(route_header=True)
    clusters = [make_cluster(make_config(FAST, [])) for _ in range(2)]
    shares = [
        PeerLoad(store, lambda c=c: c, s, f"gw{i}", clock.s)  # type: ignore[misc]
        for i, (c, s) in enumerate(zip(clusters, [stamped, SETTINGS], strict=True))
    ]
    for k in (70, 71):
        clock.at_round(k)
        for share in shares:
            await share.exchange()
    clock.at_round(72, 0.25)
    cfg = make_config(FAST, [])
    routes = [
        pick(model=cfg.models[0], decision=ClassDecision("interactive", "default"), key=5, cluster=c, cfg=cfg.routing)
        for c in clusters
    ]
    assert routes[0].load_stamp == f"snapshot=70;decided={clock.us}"
    assert routes[1].load_stamp is None
    assert _loads(clusters) == [[0, 0, 0], [0, 0, 0]]  # in force in both, by pick alone


def test_a_publication_counts_for_the_round_the_store_stamped_it_in() -> None:
    interval_us = 100_000
    payload = '{"c": {"x": 3}, "h": [[1000050000, {"x": 2}], [1000010000, {"x": 1}]]}'
    assert counts_of_round(1000150000, payload, 10001, interval_us) == {"x": 3}
    assert counts_of_round(1000150000, payload, 10000, interval_us) == {"x": 2}  # the last one in that round
    assert counts_of_round(1000150000, payload, 9999, interval_us) is None
    assert counts_of_round(1000150000, "not json", 10001, interval_us) is None
    assert counts_of_round(1000150000, '{"c": {"x": "2", "y": -1}, "h": []}', 10001, interval_us) == {}


def test_processes_exchange_in_the_middle_of_every_round_on_the_wall_clock() -> None:
    assert until_exchange(1000.03, 0.1) == pytest.approx(0.02)
    assert until_exchange(1000.07, 0.1) == pytest.approx(0.08)
    assert until_exchange(1000.05, 0.1) == pytest.approx(0.0, abs=1e-9)


def test_counts_are_named_by_pool_and_url_so_processes_with_one_config_agree() -> None:
    r = _fast(make_cluster(make_config(FAST)))[1]
    assert replica_field(r.pool, r.url) == "fast http://127.0.0.1:9102"


async def test_a_snapshot_lands_in_the_cluster_state_discovery_put_in_place() -> None:
    clock = Clock()
    store = MemoryStore(clock_us=lambda: clock.us)
    other = make_cluster(make_config(FAST))
    _fast(other)[2].on_start()
    share_other = PeerLoad(store, lambda: other, SETTINGS, "other", clock.s)
    current = [make_cluster(make_config(FAST[:2]))]
    share = PeerLoad(store, lambda: current[0], SETTINGS, "me", clock.s)
    for k in (80, 81):
        clock.at_round(k)
        await share_other.exchange()
        await share.exchange()
    current[0] = ClusterState.from_config(make_config(FAST), current[0])  # rediscovered: the third replica joined
    assert current[0].peer_clock is not None  # the rebuilt state keeps the hook pick calls
    clock.at_round(82, 0.0)
    assert share.in_force() == 80
    assert [r.shared_load for r in _fast(current[0])] == [0, 0, 1]


def test_sharing_needs_a_shared_store_and_can_be_turned_off() -> None:
    base = {"models": [{"name": "m", "pools": ["p"]}],
            "pools": {"p": {"role": "interactive", "served_model": "m", "replicas": FAST,
                            "price": {"gpu_hour_usd": 1, "capacity_tokens_per_s": 10}}}}  # fmt: skip
    cluster = make_cluster(make_config(FAST))
    store = MemoryStore()
    assert PeerLoad.for_config(parse_config(base), store, lambda: cluster) is None
    assert cluster.peer_clock is None  # without sharing, pick calls nothing
    shared = parse_config({**base, "store": {"url": "redis://127.0.0.1:1/0"}})
    assert PeerLoad.for_config(shared, store, lambda: cluster) is not None
    off_raw = {**base, "store": {"url": "redis://127.0.0.1:1/0"}, "routing": {"peer_load": {"enabled": False}}}
    assert PeerLoad.for_config(parse_config(off_raw), store, lambda: make_cluster(make_config(FAST))) is None


async def test_two_gateways_on_one_redis_share_a_snapshot_in_the_background(redis_url: str, key_prefix: str) -> None:
    raw = {"models": [{"name": "m", "pools": ["p"]}],
           "pools": {"p": {"role": "interactive", "served_model": "m", "replicas": FAST,
                           "price": {"gpu_hour_usd": 1, "capacity_tokens_per_s": 10}}},
           "store": {"url": redis_url, "key_prefix": key_prefix, "socket_timeout_s": 2},
           "routing": {"probe_interval_s": 60,
                       "peer_load": {"interval_s": 0.05, "ttl_s": 1}}}  # fmt: skip
    a, b = Gateway(parse_config(raw)), Gateway(parse_config(raw))
    await a.start()
    await b.start()
    try:
        a.cluster.pools["p"].replicas[1].on_start()
        assert b.peer_load is not None
        for _ in range(200):  # rounds every 50 ms; a loaded test machine may take a few
            if b.peer_load.in_force() >= 0 and b.cluster.pools["p"].replicas[1].shared_load == 1:
                break
            await asyncio.sleep(0.02)
        assert [r.shared_load for r in b.cluster.pools["p"].replicas] == [0, 1, 0]
        families = {f.name: f for f in text_string_to_metric_families(b.render_metrics()[0].decode())}
        assert families["gateway_peer_load_processes"].samples[0].value == 2
        assert families["gateway_peer_load_in_force"].samples[0].value == 1
        assert abs(families["gateway_peer_load_clock_offset_seconds"].samples[0].value) < 0.05  # Redis on this host
        shared = [s for s in families["gateway_peer_load_exchanges"].samples if s.labels["outcome"] == "shared"]
        assert shared[0].value >= 1
    finally:
        await a.stop()
        await b.stop()
