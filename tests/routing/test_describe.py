from __future__ import annotations

from app.context import ClassDecision, RouteDecision
from app.routing.describe import decision_attributes, route_header, span_attributes
from app.routing.pick import RouteDecisionDetail

CLS = ClassDecision("interactive", "stream")


def test_header_names_class_rule_pool_policy_reason_but_no_address() -> None:
    route = RouteDecision("fast", "http://10.1.2.3:8000", "prefix_affinity", "prefix_home")
    assert route_header(CLS, route) == "interactive;rule=stream;pool=fast;policy=prefix_affinity;reason=prefix_home"
    assert route_header(CLS) == "interactive;rule=stream"


def test_header_marks_spill_and_retries() -> None:
    route = RouteDecision("bulk", "http://b:1", "round_robin", "failover", spilled=True, attempt=2)
    assert route_header(CLS, route).endswith(";reason=failover;spilled;attempt=2")


def test_span_carries_chosen_runner_up_priority_and_explanation() -> None:
    route = RouteDecisionDetail(
        "bulk", "http://b:1", "least_load", "spill_interactive_to_bulk", runner_up="http://b:2",
        spilled=True, priority=0, detail="fast queues",
    )
    attrs = span_attributes(CLS, route)
    assert attrs["kvgate.route.replica"] == "http://b:1"
    assert attrs["kvgate.route.runner_up"] == "http://b:2"
    assert attrs["kvgate.route.priority"] == 0
    assert attrs["kvgate.route.detail"] == "fast queues"
    assert attrs["kvgate.route.class_rule"] == "stream"


def test_metric_attributes_are_the_four_labels() -> None:
    route = RouteDecision("fast", "http://a:1", "round_robin", "round_robin")
    assert decision_attributes(CLS, route) == {
        "pool": "fast", "class": "interactive", "policy": "round_robin", "reason": "round_robin",
    }
