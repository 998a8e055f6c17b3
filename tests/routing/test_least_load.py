from __future__ import annotations

from app.routing.least_load import LeastLoad
from tests.routing.factory import replicas, set_load


def test_picks_fewest_requests_counting_scrape_and_in_flight() -> None:
    a, b, c = replicas(["http://a:1", "http://b:1", "http://c:1"])
    set_load(a, running=4)
    b.on_start()
    b.on_start()
    set_load(c, running=1, waiting=2)
    sel = LeastLoad().select([a, b, c], key=1)
    assert sel.chosen is b
    assert sel.runner_up is c
    assert sel.reason == "least_load"


def test_ties_spread_across_keys_instead_of_always_the_first() -> None:
    reps = replicas([f"http://r{i}:1" for i in range(4)])
    chosen = {LeastLoad().select(reps, key=k).chosen.url for k in range(64)}
    assert len(chosen) == len(reps)
