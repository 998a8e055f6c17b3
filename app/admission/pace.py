"""Two rates a capped queue steers by, and what follows from them: the reserve's size and over-share pacing.

The pool frees slots at its release rate; tenants under their fair share arrive at theirs. Each release
refills one reserved slot and each such arrival takes one, so the reserve in use behaves like an M/M/1 queue
length: an arrival finds every reserved slot taken with probability about rho^R (rho = arrivals / releases).
The reserve is the smallest R that makes that rare, within the configured bounds; it is zero-cost-ish when
nobody under its share arrives (R falls to the floor).

Over-share starts (the flood) are spaced at least 1 / (pace x release rate) apart: the engine then receives
them about as evenly as it finishes requests, instead of in bursts (a cohort of requests that started in one
engine step finishes in one step and, one out / one in, would start its successors in one step, forever; a
cap raised by a scrape would start dozens at once). A burst of prefills in one engine step is what a light
request that arrives just then waits behind.
"""

from __future__ import annotations

import math
from collections import deque

RATE_WINDOW = 64  # events remembered per rate
MIN_EVENTS = 8  # fewer: the rate is unknown


class EventRate:
    """Events per second over the last RATE_WINDOW events, measured up to `now` (so it decays when they stop)."""

    __slots__ = ("_min", "times")

    def __init__(self, min_events: int = MIN_EVENTS) -> None:
        # Public so that a caller on every request can append without a Python call (app/admission/fast.py).
        self.times: deque[float] = deque(maxlen=RATE_WINDOW)
        self._min = min_events

    def add(self, at: float) -> None:
        """One event at monotonic time `at`."""
        self.times.append(at)

    def per_s(self, now: float) -> float | None:
        """The rate, or None while fewer than the minimum events were seen (or no time has passed)."""
        t = self.times
        if len(t) < self._min:
            return None
        span = now - t[0]
        return (len(t) - 1) / span if span > 0 else None


def demand_reserve(arrivals_per_s: float | None, releases_per_s: float | None, miss: float, floor: int,
                   ceiling: int) -> int:
    """Slots to keep free for tenants under their share: the smallest R with rho^R <= miss, in [floor, ceiling]."""
    ceiling = max(ceiling, floor)
    if not arrivals_per_s or releases_per_s is None:
        return floor  # nobody under its share arrives (or nothing is known yet): only the fixed reserve
    rho = arrivals_per_s / releases_per_s
    if rho >= 1.0:
        return ceiling
    need = math.ceil(math.log(miss) / math.log(rho))
    return min(max(need, floor), ceiling)


def pace_gap_s(releases_per_s: float | None, pace: float) -> float:
    """Seconds between two over-share starts (0: unpaced, when pacing is off or the release rate unknown)."""
    if pace <= 0 or not releases_per_s:
        return 0.0
    return 1.0 / (pace * releases_per_s)
