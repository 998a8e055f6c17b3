"""Prefix affinity with bounded load: rendezvous-hash the prefix key to a home replica, unless that
would put the home above `c` x the mean load, in which case spill to the least-loaded replica, or with
`spill: ranked` to the next replica in the key's rendezvous order that is within the bound.

Rendezvous (highest random weight) hashing needs no ring and no state: when a replica leaves, only the
keys it was home for move, and they come back when it returns. The bound is the one of Mirrokni et al.,
"Consistent Hashing with Bounded Loads": a replica may take a request only while its load after the
request is <= ceil(c * (total + 1) / n). The least-loaded replica always passes that test, so the spill
target never breaks the bound either.

`ranked` is the paper's own walk (the next bin along the key's order): a hot prefix overflows onto the same
second replica every time, so that replica's cache holds it too, and gateway processes whose load views
differ by a request or two still agree on where it overflows to (the least-loaded replica flips between
near-equal ones with every request).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.config.policies import DEFAULT_LOAD_BOUND
from app.routing.hashing import GOLDEN64, MASK64
from app.routing.policy import R, Selection


def bound(c: float, total: int, n: int) -> int:
    """The most requests one of `n` replicas may hold when they hold `total`: ceil(c * total / n)."""
    # The epsilon keeps float error (1.1 * 10 = 11.000000000000002) from granting an extra request.
    return math.ceil(c * total / n - 1e-9)


class PrefixAffinity:
    """Home = highest rendezvous score for the key; bounded by `load_bound` (c >= 1) times the mean load."""

    name = "prefix_affinity"

    def __init__(self, load_bound: float = DEFAULT_LOAD_BOUND, min_bound: int = 0, spill: str = "least_loaded") -> None:
        if load_bound < 1.0:
            raise ValueError("load_bound must be >= 1")
        self.load_bound = load_bound
        self.min_bound = min_bound
        self.ranked_spill = spill == "ranked"

    def select(self, candidates: Sequence[R], key: int, blocks: object = None) -> Selection[R]:
        """The home if within the bound (runner-up: the next-ranked), else the least loaded or the next-ranked
        within the bound (runner-up: home)."""
        n = len(candidates)
        if n == 1:
            return Selection(candidates[0], None, "prefix_home")
        # The snapshot every gateway process shares this round where there is one (app/routing/peer_load.py),
        # so they all judge the bound alike; else load(), inlined.
        loads = [r.shared_load if r.shared_load >= 0 else r.in_flight + r.external for r in candidates]
        # (rendezvous_score inlined, index): max() over tuples runs in C.
        ranked = [(((key ^ r.hash) * GOLDEN64) & MASK64, i) for i, r in enumerate(candidates)]
        top = max(ranked)
        home_i = top[1]
        limit = bound(self.load_bound, sum(loads) + 1, n)
        if loads[home_i] + 1 <= (limit if limit >= self.min_bound else self.min_bound):
            ranked.remove(top)
            return Selection(candidates[home_i], candidates[max(ranked)[1]], "prefix_home")
        if self.ranked_spill:
            ranked.remove(top)
            for _, i in sorted(ranked, reverse=True):
                if loads[i] + 1 <= limit:
                    return Selection(candidates[i], candidates[home_i], "prefix_bounded_spill")
        # Spill: the least-loaded replica; among equals, the one ranked highest for this key.
        least = min(loads)
        least_i = max(t for t in ranked if loads[t[1]] == least)[1]
        return Selection(candidates[least_i], candidates[home_i], "prefix_bounded_spill")
