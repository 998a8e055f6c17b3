"""The pool's in-flight cap while saturated: the concurrency at which the engines' queues sit at the threshold.

Scrapes are seconds apart, but the gateway counts its own requests exactly. So the scrape sets a cap on the
gateway's in-flight count, and between scrapes every finished request lets exactly one queued request start
(one out, one in), which holds the engines at the threshold without waiting for the next scrape.
"""

from __future__ import annotations

from app.admission.config import AdmissionConfig
from app.admission.saturation import Saturation


def next_limit(limit: int | None, in_flight: int, backlog: int, sat: Saturation, cfg: AdmissionConfig) -> int | None:
    """The cap after a state change (None: no cap, the fast path); `backlog` = requests waiting in the gateway."""
    floor = max(1, sat.replicas)  # one request per replica always proceeds: the queue cannot stall itself
    if sat.replicas_saturated:
        # Engines queue `excess` beyond the threshold: that many fewer of ours would keep them at it.
        return max(floor, in_flight - sat.excess)
    if backlog == 0 or limit is None:
        return None
    # Room again: probe upwards a threshold's worth per replica and state change; if that overshoots, the next
    # scrape sees the excess and cuts back.
    return max(limit, in_flight) + max(1, sat.replicas * cfg.max_waiting_per_replica)
