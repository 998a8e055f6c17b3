"""Gateway processes sharing a Store judge bounded load on one snapshot of all their requests (real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.config import parse_config
from app.pipeline import Gateway
from app.routing.peer_load import (
    PeerLoad,
    previous_round_counts,
    replica_field,
    round_starting,
    until_next_round,
)
from app.routing.peer_load_config import PeerLoadSettings
from app.routing.prefix_affinity import PrefixAffinity
from app.routing.state import ClusterState, ReplicaState
from app.store.base import StoreUnavailable
from app.store.memory import MemoryStore
from app.store.redis_store import RedisStore
from tests.routing.factory import make_cluster, make_config
from tests.store.redis_fixtures import loose_redis_store

FAST = ["http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103"]
SETTINGS = PeerLoadSettings()


@pytest.fixture
async def redis_store(redis_url: str, key_prefix: str) -> AsyncIterator[RedisStore]:
    store = loose_redis_store(redis_url, key_prefix)
    yield store
    await store.aclose()


def _fast(cluster: ClusterState) -> list[ReplicaState]:
    return cluster.pools["fast"].replicas


async def _round(shares: list[PeerLoad], k: int) -> None:
    for share in shares:
        await share.exchange(k)


async def test_in_a_round_every_process_holds_everyone_s_counts_of_the_round_before(redis_store: RedisStore) -> None:
    clusters = [make_cluster(make_config(FAST)) for _ in range(3)]
    shares = [PeerLoad(redis_store, lambda c=c: c, SETTINGS, f"gw{i}") for i, c in enumerate(clusters)]
    for _ in range(2):
        _fast(clusters[0])[0].on_start()
    _fast(clusters[1])[0].on_start()
    _fast(clusters[1])[2].on_start()
    await _round(shares, 10)
    _fast(clusters[0])[1].on_start()  # after round 10's publication: in round 11's counts
    await _round(shares, 11)
    assert [[r.shared_load for r in _fast(c)] for c in clusters] == [[3, 0, 1]] * 3


async def test_whether_the_others_published_this_round_yet_or_not_every_process_sums_the_same(
    redis_store: RedisStore,
) -> None:
    clusters = [make_cluster(make_config(FAST)) for _ in range(3)]
    shares = [PeerLoad(redis_store, lambda c=c: c, SETTINGS, f"gw{i}") for i, c in enumerate(clusters)]
    for i, c in enumerate(clusters):
        _fast(c)[i].on_start()
    await _round(shares, 20)
    for c in clusters:
        _fast(c)[0].on_start()  # round 21's counts differ from round 20's
    await shares[0].exchange(21)  # first in round 21: the others' entries are still tagged 20
    await shares[1].exchange(21)
    await shares[2].exchange(21)  # last: everyone's entries are tagged 21
    assert [[r.shared_load for r in _fast(c)] for c in clusters] == [[1, 1, 1]] * 3


async def test_the_same_snapshot_gives_every_process_the_same_pick_where_live_views_differ(
    redis_store: RedisStore,
) -> None:
    clusters = [make_cluster(make_config(FAST)) for _ in range(2)]
    policy = PrefixAffinity(1.25)
    key = 77
    home = policy.select(_fast(clusters[0]), key).chosen.index
    _fast(clusters[0])[home].on_start()
    _fast(clusters[1])[(home + 1) % 3].on_start()
    live = [policy.select(_fast(c), key).chosen.index for c in clusters]
    assert live[0] != live[1]  # each sees only its own request: one spills, the other goes home
    shares = [PeerLoad(redis_store, lambda c=c: c, SETTINGS, f"gw{i}") for i, c in enumerate(clusters)]
    await _round(shares, 1)
    await _round(shares, 2)
    assert len({policy.select(_fast(c), key).chosen.index for c in clusters}) == 1


async def test_alone_or_with_the_store_down_a_process_keeps_its_live_view() -> None:
    class Down(MemoryStore):
        async def share_load(self, process_id: str, payload: str | None, ttl_s: float) -> dict[str, str]:
            raise StoreUnavailable("down")

    cluster = make_cluster(make_config(FAST))
    _fast(cluster)[0].shared_load = 5
    assert not await PeerLoad(MemoryStore(), lambda: cluster, SETTINGS).exchange(1)
    assert _fast(cluster)[0].shared_load == -1
    _fast(cluster)[0].shared_load = 5
    assert not await PeerLoad(Down(), lambda: cluster, SETTINGS).exchange(1)
    assert _fast(cluster)[0].shared_load == -1


async def test_a_round_applies_to_the_cluster_state_discovery_put_in_place() -> None:
    store = MemoryStore()
    other = make_cluster(make_config(FAST))
    _fast(other)[2].on_start()
    await PeerLoad(store, lambda: other, SETTINGS, "other").exchange(4)
    current = [make_cluster(make_config(FAST[:2]))]
    share = PeerLoad(store, lambda: current[0], SETTINGS, "me")
    current[0] = make_cluster(make_config(FAST))  # rediscovered: the third replica joined
    assert await share.exchange(5)
    assert [r.shared_load for r in _fast(current[0])] == [0, 0, 1]


def test_a_payload_of_an_older_round_or_a_broken_one_counts_nothing() -> None:
    assert previous_round_counts('{"r": 7, "c": {"x": 2}, "p": {"x": 1}}', 7) == {"x": 1}
    assert previous_round_counts('{"r": 6, "c": {"x": 2}, "p": {"x": 1}}', 7) == {"x": 2}
    assert previous_round_counts('{"r": 5, "c": {"x": 2}, "p": {"x": 1}}', 7) is None
    assert previous_round_counts("not json", 7) is None
    assert previous_round_counts('{"r": 7, "c": {}, "p": {"x": "2", "y": -1}}', 7) == {}


def test_rounds_start_at_multiples_of_the_interval_on_the_wall_clock() -> None:
    assert until_next_round(1000.03, 0.1) == pytest.approx(0.07)
    assert until_next_round(1000.0, 0.25) == pytest.approx(0.25)


def test_a_timer_that_fires_just_before_the_boundary_starts_the_round_after_it() -> None:
    assert round_starting(1000.0995, 0.1) == 10001  # woke 0.5 ms early
    assert round_starting(1000.1004, 0.1) == 10001  # or late


def test_counts_are_named_by_pool_and_url_so_processes_with_one_config_agree() -> None:
    r = _fast(make_cluster(make_config(FAST)))[1]
    assert replica_field(r.pool, r.url) == "fast http://127.0.0.1:9102"


def test_sharing_needs_a_shared_store_and_can_be_turned_off() -> None:
    base = {"models": [{"name": "m", "pools": ["p"]}],
            "pools": {"p": {"role": "interactive", "served_model": "m", "replicas": FAST,
                            "price": {"gpu_hour_usd": 1, "capacity_tokens_per_s": 10}}}}  # fmt: skip
    cluster = make_cluster(make_config(FAST))
    store = MemoryStore()
    assert PeerLoad.for_config(parse_config(base, env={}), store, lambda: cluster) is None
    shared = parse_config({**base, "store": {"url": "redis://127.0.0.1:1/0"}}, env={})
    assert PeerLoad.for_config(shared, store, lambda: cluster) is not None
    off_raw = {**base, "store": {"url": "redis://127.0.0.1:1/0"}, "routing": {"peer_load": {"enabled": False}}}
    assert PeerLoad.for_config(parse_config(off_raw, env={}), store, lambda: cluster) is None


async def test_two_gateways_on_one_redis_share_a_snapshot_in_the_background(redis_url: str, key_prefix: str) -> None:
    raw = {"models": [{"name": "m", "pools": ["p"]}],
           "pools": {"p": {"role": "interactive", "served_model": "m", "replicas": FAST,
                           "price": {"gpu_hour_usd": 1, "capacity_tokens_per_s": 10}}},
           "store": {"url": redis_url, "key_prefix": key_prefix, "socket_timeout_s": 2},
           "routing": {"probe_interval_s": 60,
                       "peer_load": {"interval_s": 0.05, "ttl_s": 1}}}  # fmt: skip
    a, b = Gateway(parse_config(raw, env={})), Gateway(parse_config(raw, env={}))
    await a.start()
    await b.start()
    try:
        a.cluster.pools["p"].replicas[1].on_start()
        for _ in range(200):  # rounds every 50 ms; a loaded test machine may take a few
            if b.cluster.pools["p"].replicas[1].shared_load == 1:
                break
            await asyncio.sleep(0.02)
        assert [r.shared_load for r in b.cluster.pools["p"].replicas] == [0, 1, 0]
    finally:
        await a.stop()
        await b.stop()
