from __future__ import annotations

from app.routing.round_robin import RoundRobin
from tests.routing.factory import replicas


def test_cycles_through_candidates_in_order_with_next_as_runner_up() -> None:
    reps = replicas(["http://a:1", "http://b:1", "http://c:1"])
    rr = RoundRobin()
    picks = [rr.select(reps, key=7) for _ in range(6)]
    assert [s.chosen.url for s in picks] == [r.url for r in reps] * 2
    assert [s.runner_up.url for s in picks[:3] if s.runner_up] == ["http://b:1", "http://c:1", "http://a:1"]
    assert {s.reason for s in picks} == {"round_robin"}


def test_single_candidate_has_no_runner_up() -> None:
    (only,) = replicas(["http://a:1"])
    sel = RoundRobin().select([only], key=1)
    assert sel.chosen is only and sel.runner_up is None


def test_cursor_survives_a_shrinking_candidate_list() -> None:
    reps = replicas(["http://a:1", "http://b:1", "http://c:1"])
    rr = RoundRobin()
    for _ in range(2):
        rr.select(reps, key=0)
    # c left rotation; the cursor wraps instead of failing
    assert rr.select(reps[:2], key=0).chosen.url == "http://a:1"
