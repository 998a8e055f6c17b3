"""How far the store's clock is from this host's, from the round trips a process makes to it anyway.

A reply stamped `store_s` by the store's clock, to a request sent at `sent` and answered at `received` on the local
clock, was stamped somewhere between the two: the offset (store minus local) is in
[store_s - received, store_s - sent], taken as the midpoint, off by at most half the round trip. Of the last
WINDOW samples the one with the shortest round trip decides (NTP's clock filter): a slow reply (a queued store,
a busy event loop before the reply is read) widens its own interval but does not move the estimate.
"""

from __future__ import annotations

from typing import NamedTuple

WINDOW = 8  # NTP's filter length: at 0.1 s rounds, drift in 0.8 s is µs
# Within it, two samples' intervals count as agreeing: the store stamps whole µs, and clocks drift a little.
SLACK_S = 50e-6


class Sample(NamedTuple):
    """One round trip: its length and the offset its midpoint gives."""

    rtt: float
    offset: float


class StoreClock:
    """The offset to add to the local clock to read the store's (0 until the first sample)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.rtt = 0.0  # of the sample that decides: the estimate is off by at most half of it
        self._samples: list[Sample] = []

    def sample(self, sent: float, store_s: float, received: float) -> float:
        """Take one round trip into account; the offset now."""
        rtt = received - sent
        if rtt < 0:  # the local clock stepped back in between: no bound at all
            return self.offset
        new = Sample(rtt, store_s - (sent + received) / 2)
        # A sample whose interval the new one's misses is from before a clock stepped (or slewed past it): drop it.
        kept = [s for s in self._samples if abs(s.offset - new.offset) <= (s.rtt + rtt) / 2 + SLACK_S]
        self._samples = [*kept[-(WINDOW - 1) :], new]
        best = min(self._samples)  # shortest round trip; of equal ones the lower offset, deterministically
        self.offset, self.rtt = best.offset, best.rtt
        return self.offset
