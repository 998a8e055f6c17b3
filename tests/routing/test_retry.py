from __future__ import annotations

import random

from app.routing.retry import backoff_s


def test_backoff_is_jittered_within_an_exponential_capped_ceiling() -> None:
    rng = random.Random(1)
    for attempt, ceiling in [(1, 0.05), (2, 0.1), (3, 0.2), (6, 1.0), (60, 1.0)]:
        waits = [backoff_s(attempt, rng) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling / 2  # full jitter actually uses the range
        assert len(set(waits)) > 100


def test_no_wait_before_the_first_attempt() -> None:
    assert backoff_s(0, random.Random(1)) == 0.0
