import math

import pytest

from app.admission.pace import MIN_EVENTS, RATE_WINDOW, EventRate, demand_reserve, pace_gap_s


def test_a_rate_is_unknown_until_enough_events() -> None:
    r = EventRate()
    for i in range(MIN_EVENTS - 1):
        r.add(float(i))
    assert r.per_s(10.0) is None
    r.add(float(MIN_EVENTS - 1))
    assert r.per_s(float(MIN_EVENTS - 1)) == pytest.approx(1.0)


def test_a_rate_decays_when_the_events_stop() -> None:
    r = EventRate()
    for i in range(10):
        r.add(i * 0.1)  # 10 per second
    assert r.per_s(0.9) == pytest.approx(10.0)
    assert r.per_s(9.0) == pytest.approx(1.0)  # nothing for 8 s: measured up to now


def test_a_rate_remembers_only_the_last_window() -> None:
    r = EventRate()
    for i in range(RATE_WINDOW):
        r.add(i * 1.0)  # slow ...
    for i in range(RATE_WINDOW):
        r.add(RATE_WINDOW + i * 0.01)  # ... then fast: the slow past is forgotten
    assert r.per_s(RATE_WINDOW + (RATE_WINDOW - 1) * 0.01) == pytest.approx(100.0)


def test_the_reserve_is_the_floor_while_nobody_under_its_share_arrives() -> None:
    assert demand_reserve(None, 27.0, 0.005, 0, 4) == 0
    assert demand_reserve(0.0, 27.0, 0.005, 2, 4) == 2
    assert demand_reserve(4.0, None, 0.005, 1, 4) == 1  # release rate unknown yet


def test_the_reserve_covers_the_arrivals_between_two_releases() -> None:
    # A light tenant at 4 req/s next to a pool freeing 27 slots/s: rho = 0.148; rho^2 = 2.2% > 0.5%, rho^3 = 0.3%.
    assert demand_reserve(4.0, 27.0, 0.005, 0, 8) == 3
    assert (4 / 27) ** 3 <= 0.005 < (4 / 27) ** 2
    # Twice the arrivals need more; a looser miss needs fewer.
    assert demand_reserve(8.0, 27.0, 0.005, 0, 8) == math.ceil(math.log(0.005) / math.log(8 / 27))
    assert demand_reserve(4.0, 27.0, 0.05, 0, 8) == 2


def test_the_reserve_stays_within_its_bounds() -> None:
    assert demand_reserve(30.0, 27.0, 0.005, 0, 4) == 4  # arrivals outpace releases: the ceiling
    assert demand_reserve(26.0, 27.0, 0.005, 0, 4) == 4
    assert demand_reserve(0.01, 27.0, 0.005, 2, 4) == 2  # one slot would do: the floor still holds
    assert demand_reserve(4.0, 27.0, 0.005, 3, 1) == 3  # a ceiling below the floor: the floor


def test_over_share_starts_are_spaced_by_the_release_rate() -> None:
    assert pace_gap_s(25.0, 2.0) == pytest.approx(0.02)
    assert pace_gap_s(25.0, 0.0) == 0.0  # pacing off
    assert pace_gap_s(None, 2.0) == 0.0  # release rate unknown: unpaced
