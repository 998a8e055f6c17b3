from app.admission.limit import learn_capacity, next_limit
from app.admission.saturation import Saturation
from app.config.admission import AdmissionConfig

CFG = AdmissionConfig(enabled=True, max_waiting_per_replica=4)
SATURATED = Saturation(True, "waiting", replicas=2, saturated_replicas=2, excess=6, queued=14, running=60,
                       full=True)
ROOM = Saturation(False, None, replicas=2, saturated_replicas=1, excess=0, queued=0, running=50)


def test_saturation_caps_in_flight_at_what_leaves_the_engines_full_with_nothing_queued() -> None:
    assert next_limit(None, 74, 0, SATURATED, CFG) == 60


def test_the_cap_never_drops_below_one_request_per_replica() -> None:
    assert next_limit(None, 3, 10, SATURATED, CFG) == 2


def test_room_with_nothing_waiting_removes_the_cap() -> None:
    assert next_limit(34, 30, 0, ROOM, CFG) is None


def test_with_a_known_capacity_the_cap_fills_exactly_the_free_slots() -> None:
    assert next_limit(60, 50, 5, ROOM, CFG, capacity=60) == 60
    below = Saturation(False, None, replicas=2, saturated_replicas=2, excess=0, queued=3, running=60, full=True)
    assert next_limit(63, 63, 5, below, CFG, capacity=60) == 60


def test_capacity_is_what_runs_when_every_replica_is_full() -> None:
    assert learn_capacity(None, SATURATED) == 60
    assert learn_capacity(None, ROOM) is None
    assert learn_capacity(40, ROOM) == 50  # more ran than we thought possible
    assert learn_capacity(70, SATURATED) == 70  # a full scrape with fewer running: the prefill budget, not slots


def test_a_queue_with_nothing_running_yet_teaches_no_capacity() -> None:
    arrived = Saturation(True, "waiting", replicas=1, saturated_replicas=1, excess=0, queued=1, running=0, full=True)
    assert learn_capacity(None, arrived) is None
    assert learn_capacity(None, SATURATED) == 60


def test_room_with_waiters_raises_the_cap_a_threshold_per_replica() -> None:
    assert next_limit(34, 34, 5, ROOM, CFG) == 42
    assert next_limit(None, 34, 5, ROOM, CFG) is None


def test_a_token_cap_verdict_does_not_move_the_request_cap() -> None:
    tokens_only = Saturation(True, "in_flight_tokens", replicas=2, saturated_replicas=0, excess=0)
    assert next_limit(None, 10, 3, tokens_only, CFG) is None


def test_declared_slots_are_the_capacity() -> None:
    assert learn_capacity(None, Saturation(False, None, 2, 0, 0, running=3, slots=128)) == 128
    assert learn_capacity(40, Saturation(False, None, 2, 0, 0, running=3, slots=128)) == 128
