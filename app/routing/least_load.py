"""Least load: the replica with the fewest requests on it (gateway in-flight + scraped queue)."""

from __future__ import annotations

from collections.abc import Sequence

from app.routing.hashing import GOLDEN64, MASK64
from app.routing.policy import R, Selection


class LeastLoad:
    """Minimum load; ties broken by a per-key hash so idle replicas share the work instead of the first."""

    name = "least_load"

    def select(self, candidates: Sequence[R], key: int, blocks: object = None) -> Selection[R]:
        """The least-loaded candidate and the second least-loaded as runner-up."""
        best: tuple[int, int] | None = None
        second: tuple[int, int] | None = None
        best_r: R | None = None
        second_r: R | None = None
        for r in candidates:
            rank = (r.load(), ((key ^ r.hash) * GOLDEN64) & MASK64)  # ties: rendezvous_score, inlined
            if best is None or rank < best:
                second, second_r = best, best_r
                best, best_r = rank, r
            elif second is None or rank < second:
                second, second_r = rank, r
        assert best_r is not None, "select() needs at least one candidate"
        return Selection(best_r, second_r, "least_load")
