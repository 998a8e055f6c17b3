from app.admission.saturation import assess, replica_saturation
from app.config.admission import AdmissionConfig
from app.routing.state import ReplicaState
from tests.admission.fakes import FakeReplica

CFG = AdmissionConfig(enabled=True, max_waiting_per_replica=4, kv_usage_threshold=0.95)


def test_a_replica_with_a_short_queue_and_free_kv_has_room() -> None:
    assert replica_saturation(FakeReplica(waiting=3, kv_usage=0.5), CFG) is None


def test_a_replica_is_saturated_by_its_queue_or_by_its_kv_cache() -> None:
    assert replica_saturation(FakeReplica(waiting=4), CFG) == "waiting"
    assert replica_saturation(FakeReplica(kv_usage=0.95), CFG) == "kv_usage"


def test_the_queue_counts_the_gateways_sends_since_the_scrape() -> None:
    r = FakeReplica(waiting=2, in_flight=12, in_flight_at_scrape=10)
    assert replica_saturation(r, CFG) == "waiting"


def test_the_pool_is_saturated_only_when_every_replica_is() -> None:
    one_free = assess([FakeReplica(waiting=9), FakeReplica(waiting=0)], CFG)
    assert not one_free.saturated and one_free.saturated_replicas == 1
    both = assess([FakeReplica(waiting=9), FakeReplica(kv_usage=0.99)], CFG)
    assert both.saturated and both.reason == "waiting"


def test_excess_is_what_the_engines_queue_beyond_the_threshold() -> None:
    sat = assess([FakeReplica(waiting=10), FakeReplica(waiting=4), FakeReplica(kv_usage=1.0, waiting=1)], CFG)
    assert sat.saturated
    assert sat.excess == 6


def test_a_pool_without_replicas_in_rotation_is_not_saturated() -> None:
    sat = assess([], CFG)
    assert not sat.saturated and not sat.replicas_saturated


def test_the_gateways_in_flight_tokens_saturate_the_pool_at_the_cap() -> None:
    cfg = AdmissionConfig(enabled=True, max_in_flight_tokens=1000)
    assert not assess([FakeReplica()], cfg, in_flight_tokens=999).saturated
    sat = assess([FakeReplica()], cfg, in_flight_tokens=1000)
    assert sat.saturated and sat.reason == "in_flight_tokens" and not sat.replicas_saturated


def test_the_routers_replica_state_is_read_as_it_is() -> None:
    r = ReplicaState("http://127.0.0.1:1")
    r.apply_metrics({"vllm:num_requests_running": 8, "vllm:num_requests_waiting": 5,
                     "vllm:kv_cache_usage_perc": 0.4}, now=0.0)  # fmt: skip
    sat = assess([r], CFG)
    assert sat.saturated and sat.excess == 1
    r.on_success()  # nothing of ours was in flight: in_flight stays 0, queue estimate unchanged
    assert assess([r], CFG).excess == 1
