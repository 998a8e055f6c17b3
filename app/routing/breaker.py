"""Per-replica circuit breaker: stop sending to a replica that keeps failing, probe it again later."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

BreakerStateName = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Thresholds: open after `failures` consecutive failures; stay open `open_s`, doubling up to `max_open_s`."""

    failures: int = 5
    open_s: float = 2.0
    max_open_s: float = 30.0


class CircuitBreaker:
    """closed → (N consecutive failures) → open → (cool-down) → half_open: one trial → closed | open (longer)."""

    __slots__ = ("_clock", "_consecutive", "_cooldown_s", "_opened_at", "_trial_in_flight", "cfg", "state")

    def __init__(self, cfg: BreakerConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg or BreakerConfig()
        self._clock = clock
        self.state: BreakerStateName = "closed"
        self._consecutive = 0
        self._opened_at = 0.0
        self._cooldown_s = self.cfg.open_s
        self._trial_in_flight = False

    def allows(self) -> bool:
        """May a new request be sent? (Read-only: picking a replica does not start a request.)"""
        if self.state == "closed":
            return True
        if self.state == "open":
            return self._clock() - self._opened_at >= self._cooldown_s
        return not self._trial_in_flight

    def on_attempt(self) -> None:
        """A request is being sent: past the cool-down it becomes the single half-open trial."""
        if self.state == "open" and self._clock() - self._opened_at >= self._cooldown_s:
            self.state = "half_open"
        if self.state == "half_open":
            self._trial_in_flight = True

    def record_success(self) -> None:
        """The replica answered: close and forget past failures."""
        self.state = "closed"
        self._consecutive = 0
        self._cooldown_s = self.cfg.open_s
        self._trial_in_flight = False

    def record_failure(self) -> None:
        """The replica failed (connect error, 5xx, timeout before the first byte)."""
        self._consecutive += 1
        if self.state == "half_open":
            # The trial failed: back off longer before the next one.
            self._cooldown_s = min(self._cooldown_s * 2, self.cfg.max_open_s)
            self._open()
        elif self.state == "closed" and self._consecutive >= self.cfg.failures:
            self._open()

    def release(self) -> None:
        """A request ended with no verdict on the replica (client gone, 4xx): free the trial slot."""
        self._trial_in_flight = False

    def _open(self) -> None:
        self.state = "open"
        self._opened_at = self._clock()
        self._trial_in_flight = False
