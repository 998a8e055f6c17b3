"""The pool's in-flight cap while saturated: the concurrency at which the engines run full with nothing queued.

Scrapes are seconds apart, but the gateway counts its own requests exactly. So each scrape sets a cap on the
gateway's in-flight count, and between scrapes every finished request lets exactly one queued request start
(one out, one in). The cap aims at engines that are full with an empty queue: a request queued in an engine is
served first-come first-served there, so every request kept in the gateway instead is one the fair order decides.
The pool's capacity (requests running when every replica is full) is learned from the scrapes.
"""

from __future__ import annotations

from app.admission.saturation import Saturation
from app.config.admission import AdmissionConfig


def learn_capacity(capacity: int | None, sat: Saturation) -> int | None:
    """Requests the pool runs at once: the replicas' declared slots, else the most seen running, known once every
    replica was seen full."""
    if sat.slots:
        return sat.slots
    # The maximum, not the last full scrape: an engine also queues while its prefill token budget is spent,
    # with fewer sequences running than it can hold (measured: taking the last value cost 25-33% of tokens/s).
    if capacity is None:
        # A replica that queues with nothing running is between engine steps (a request just arrived), not full:
        # learning from it made the capacity 0 and kept a lone request waiting in the gateway for a whole reply.
        return sat.running if sat.full and sat.running >= max(1, sat.replicas) else None
    return max(capacity, sat.running)


def next_limit(limit: int | None, in_flight: int, backlog: int, sat: Saturation, cfg: AdmissionConfig,
               capacity: int | None = None) -> int | None:
    """The cap after a state change (None: no cap, the fast path); `backlog` = requests waiting in the gateway."""
    floor = max(1, sat.replicas)  # one request per replica always proceeds: the queue cannot stall itself
    if sat.replicas_saturated:
        # The engines queue `queued`: that many fewer of ours leaves them full with nothing waiting.
        return max(floor, in_flight - sat.queued)
    if backlog == 0 or limit is None:
        return None
    if capacity is not None:
        # Below the threshold with a known capacity: fill exactly the free slots (or give back the queued ones).
        return max(floor, in_flight + capacity - sat.running - sat.queued)
    # Room, capacity unknown: probe upwards a threshold's worth per replica and state change; if that
    # overshoots, the next scrape sees the engines queue and cuts back.
    return max(limit, in_flight) + max(1, sat.replicas * cfg.max_waiting_per_replica)
