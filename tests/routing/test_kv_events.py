"""The kv_events pick: expected uncached prefill plus queueing beyond capacity; falls back when the index is partial."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.config import ConfigError, parse_config
from app.config.policies import KvEventsParams
from app.records import PromptBlocks
from app.routing.kv_events import KvEvents
from app.routing.prefix_affinity import PrefixAffinity
from app.routing.state import ClusterState, ReplicaState
from tests.routing.factory import PRICE

A, B, C = "http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103"


class Hub:
    """An event index with fixed contents: replica URL → block hashes held."""

    def __init__(self, held: dict[str, list[int]], broken: frozenset[str] = frozenset()) -> None:
        self.held = held
        self.broken = broken
        self.fallbacks = 0
        self.noted: list[tuple[str, int]] = []

    def is_whole(self, url: str) -> bool:
        return url not in self.broken

    def overlap_blocks(self, url: str, hashes: Sequence[int]) -> int:
        have = set(self.held.get(url, ()))
        n = 0
        for h in hashes:
            if h not in have:
                break
            n += 1
        return n

    def note_request(self, url: str, expected_new_blocks: int) -> None:
        self.noted.append((url, expected_new_blocks))

    def record_fallback(self) -> None:
        self.fallbacks += 1


def policy(hub: Hub, **params: int) -> KvEvents:
    return KvEvents(KvEventsParams(block_size=16, **params), hub, PrefixAffinity(1.25))


def replicas(capacity: int = 0) -> list[ReplicaState]:
    return [ReplicaState(u, "p", i, capacity=capacity) for i, u in enumerate((A, B, C))]


BLOCKS = PromptBlocks(n_tokens=16 * 10 + 5, hashes=list(range(10)))


def test_goes_where_the_prefix_is_cached_and_predicts_the_cached_tokens() -> None:
    hub = Hub({B: list(range(8)), C: list(range(3))})
    sel = policy(hub).select(replicas(), key=1, blocks=BLOCKS)
    assert sel.chosen.url == B and sel.reason == "kv_hit" and sel.cached_tokens == 8 * 16
    assert sel.runner_up is not None and sel.runner_up.url == C
    assert hub.noted == [(B, 2)]


def test_a_full_prompt_hit_is_capped_below_the_last_token_as_vllm_recomputes_it() -> None:
    exact = PromptBlocks(n_tokens=16 * 4, hashes=[1, 2, 3, 4])
    sel = policy(Hub({A: [1, 2, 3, 4]})).select(replicas(), key=1, blocks=exact)
    assert sel.cached_tokens == 3 * 16


def test_packs_while_the_cached_replica_has_free_slots() -> None:
    reps = replicas(capacity=8)
    reps[1].in_flight = 6  # busy but below its 8 slots
    sel = policy(Hub({B: list(range(8))})).select(reps, key=1, blocks=BLOCKS)
    assert sel.chosen.url == B


def test_spreads_once_the_cached_replica_is_past_its_capacity() -> None:
    reps = replicas(capacity=8)
    reps[1].in_flight = 12  # 5 would wait ahead of this request
    sel = policy(Hub({B: list(range(8))}), load_tokens=512).select(reps, key=1, blocks=BLOCKS)
    assert sel.chosen.url != B and sel.reason == "kv_cold"


def test_a_replica_whose_stream_is_not_whole_sends_the_pick_to_prefix_affinity() -> None:
    hub = Hub({B: list(range(8))}, broken=frozenset({C}))
    sel = policy(hub).select(replicas(), key=1, blocks=BLOCKS)
    assert sel.reason == "kv_fallback" and hub.fallbacks == 1 and sel.cached_tokens is None


def test_no_block_hashes_falls_back_too() -> None:
    hub = Hub({})
    assert policy(hub).select(replicas(), key=1, blocks=None).reason == "kv_fallback"


def test_equal_costs_are_broken_by_the_key_not_by_list_order() -> None:
    chosen = {policy(Hub({})).select(replicas(), key=k, blocks=BLOCKS).chosen.url for k in range(64)}
    assert len(chosen) == 3


def pool_cfg(replicas: list[object], **extra: object) -> dict[str, object]:
    return {"role": "interactive", "served_model": "m", "replicas": replicas, "price": PRICE, **extra}


def test_replicas_may_be_objects_with_their_kv_event_endpoints() -> None:
    raw = {"models": [{"name": "m", "pools": ["p"]}], "pools": {"p": pool_cfg(
        [A, {"url": B + "/", "kv_events": "tcp://127.0.0.1:5557", "kv_replay": "tcp://127.0.0.1:5558"}])}}  # fmt: skip
    p = parse_config(raw).pools["p"]
    assert p.replicas == [A, B]
    assert p.replica_events[B].endpoint == "tcp://127.0.0.1:5557" and p.replica_events[B].topic == "kv"
    assert p.effective_policy().type == "prefix_affinity"  # type: ignore[attr-defined]


def test_kv_events_is_the_default_where_every_replica_publishes_and_a_tokenizer_is_named() -> None:
    reps = [{"url": A, "kv_events": "tcp://127.0.0.1:5557"}, {"url": B, "kv_events": "tcp://127.0.0.1:5567"}]
    raw = {"models": [{"name": "m", "pools": ["p"]}], "pools": {"p": pool_cfg(reps, tokenizer="/models/x")}}
    assert parse_config(raw).pools["p"].effective_policy().type == "kv_events"  # type: ignore[attr-defined]


def test_a_malformed_replica_object_is_a_config_problem() -> None:
    raw = {"models": [{"name": "m", "pools": ["p"]}], "pools": {"p": pool_cfg([{"url": A, "kv": "x"}])}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert "replicas[0]" in str(info.value)


def test_kv_events_without_any_event_source_builds_prefix_affinity() -> None:
    raw = {"models": [{"name": "m", "pools": ["p"]}], "pools": {"p": pool_cfg([A, B], policy="kv_events")}}
    cluster = ClusterState.from_config(parse_config(raw))
    assert cluster.pools["p"].policy.name == "prefix_affinity"


def test_a_burst_beyond_capacity_counts_as_queued_before_any_scrape_says_so() -> None:
    r = ReplicaState(A, capacity=4)
    r.in_flight = 7
    assert r.queued() == 3 and r.utilization() == 1.0
