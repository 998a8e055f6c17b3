"""`routing.peer_load`: gateway processes sharing a Store judge bounded load on one snapshot of all their requests.

Part of the schema (RoutingConfig mounts it with one line).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from app.config.types import StrictModel


class PeerLoadSettings(StrictModel):
    """Rounds of `interval_s` on the store's clock; in each, every process uses the counts all published two before."""

    enabled: bool = Field(True, description=(
        "On whenever the store is shared (Redis); a single process with the in-memory store has no peers."))
    interval_s: float = Field(0.1, gt=0, le=5.0, description=(
        "The round: how late bounded load sees the requests (1.5 to 2.5 rounds), and one store round trip per "
        "round. A process whose exchange (mid-round) has not returned by the next round's start decides one more "
        "round on the snapshot before, then on its own live view."))
    ttl_s: float = Field(1.0, gt=0, description=(
        "A process that stops publishing (killed, store unreachable) is forgotten after this long."))
    route_header: bool = Field(False, description=(
        "Add `;snapshot=<round>;decided=<unix µs>` to x-kvgate-route: which round's counts decided (-1: the live "
        "view) and when, to measure agreement between processes (experiments/multi_gateway.py)."))

    @model_validator(mode="after")
    def _ttl_spans_rounds(self) -> PeerLoadSettings:
        if self.ttl_s < 2 * self.interval_s:
            # A round's publications must outlive the round after it, in which everyone reads them.
            raise ValueError("routing.peer_load.ttl_s must be at least twice interval_s (one late round is normal)")
        return self
