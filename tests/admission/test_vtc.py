import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.admission.vtc import VirtualTokenCounter


def _drain(v: VirtualTokenCounter[str]) -> list[str]:
    out = []
    while (e := v.pop()) is not None:
        out.append(e.item)
    return out


def test_the_tenant_with_less_service_goes_first() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    v.push("a", "bulk", "a1", 100)
    v.push("a", "bulk", "a2", 100)
    v.push("b", "bulk", "b1", 10)
    v.push("b", "bulk", "b2", 10)
    assert _drain(v) == ["a1", "b1", "b2", "a2"]


def test_interactive_goes_before_bulk_within_a_tenant_and_fifo_within_a_class() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    v.push("a", "bulk", "bulk1", 1)
    v.push("a", "interactive", "int1", 1)
    v.push("a", "bulk", "bulk2", 1)
    v.push("a", "interactive", "int2", 1)
    assert _drain(v) == ["int1", "int2", "bulk1", "bulk2"]


def test_a_tenant_returning_from_idle_is_lifted_to_the_backlogged_minimum() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    for i in range(50):
        v.push("busy", "bulk", f"busy{i}", 100)
    for _ in range(10):
        v.pop()
    # "idle" never ran; without the lift its counter 0 would win the next 10 picks in a row.
    v.push("idle", "bulk", "idle0", 100)
    v.push("idle", "bulk", "idle1", 100)
    assert v.counters["idle"] == v.counters["busy"]
    order = [v.pop().tenant for _ in range(4)]  # type: ignore[union-attr]
    assert order.count("idle") == 2


def test_on_a_tie_the_tenant_with_the_shorter_backlog_goes_first() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    for i in range(5):
        v.push("heavy", "bulk", f"h{i}", 100)
    v.push("light", "bulk", "l0", 100)  # lifted to heavy's counter: a tie
    assert v.pop().item == "l0"  # type: ignore[union-attr]


def test_a_tenant_arriving_at_an_empty_queue_starts_from_the_last_one_to_leave() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    v.push("a", "bulk", "a1", 500)
    v.pop()
    v.push("b", "bulk", "b1", 1)
    assert v.counters["b"] == 500


def test_a_direct_start_charges_without_banking_credit() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    v.serve_direct("a", 300)
    v.serve_direct("b", 10)
    assert v.counters == {"a": 300, "b": 310}


def test_a_direct_start_on_an_idle_queue_is_a_push_and_pop() -> None:
    rng = random.Random(7)
    direct: VirtualTokenCounter[str] = VirtualTokenCounter({"gold": 3.0})
    queued: VirtualTokenCounter[str] = VirtualTokenCounter({"gold": 3.0})
    for i in range(300):
        tenant = rng.choice(["gold", "std", "x"])
        if rng.random() < 0.2:  # settle's correction
            delta = rng.randrange(-200, 50)
            direct.charge(tenant, delta)
            queued.charge(tenant, delta)
        else:
            cost = rng.randrange(1, 500)
            direct.serve_direct(tenant, cost)
            queued.push(tenant, "bulk", f"r{i}", cost)
            assert queued.pop() is not None
        assert direct.counters == pytest.approx(queued.counters)
    # The floor a newcomer is lifted to is the same too.
    direct.push("new", "bulk", "n", 1)
    queued.push("new", "bulk", "n", 1)
    assert direct.counters["new"] == pytest.approx(queued.counters["new"])


def test_weights_divide_the_charge() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter({"gold": 4.0})
    v.charge("gold", 400)
    v.charge("std", 400)
    assert v.counters == {"gold": 100, "std": 400}


def test_removed_items_are_not_charged_and_leave_no_backlog() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    v.push("a", "bulk", "a1", 100)
    assert v.remove("a", "bulk", "a1")
    assert not v.remove("a", "bulk", "a1")
    assert len(v) == 0 and v.backlog("a") == 0 and v.pop() is None
    assert v.counters["a"] == 0


def test_newest_prefers_bulk() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    v.push("a", "bulk", "b1", 1)
    v.push("a", "bulk", "b2", 1)
    v.push("a", "interactive", "i1", 1)
    assert v.newest("a").item == "b2"  # type: ignore[union-attr]


def test_forget_idle_keeps_counters_that_a_lift_would_not_overwrite() -> None:
    v: VirtualTokenCounter[str] = VirtualTokenCounter()
    v.charge("low", 10)
    v.charge("high", 1000)
    v.push("mid", "bulk", "m", 1)
    v.charge("mid", 500)
    assert v.forget_idle() == 1
    assert set(v.counters) == {"high", "mid"}


costs = st.lists(st.integers(min_value=1, max_value=2000), min_size=1, max_size=40)


def _backlogged_service(weights: dict[str, float], cost_lists: dict[str, list[int]], pops: int,
                        errors: dict[str, list[int]] | None = None) -> dict[str, float]:
    """Keep every tenant backlogged (cycling through its costs), pop `pops` times; actual service per tenant."""
    v: VirtualTokenCounter[int] = VirtualTokenCounter(weights)
    nxt = dict.fromkeys(cost_lists, 0)
    served = dict.fromkeys(cost_lists, 0.0)

    def refill(t: str) -> None:
        c = cost_lists[t][nxt[t] % len(cost_lists[t])]
        v.push(t, "bulk", nxt[t], c)
        nxt[t] += 1

    for t in cost_lists:
        refill(t)
        refill(t)
    for _ in range(pops):
        e = v.pop()
        assert e is not None
        actual = e.cost
        if errors is not None:
            err = errors[e.tenant][e.item % len(errors[e.tenant])]
            actual = max(e.cost + err, 0)
            v.charge(e.tenant, actual - e.cost)  # settle: correct the prediction with the actual count
        served[e.tenant] += actual
        if v.backlog(e.tenant) < 2:  # the next request is already waiting: backlogged the whole time
            refill(e.tenant)
    return served


@settings(max_examples=200, deadline=None)
@given(a=costs, b=costs, pops=st.integers(min_value=1, max_value=400))
def test_two_backlogged_tenants_service_differs_by_at_most_one_request(a: list[int], b: list[int], pops: int) -> None:
    served = _backlogged_service({}, {"a": a, "b": b}, pops)
    assert abs(served["a"] - served["b"]) <= max(a + b)


@settings(max_examples=200, deadline=None)
@given(a=costs, b=costs, wa=st.sampled_from([1.0, 2.0, 5.0]), wb=st.sampled_from([0.5, 1.0, 3.0]),
       pops=st.integers(min_value=1, max_value=400))
def test_weighted_service_is_proportional_within_one_request(a: list[int], b: list[int], wa: float, wb: float,
                                                             pops: int) -> None:
    served = _backlogged_service({"a": wa, "b": wb}, {"a": a, "b": b}, pops)
    assert abs(served["a"] / wa - served["b"] / wb) <= max(x / wa for x in a) + max(x / wb for x in b)


@settings(max_examples=100, deadline=None)
@given(a=costs, b=costs, ea=st.lists(st.integers(-500, 500), min_size=1, max_size=10),
       eb=st.lists(st.integers(-500, 500), min_size=1, max_size=10), pops=st.integers(min_value=1, max_value=300))
def test_settle_corrections_keep_the_service_difference_bounded(a: list[int], b: list[int], ea: list[int],
                                                                eb: list[int], pops: int) -> None:
    served = _backlogged_service({}, {"a": a, "b": b}, pops, {"a": ea, "b": eb})
    assert abs(served["a"] - served["b"]) <= max(a + b) + 500


def test_proportional_shares_over_a_long_run() -> None:
    served = _backlogged_service({"gold": 3.0, "std": 1.0}, {"gold": [100, 300], "std": [50, 250, 400]}, 4000)
    assert abs(served["gold"] / served["std"] - 3.0) < 0.01
