from __future__ import annotations

from app.routing.breaker import BreakerConfig, CircuitBreaker


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(failures: int = 3) -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    return CircuitBreaker(BreakerConfig(failures=failures, open_s=2.0, max_open_s=5.0), clock), clock


def test_opens_after_consecutive_failures_only() -> None:
    br, _ = make(failures=3)
    br.record_failure()
    br.record_failure()
    br.record_success()  # resets the streak
    br.record_failure()
    br.record_failure()
    assert br.state == "closed" and br.allows()
    br.record_failure()
    assert br.state == "open" and not br.allows()


def test_half_open_after_cooldown_admits_exactly_one_trial() -> None:
    br, clock = make(failures=1)
    br.record_failure()
    clock.now += 1.9
    assert not br.allows()
    clock.now += 0.2
    assert br.allows()
    br.on_attempt()
    assert br.state == "half_open"
    assert not br.allows()  # the trial is in flight


def test_successful_trial_closes() -> None:
    br, clock = make(failures=1)
    br.record_failure()
    clock.now += 2.0
    br.on_attempt()
    br.record_success()
    assert br.state == "closed" and br.allows()


def test_failed_trial_reopens_with_a_longer_capped_cooldown() -> None:
    br, clock = make(failures=1)
    br.record_failure()
    cooldowns = []
    for _ in range(3):
        opened = clock.now
        while not br.allows():
            clock.now += 0.5
        cooldowns.append(clock.now - opened)
        br.on_attempt()
        br.record_failure()
        assert br.state == "open"
    assert cooldowns == [2.0, 4.0, 5.0]


def test_released_trial_lets_the_next_request_try() -> None:
    br, clock = make(failures=1)
    br.record_failure()
    clock.now += 2.0
    br.on_attempt()
    br.release()
    assert br.state == "half_open" and br.allows()
