"""The offset to the store's clock from round trips: the midpoint of the shortest recent one decides."""

from __future__ import annotations

import pytest

from app.routing.store_clock import WINDOW, StoreClock

MS = 0.001


def test_the_offset_is_0_until_a_sample_then_the_round_trip_s_midpoint() -> None:
    clock = StoreClock()
    assert clock.offset == 0.0
    assert clock.sample(100.0, 100.045, 100.010) == pytest.approx(40 * MS)
    assert clock.rtt == pytest.approx(10 * MS)


def test_a_slow_round_trip_does_not_move_the_offset() -> None:
    clock = StoreClock()
    clock.sample(100.0, 100.041, 100.002)  # 2 ms: offset 40 ms, off by at most 1 ms
    # 30 ms, all of it on the way back: its midpoint says 25 ms, its interval [10, 40] still holds 40 ms
    assert clock.sample(101.0, 101.040, 101.030) == pytest.approx(40 * MS)
    assert clock.sample(102.0, 102.0405, 102.001) == pytest.approx(40 * MS)  # a shorter one decides from now on
    assert clock.rtt == pytest.approx(1 * MS)


def test_the_best_sample_leaves_the_window_after_window_samples() -> None:
    clock = StoreClock()
    clock.sample(100.0, 100.041, 100.002)
    for k in range(1, WINDOW):
        clock.sample(100.0 + k, 100.0 + k + 0.0445, 100.009 + k)  # 9 ms each: 40 ms ± 4.5
    assert clock.offset == pytest.approx(40 * MS)
    clock.sample(200.0, 200.0445, 200.009)
    assert clock.offset == pytest.approx(40 * MS)  # the best of what is left
    assert clock.rtt == pytest.approx(9 * MS)


def test_a_clock_step_drops_the_samples_it_contradicts() -> None:
    clock = StoreClock()
    clock.sample(100.0, 100.041, 100.002)
    # The local clock was stepped 20 ms back: the store now reads 60 ms ahead, outside the 2 ms sample's interval
    assert clock.sample(101.0, 101.0625, 101.005) == pytest.approx(60 * MS)
    assert clock.sample(102.0, 102.0610, 102.002) == pytest.approx(60 * MS)


def test_a_round_trip_of_negative_length_is_ignored() -> None:
    clock = StoreClock()
    clock.sample(100.0, 100.041, 100.002)
    assert clock.sample(101.0, 99.0, 100.9) == pytest.approx(40 * MS)
