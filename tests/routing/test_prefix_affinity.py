from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.routing.hashing import rendezvous_score
from app.routing.prefix_affinity import PrefixAffinity, bound
from app.routing.state import ReplicaState
from tests.routing.factory import replicas, set_load

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 6)]


def test_same_key_same_home_while_load_is_even() -> None:
    reps = replicas(URLS)
    policy = PrefixAffinity(1.25)
    homes = {policy.select(reps, key=12345).chosen.url for _ in range(5)}
    assert len(homes) == 1
    sel = policy.select(reps, key=12345)
    assert sel.reason == "prefix_home"
    assert sel.runner_up is not None and sel.runner_up is not sel.chosen


def test_keys_spread_over_replicas() -> None:
    reps = replicas(URLS)
    counts = Counter(PrefixAffinity().select(reps, key=k * 7919).chosen.url for k in range(2000))
    assert set(counts) == set(URLS)
    assert max(counts.values()) < 2 * min(counts.values())


def test_overloaded_home_spills_to_least_loaded_with_home_as_runner_up() -> None:
    reps = replicas(URLS)
    policy = PrefixAffinity(1.25)
    home = policy.select(reps, key=42).chosen
    set_load(home, running=10)
    others = [r for r in reps if r is not home]
    for i, r in enumerate(others):
        set_load(r, running=i + 1)
    sel = policy.select(reps, key=42)
    assert sel.reason == "prefix_bounded_spill"
    assert sel.chosen is others[0]
    assert sel.runner_up is home


def test_rendezvous_moves_only_the_keys_of_a_leaving_replica_and_restores_them() -> None:
    reps = replicas(URLS)
    policy = PrefixAffinity()
    keys = [k * 104729 + 17 for k in range(3000)]
    before = {k: policy.select(reps, k).chosen.url for k in keys}
    gone = reps[2]
    after = {k: policy.select([r for r in reps if r is not gone], k).chosen.url for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == gone.url}
    back = {k: policy.select(reps, k).chosen.url for k in keys}
    assert back == before


def test_load_bound_below_one_is_rejected() -> None:
    with pytest.raises(ValueError):
        PrefixAffinity(0.9)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=6),
    c=st.sampled_from([1.0, 1.1, 1.25, 1.5, 2.0]),
    # Heavily skewed: few distinct keys, so most requests want the same home.
    keys=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=120),
    finish=st.lists(st.booleans(), max_size=120),
    # Requests of other clients, seen by the last scrape.
    others=st.lists(st.integers(min_value=0, max_value=12), min_size=6, max_size=6),
)
def test_no_placement_exceeds_c_times_mean_load(
    n: int, c: float, keys: list[int], finish: list[bool], others: list[int]
) -> None:
    reps = [ReplicaState(f"http://h{i}:1", "p", i) for i in range(n)]
    for r, running in zip(reps, others, strict=False):
        set_load(r, running=running)
    policy = PrefixAffinity(c)
    in_flight: list[ReplicaState] = []
    for i, key in enumerate(keys):
        chosen = policy.select(reps, key).chosen
        chosen.on_start()
        in_flight.append(chosen)
        total = sum(r.load() for r in reps)
        assert chosen.load() <= bound(c, total, n)
        if i < len(finish) and finish[i] and in_flight:
            in_flight.pop(0).on_success()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=6),
    c=st.sampled_from([1.0, 1.25, 1.5]),
    keys=st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=150),
)
def test_with_arrivals_only_every_replica_stays_within_the_bound(n: int, c: float, keys: list[int]) -> None:
    reps = [ReplicaState(f"http://h{i}:1", "p", i) for i in range(n)]
    policy = PrefixAffinity(c)
    for key in keys:
        policy.select(reps, key).chosen.on_start()
        total = sum(r.load() for r in reps)
        assert max(r.load() for r in reps) <= bound(c, total, n)


def test_bound_counts_scraped_load_from_other_clients() -> None:
    reps = replicas(URLS[:2])
    policy = PrefixAffinity(1.25)
    home = policy.select(reps, key=9).chosen
    set_load(home, running=6)  # someone else's requests, seen only through /metrics
    assert policy.select(reps, key=9).chosen is not home


def test_home_is_the_highest_rendezvous_score() -> None:
    reps = replicas(URLS)
    for key in (1, 2**63 + 5, 987654321987):
        expected = max(reps, key=lambda r: rendezvous_score(key, r.hash))
        assert PrefixAffinity().select(reps, key).chosen is expected


def test_a_min_bound_keeps_low_load_on_the_home_and_the_bound_applies_above_it() -> None:
    from tests.routing.factory import replicas as make

    reps = make(["http://a:1", "http://b:1", "http://c:1", "http://d:1"])
    key = 12345
    home = PrefixAffinity(1.25).select(reps, key).chosen
    home.in_flight = 3  # three requests of this prefix already there, none elsewhere
    assert PrefixAffinity(1.25).select(reps, key).reason == "prefix_bounded_spill"
    kept = PrefixAffinity(1.25, min_bound=8).select(reps, key)
    assert kept.chosen is home and kept.reason == "prefix_home"
    home.in_flight = 8
    assert PrefixAffinity(1.25, min_bound=8).select(reps, key).reason == "prefix_bounded_spill"


def test_ranked_spill_overflows_to_the_next_replica_in_the_keys_order_within_the_bound() -> None:
    reps = replicas(URLS)
    key = 4242
    order = sorted(reps, key=lambda r: rendezvous_score(key, r.hash), reverse=True)
    set_load(order[0], running=6)  # the home: over the bound
    set_load(order[-1], running=0)  # least loaded, but last in the key's order
    for r in order[1:-1]:
        set_load(r, running=1)
    ranked = PrefixAffinity(1.25, spill="ranked").select(reps, key)
    assert (ranked.chosen, ranked.runner_up, ranked.reason) == (order[1], order[0], "prefix_bounded_spill")
    assert PrefixAffinity(1.25).select(reps, key).chosen is order[-1]  # least_loaded picks the idle one
    set_load(order[1], running=4)  # the second is over the bound too: the third takes it
    assert PrefixAffinity(1.25, spill="ranked").select(reps, key).chosen is order[2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=2, max_size=6), st.integers(0, 2**64 - 1))
def test_ranked_spill_never_breaks_the_bound(loads: list[int], key: int) -> None:
    reps = replicas([f"http://h{i}:1" for i in range(len(loads))])
    for r, n in zip(reps, loads, strict=True):
        set_load(r, running=n)
    sel = PrefixAffinity(1.25, spill="ranked").select(reps, key)
    assert sel.chosen.load() + 1 <= bound(1.25, sum(loads) + 1, len(loads))


def test_a_shared_snapshot_replaces_the_live_load_in_the_bound() -> None:
    reps = replicas(URLS)
    key = 99
    home = PrefixAffinity(1.25).select(reps, key).chosen
    set_load(home, running=6)  # the live view: over the bound
    assert PrefixAffinity(1.25).select(reps, key).reason == "prefix_bounded_spill"
    for r in reps:
        r.shared_load = 1  # every gateway's requests at the round's start: even
    assert PrefixAffinity(1.25).select(reps, key).chosen is home
