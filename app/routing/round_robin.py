"""Round robin: each pick takes the next replica in rotation; ignores load and prefix."""

from __future__ import annotations

from collections.abc import Sequence

from app.routing.policy import R, Selection


class RoundRobin:
    """Cycle through the candidates (the cursor survives changes in which replicas are in rotation)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, candidates: Sequence[R], key: int, blocks: object = None) -> Selection[R]:
        """The candidate at the cursor; the runner-up is the one after it."""
        n = len(candidates)
        i = self._next % n
        self._next = i + 1
        runner_up = candidates[(i + 1) % n] if n > 1 else None
        return Selection(candidates[i], runner_up, "round_robin")
