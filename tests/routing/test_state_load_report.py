"""In-band load reports in the replica state: fresher than the last scrape, and overruled by a newer one."""

from __future__ import annotations

from app.routing import promtext as m
from app.routing.load_report import LoadReport
from app.routing.state import ReplicaState

SCRAPE_IDLE = {m.RUNNING: 0.0, m.WAITING: 0.0, m.KV_USAGE: 0.1}


def replica(capacity: int = 0) -> ReplicaState:
    return ReplicaState("http://a:1", "p", 0, capacity=capacity)


def test_a_report_between_scrapes_shows_the_queue_the_last_scrape_missed() -> None:
    r = replica(capacity=4)
    r.apply_metrics(SCRAPE_IDLE, now=10.0)
    r.apply_load_report(LoadReport(waiting=3, kv_usage=0.9), now=11.0)
    assert (r.queued(), r.kv_usage, r.utilization()) == (3, 0.9, 1.0)
    # A queueing engine runs all its slots: 4 running + 3 waiting, none of them ours.
    assert r.load() == 7


def test_our_sends_after_a_queueing_report_queue_behind_it() -> None:
    r = replica(capacity=4)
    r.apply_load_report(LoadReport(waiting=2, kv_usage=None), now=1.0)
    r.on_start()
    assert r.queued() == 3


def test_an_empty_queue_report_caps_what_others_hold_at_the_free_slots() -> None:
    r = replica(capacity=4)
    r.apply_metrics({m.RUNNING: 4.0, m.WAITING: 5.0}, now=1.0)
    r.on_start()
    r.apply_load_report(LoadReport(waiting=0, kv_usage=0.3), now=2.0)
    assert r.queued() == 0 and r.load() == 4  # our 1 plus at most the 3 free slots


def test_a_scrape_asked_before_the_report_keeps_the_reports_load_but_a_later_one_wins() -> None:
    r = replica(capacity=4)
    r.apply_load_report(LoadReport(waiting=3, kv_usage=0.9), now=5.0)
    r.apply_metrics(SCRAPE_IDLE, now=5.2, asked_at=4.9)  # in flight while the report arrived
    assert (r.waiting, r.kv_usage, r.last_scrape) == (3, 0.9, 5.2)
    r.apply_metrics(SCRAPE_IDLE, now=6.1, asked_at=6.0)
    assert (r.waiting, r.kv_usage) == (0, 0.1)


def test_a_report_without_a_known_capacity_moves_the_queue_over_the_scraped_running() -> None:
    r = replica()
    r.apply_metrics({m.RUNNING: 2.0, m.WAITING: 0.0}, now=1.0)
    r.apply_load_report(LoadReport(waiting=1, kv_usage=None), now=2.0)
    assert (r.queued(), r.load()) == (1, 3)


def test_forgetting_the_scrape_forgets_the_report_too() -> None:
    r = replica(capacity=4)
    r.apply_load_report(LoadReport(waiting=3, kv_usage=0.9), now=5.0)
    r.clear_metrics()
    r.apply_metrics(SCRAPE_IDLE, now=6.0, asked_at=4.0)
    assert r.waiting == 0 and r.load_reports == 1
