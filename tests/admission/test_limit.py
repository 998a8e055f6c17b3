from app.admission.config import AdmissionConfig
from app.admission.limit import next_limit
from app.admission.saturation import Saturation

CFG = AdmissionConfig(enabled=True, max_waiting_per_replica=4)
SATURATED = Saturation(True, "waiting", replicas=2, saturated_replicas=2, excess=6)
HOLDING = Saturation(True, "waiting", replicas=2, saturated_replicas=2, excess=0)
ROOM = Saturation(False, None, replicas=2, saturated_replicas=1, excess=0)


def test_saturation_caps_in_flight_at_what_keeps_the_engines_at_the_threshold() -> None:
    assert next_limit(None, 40, 0, SATURATED, CFG) == 34
    assert next_limit(None, 40, 0, HOLDING, CFG) == 40


def test_the_cap_never_drops_below_one_request_per_replica() -> None:
    assert next_limit(None, 3, 10, SATURATED, CFG) == 2


def test_room_with_nothing_waiting_removes_the_cap() -> None:
    assert next_limit(34, 30, 0, ROOM, CFG) is None


def test_room_with_waiters_raises_the_cap_a_threshold_per_replica() -> None:
    assert next_limit(34, 34, 5, ROOM, CFG) == 42
    assert next_limit(None, 34, 5, ROOM, CFG) is None


def test_a_token_cap_verdict_does_not_move_the_request_cap() -> None:
    tokens_only = Saturation(True, "in_flight_tokens", replicas=2, saturated_replicas=0, excess=0)
    assert next_limit(None, 10, 3, tokens_only, CFG) is None
