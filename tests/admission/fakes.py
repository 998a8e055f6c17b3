"""A replica load the tests set by hand, and a clock they move by hand."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FakeReplica:
    """Scraped gauges plus the gateway's in-flight count; queued() as ReplicaState computes it."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0
    in_flight_at_scrape: int = 0
    capacity: int = 0  # max_num_seqs, 0 = not declared

    def queued(self) -> int:
        """The scraped queue moved by in-flight changes since the scrape, when it was queueing."""
        if self.waiting <= 0:
            return 0
        return max(self.waiting + self.in_flight - self.in_flight_at_scrape, 0)


class FakeClock:
    """Monotonic seconds that only move when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds
