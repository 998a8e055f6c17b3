"""Prefix affinity with bounded load: rendezvous-hash the prefix key to a home replica, unless that
would put the home above `c` x the mean load, in which case spill to the least-loaded replica.

Rendezvous (highest random weight) hashing needs no ring and no state: when a replica leaves, only the
keys it was home for move, and they come back when it returns. The bound is the one of Mirrokni et al.,
"Consistent Hashing with Bounded Loads": a replica may take a request only while its load after the
request is <= ceil(c * (total + 1) / n). The least-loaded replica always passes that test, so the spill
target never breaks the bound either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from app.routing.hashing import GOLDEN64, MASK64
from app.routing.policy import Selection

if TYPE_CHECKING:
    from app.routing.state import ReplicaState


def bound(c: float, total: int, n: int) -> int:
    """The most requests one of `n` replicas may hold when they hold `total`: ceil(c * total / n)."""
    # The epsilon keeps float error (1.1 * 10 = 11.000000000000002) from granting an extra request.
    return math.ceil(c * total / n - 1e-9)


class PrefixAffinity:
    """Home = highest rendezvous score for the key; bounded by `load_bound` (c >= 1) times the mean load."""

    name = "prefix_affinity"

    def __init__(self, load_bound: float = 1.25) -> None:
        if load_bound < 1.0:
            raise ValueError("load_bound must be >= 1")
        self.load_bound = load_bound

    def select(self, candidates: Sequence[ReplicaState], key: int) -> Selection:
        """The home if within the bound (runner-up: the next-ranked), else the least loaded (runner-up: home)."""
        n = len(candidates)
        if n == 1:
            return Selection(candidates[0], None, "prefix_home")
        loads = [r.load() for r in candidates]
        scores = [((key ^ r.hash) * GOLDEN64) & MASK64 for r in candidates]  # rendezvous_score, inlined
        home_i = second_i = 0
        home_s = second_s = -1
        for i, s in enumerate(scores):
            if s > home_s:
                second_i, second_s = home_i, home_s
                home_i, home_s = i, s
            elif s > second_s:
                second_i, second_s = i, s
        if loads[home_i] + 1 <= bound(self.load_bound, sum(loads) + 1, n):
            return Selection(candidates[home_i], candidates[second_i], "prefix_home")
        # Spill: the least-loaded replica; among equals, the one ranked highest for this key.
        least = min(loads)
        least_i = max((scores[i], i) for i in range(n) if loads[i] == least)[1]
        return Selection(candidates[least_i], candidates[home_i], "prefix_bounded_spill")
